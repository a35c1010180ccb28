//! One service connection: read its hello, decide, answer, and hand a registered stream to
//! its slice.

use std::net::IpAddr;
use std::sync::Arc;

use sluice_session::{parse_hello, Drain, Hello, Parsed, Registration, Rejection, Reply, SplitBy};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::shared::{Peer, Shared};
use crate::cluster::{ExpectSessions, ReverseSlice};
use crate::instance::SessionPermit;
use crate::protocol::Protocol;
use crate::stream::SessionStream;

/// Why no hello could be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("connection closed during the handshake")]
    Closed,
    #[error("handshake I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Rejected(Rejection),
}

/// Serves one service connection to its end or until it becomes a session. The hello must
/// have arrived by `deadline`.
pub(super) async fn handle<P: Protocol, T>(
    mut io: T,
    peer: Peer,
    shared: Arc<Shared<P>>,
    deadline: Instant,
) where
    T: SessionStream,
{
    let read = read_hello(&mut io, shared.opts.max_handshake_size);
    let hello = match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(ReadError::Rejected(r))) => return reject(io, &r, &peer, &shared).await,
        Ok(Err(error)) => {
            shared.count("closed");
            return debug!(%error, "handshake failed");
        }
        Err(_elapsed) => {
            let r = Rejection::bad_request("handshake timed out");
            return reject(io, &r, &peer, &shared).await;
        }
    };
    let (outcome, counted) = match hello {
        Hello::Control(reg, split) => return control(io, (reg, split), &peer, &shared).await,
        Hello::Register(reg) => (register(&mut io, &reg, &peer, &shared).await, "registered"),
        Hello::Drain(drain) => (
            self::drain(&mut io, &drain, &peer, &shared).await,
            "drained",
        ),
    };
    match outcome {
        Ok(None) => shared.count(counted),
        Ok(Some((slice, permit, streams, arriving))) => {
            shared.count(counted);
            if let Err(error) = slice.attach(Box::new(io), permit, streams).await {
                debug!(cluster = %slice.name(), %error, "session could not start");
            }
            drop(arriving);
        }
        Err(r) => reject(io, &r, &peer, &shared).await,
    }
}

/// A session's slice, place in the limits and streams (HTTP/2), and the cluster's
/// expectation of it: from its `101` (when its service may send requests its way) until it
/// has joined its slice, a request that finds the slice empty waits for it instead of being
/// refused for want of sessions.
type Admitted<P> = (ReverseSlice<P>, SessionPermit, Option<u32>, ExpectSessions);

/// Checks a registration and answers `101`; the caller attaches the stream.
async fn register<P: Protocol, T: AsyncWrite + Unpin>(
    io: &mut T,
    reg: &Registration,
    peer: &Peer,
    shared: &Shared<P>,
) -> Result<Option<Admitted<P>>, Rejection> {
    let id = &reg.identity;
    let cluster = shared.admit(&id.service, id.token.as_deref(), peer)?;
    if reg.streams.is_some() && shared.lends {
        return Err(Rejection::lends_http1_only());
    }
    let instance = instance_id(id.instance.as_deref(), peer.ip);
    let slice = cluster.admit_slice(&id.slice, shared.opts.max_slices)?;
    let mut permit = cluster.reserve(&instance, &shared.total)?;
    permit.came_from(peer.ip);
    permit.declares(reg.capacity);
    let reply = match reg.streams {
        Some(_) => Reply::switching_protocols_h2(),
        None => Reply::switching_protocols(),
    };
    let arriving = cluster.expect_sessions();
    // Flushed: over TLS the answer could otherwise wait in rustls's buffer.
    let answer = async {
        io.write_all(&reply).await?;
        io.flush().await
    };
    if let Err(error) = answer.await {
        debug!(%error, "service went away before its 101");
        return Ok(None);
    }
    let streams = reg.streams;
    debug!(cluster = %id.service, slice = %id.slice, instance = %instance, streams, "session registered");
    Ok(Some((slice, permit, streams, arriving)))
}

