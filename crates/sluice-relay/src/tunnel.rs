//! The tunnel end: reads the preamble, checks the token in constant time and the target
//! against `allow`, then connects and relays. Anything else is refused and closed.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use sluice_session::Token;
use subtle::ConstantTimeEq;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::copy::write_all;
use crate::forward;
use crate::options::{RelayOptions, TunnelEnd};
use crate::preamble::{self, PreambleError};
use crate::sockmap::Kernel;
use crate::stats::Stats;
use crate::waiting::Place;

/// Why a tunnel connection was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// The bytes are not a preamble.
    #[error("malformed preamble: {0}")]
    Malformed(#[from] PreambleError),
    /// The token matches none configured.
    #[error("unknown token")]
    Token,
    /// The target is not in `allow`.
    #[error("target {0} is not allowed")]
    Target(SocketAddr),
    /// The peer closed, timed out or failed before a whole preamble.
    #[error("preamble: {0}")]
    Io(#[from] io::Error),
    /// Still waiting for its token, it was closed: newer connections needed its place
    /// (`max_unauthenticated`).
    #[error("closed before its token: newer connections needed its place (max_unauthenticated)")]
    Shed,
}

impl Refused {
    /// The kind of refusal, for counting and rate-limited logs; `None` for a peer that went
    /// away or timed out before a whole preamble (not a refusal).
    pub(crate) fn refusal(&self) -> Option<&'static str> {
        match self {
            Refused::Malformed(_) => Some("malformed"),
            Refused::Token => Some("token"),
            Refused::Target(_) => Some("target"),
            Refused::Shed => Some("shed"),
            Refused::Io(_) => None,
        }
    }
}

/// Where a connection counts: under `max_unauthenticated` until its token is checked, then
/// under `max_connections`.
#[derive(Debug)]
pub(crate) struct Admission<'a> {
    /// The connection's place while it is not authenticated.
    pub(crate) place: Place,
    /// `max_connections`, for authenticated connections.
    pub(crate) relayed: &'a Arc<Semaphore>,
}

impl Admission<'_> {
    /// Moves an authenticated connection to `max_connections` (waiting for a slot, while it
    /// still holds its place, no longer to be shed, so accepting stops when both are full).
    async fn authenticated(mut self) -> io::Result<OwnedSemaphorePermit> {
        self.place.authenticated();
        let slot = Arc::clone(self.relayed).acquire_owned().await;
        drop(self.place);
        slot.map_err(|_| io::Error::other("the relay stopped"))
    }
}

/// What a tunnel end's connection is relayed with.
pub(crate) struct Context<'a> {
    pub(crate) opts: &'a RelayOptions,
    pub(crate) stats: &'a Stats,
    /// The sockmap program, with `sockmap` on and loaded.
    pub(crate) kernel: Option<&'a Arc<Kernel>>,
}

/// Serves one connection to a tunnel end; `pooled` gives a ready connection to a target, when
/// the end keeps some. The caller closes `peer` after counting the outcome, so a peer that
/// sees the close can also see the count.
pub(crate) async fn serve(
    peer: &TcpStream,
    (end, pooled): (
        &TunnelEnd,
        &(dyn Fn(SocketAddr) -> Option<TcpStream> + Sync),
    ),
    Context {
        opts,
        stats,
        kernel,
    }: Context<'_>,
    mut admission: Admission<'_>,
) -> Result<(), Refused> {
    let mut buf = Vec::with_capacity(preamble::MAX_HELLO + preamble::MAX_TARGET);
    // The hello comes at once (a pool sends it on connect), so a peer that has not sent it
    // within `preamble_timeout`, or before newer connections need its place, is closed; the
    // target comes when a client arrives.
    let hello = within(
        end.preamble_timeout,
        read_hello(peer, &mut buf, &end.tokens),
    );
    let used = tokio::select! {
        used = hello => used?,
        () = admission.place.shed() => return Err(Refused::Shed),
    };
    buf.drain(..used);
    let _slot = admission.authenticated().await?;
    let (target, used) = within(opts.idle_timeout, read_target(peer, &mut buf)).await?;
    buf.drain(..used);
    let target = canonical(target);
    if !end.allow.iter().any(|a| a.allows(target)) {
        return Err(Refused::Target(target));
    }
    let upstream = match pooled(target) {
        Some(conn) => conn,
        None => {
            let start = Instant::now();
            let conn = crate::tune::connect(target, opts).await?;
            stats.connected(start.elapsed());
            conn
        }
    };
    // Bytes the client sent behind the preamble.
    write_all(&upstream, &buf).await?;
    stats.bytes_up.fetch_add(buf.len() as u64, Relaxed);
    let mode = forward::Mode::of(opts);
    forward::relay(peer, &upstream, (mode, kernel), opts.idle_timeout, stats).await?;
    Ok(())
}

async fn within<T>(
    limit: std::time::Duration,
    f: impl std::future::Future<Output = Result<T, Refused>>,
) -> Result<T, Refused> {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut).into()))
}

async fn read_hello(
    peer: &TcpStream,
    buf: &mut Vec<u8>,
    tokens: &[Token],
) -> Result<usize, Refused> {
    loop {
        if let Some((hello, used)) = preamble::parse_hello(buf)? {
            return match known(hello.token, tokens) {
                true => Ok(used),
                false => Err(Refused::Token),
            };
        }
        read_more(peer, buf, preamble::MAX_HELLO).await?;
    }
}

async fn read_target(peer: &TcpStream, buf: &mut Vec<u8>) -> Result<(SocketAddr, usize), Refused> {
    loop {
        if let Some(found) = preamble::parse_target(buf)? {
            return Ok(found);
        }
        read_more(peer, buf, preamble::MAX_TARGET).await?;
    }
}

/// Reads at most what is missing of a preamble part of at most `limit` bytes, so client bytes
/// behind it stay in the socket (they are spliced) unless they came in the same segment.
async fn read_more(peer: &TcpStream, buf: &mut Vec<u8>, limit: usize) -> io::Result<()> {
    let mut chunk = [0u8; preamble::MAX_HELLO + preamble::MAX_TARGET];
    let want = limit.saturating_sub(buf.len()).max(1);
    loop {
        peer.readable().await?;
        match peer.try_read(&mut chunk[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `target` with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) made the IPv4 address it
/// names: matched against `allow` and connected to as IPv4, so an IPv6 range cannot reach
/// IPv4 services.
fn canonical(target: SocketAddr) -> SocketAddr {
    SocketAddr::new(target.ip().to_canonical(), target.port())
}

/// Whether `token` equals one of `tokens`, comparing every one in constant time (no early
/// exit, so the timing tells nothing about which byte differed).
fn known(token: &[u8], tokens: &[Token]) -> bool {
    tokens
        .iter()
        .fold(subtle::Choice::from(0), |found, t| found | t.0.ct_eq(token))
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_exactly() {
        let tokens = [Token(b"alpha".to_vec()), Token(b"beta".to_vec())];
        assert!(known(b"beta", &tokens));
        assert!(!known(b"bet", &tokens));
        assert!(!known(b"betaa", &tokens));
        assert!(!known(b"", &tokens));
    }

    #[test]
    fn an_ipv4_mapped_target_becomes_ipv4() {
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:80".parse().expect("addr");
        assert_eq!(canonical(mapped), "127.0.0.1:80".parse().expect("addr"));
        let v6: SocketAddr = "[2001:db8::1]:80".parse().expect("addr");
        assert_eq!(canonical(v6), v6);
    }
}