/// Checks a control link's request as a registration's (no session is reserved), answers
/// `101`, and serves the link.
async fn control<P: Protocol, T: SessionStream>(
    mut io: T,
    (reg, split): (Registration, SplitBy),
    peer: &Peer,
    shared: &Shared<P>,
) {
    let id = &reg.identity;
    let admitted = shared
        .admit(&id.service, id.token.as_deref(), peer)
        .and_then(|cluster| {
            let instance = instance_id(id.instance.as_deref(), peer.ip);
            if cluster.is_held(&instance) {
                return Err(Rejection::drained(&id.service, &instance));
            }
            let place = shared.links.admit(peer.ip)?;
            let slice = cluster.admit_slice(&id.slice, shared.opts.max_slices)?;
            Ok((slice, instance, place))
        });
    let (slice, instance, place) = match admitted {
        Ok(admitted) => admitted,
        Err(r) => return reject(io, &r, peer, shared).await,
    };
    let answer = async {
        io.write_all(&Reply::control_switching()).await?;
        io.flush().await
    };
    if let Err(error) = answer.await {
        return debug!(%error, "service went away before its 101");
    }
    shared.count("control");
    let cluster = slice.cluster().clone();
    let node = shared.node.clone();
    super::control::serve(io, slice, (reg, split), (instance, peer.ip), node).await;
    drop(place);
    cluster.prune_slices();
}

async fn drain<P: Protocol, T: AsyncWrite + Unpin>(
    io: &mut T,
    drain: &Drain,
    peer: &Peer,
    shared: &Shared<P>,
) -> Result<Option<Admitted<P>>, Rejection> {
    let id = &drain.identity;
    let cluster = shared.admit(&id.service, id.token.as_deref(), peer)?;
    let instance = instance_id(id.instance.as_deref(), peer.ip);
    if !cluster.answers_to(&instance, peer.ip) {
        return Err(Rejection::forbidden(
            "the instance's sessions registered from another address",
        ));
    }
    let known = cluster.drain(&instance);
    info!(cluster = %id.service, instance = %instance, known, "drain requested");
    let _ = io.write_all(&Reply::drained()).await;
    let _ = io.shutdown().await;
    Ok(None)
}

/// `Sluice-Instance`, or the peer's IP address (`local` over a UNIX socket).
fn instance_id(given: Option<&str>, peer: Option<IpAddr>) -> String {
    match (given, peer) {
        (Some(id), _) => id.to_owned(),
        (None, Some(ip)) => ip.to_string(),
        (None, None) => "local".to_owned(),
    }
}

/// A refused registration leaves a line: at warn when the service is misconfigured (unknown
/// service, wrong token or certificate), else at info. A service re-dials when refused, so
/// each status is logged once per interval, with how many since its last line.
fn log_refusal<P: Protocol>(r: &Rejection, peer: &Peer, shared: &Shared<P>) {
    let Some(refused) = shared.refusals.record(r.status) else {
        return;
    };
    let addr = peer
        .ip
        .map_or_else(|| "unix".to_owned(), |ip| ip.to_string());
    if matches!(r.status, 401 | 403 | 404) {
        warn!(status = r.status, reason = %r.reason, service.addr = %addr, refused, "service registration refused");
    } else {
        info!(status = r.status, reason = %r.reason, service.addr = %addr, refused, "service registration refused");
    }
}

/// Reads until one whole hello has arrived. Bytes after it are refused: the service must wait
/// for the answer before speaking, so anything more is a protocol error.
async fn read_hello<T: AsyncRead + Unpin>(io: &mut T, max: usize) -> Result<Hello, ReadError> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 1024];
        let n = io.read(&mut chunk).await?;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        match parse_hello(&buf, max).map_err(ReadError::Rejected)? {
            Parsed::Partial => continue,
            Parsed::Complete(hello, len) if len == buf.len() => return Ok(hello),
            Parsed::Complete(..) => {
                let r = Rejection::bad_request("bytes after the handshake before its answer");
                return Err(ReadError::Rejected(r));
            }
        }
    }
}

/// Answers a refusal and closes.
async fn reject<P: Protocol, T: AsyncWrite + Unpin>(
    mut io: T,
    r: &Rejection,
    peer: &Peer,
    shared: &Shared<P>,
) {
    shared.count(&r.status.to_string());
    log_refusal(r, peer, shared);
    let _ = io.write_all(&r.encode()).await;
    let _ = io.shutdown().await;
}
