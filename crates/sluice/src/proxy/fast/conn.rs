//! An HTTP/1.1 connection (plain, or over TLS) served by the proxy's [`FastPath`] for as long
//! as it takes the requests, then by hyper from the first one it leaves: a head that does not
//! arrive whole in the bytes read so far (slow or large heads, and with them the header timeout
//! and its 408), a request the parser defers, or one routed where the fast path does not go.
//! The hand-over happens at a request boundary with nothing of that request consumed. The
//! server runs it through [`FastHttp1`], the trait it defines.

use std::any::TypeId;
use std::future::Future;
use std::pin::Pin;

use futures_util::future::FusedFuture;
use futures_util::FutureExt;
use sluice_config::HttpOptions;
use sluice_wire::h1::{self, ClientIp, Parsed};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::{timer_at, FastPath, Request, Scratch, Served};
use crate::http::{ClientInfo, IO_BUFFER_BYTES};
use crate::server::fast::{Conn, ConnIo, FastHttp1, Left, Serving};
use crate::server::io::deadline;
use crate::server::ActiveRequests;

impl FastHttp1 for FastPath {
    fn serve<'a>(&'a self, mut io: &'a mut dyn ConnIo, conn: Conn<'a>) -> Serving<'a> {
        Box::pin(async move { serve(&mut io, self, conn).await })
    }

    fn service_type(&self) -> TypeId {
        self.service
    }
}

/// Serves requests on `io` until the connection ends or a request is handed over.
async fn serve<I>(io: &mut I, fast: &FastPath, conn: Conn<'_>) -> Left
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let Conn {
        info,
        http,
        signal,
        active,
    } = conn;
    let mut buf = Vec::with_capacity(IO_BUFFER_BYTES);
    let mut scratch = Scratch::default();
    let mut header_timer = None;
    // The client's address as the upstream is told it, formatted once for all its requests.
    let client_ip = ClientIp::new(info.peer.ip());
    let client_addr = sluice_session::client_addr_value(info.peer);
    // One wait for the shutdown serves every wait for a request, as one timer does: a wait
    // made per request cost a registration with the signal and its removal each time.
    let shutdown = signal.wait().fuse();
    tokio::pin!(shutdown);
    loop {
        let waits = (shutdown.as_mut(), &mut header_timer);
        let ended = buf.is_empty() && !next_bytes(io, &mut buf, http, waits, active).await;
        if ended {
            return Left::Done;
        }
        let head = match parse(io, &mut buf, http, info).await {
            Parsed::Take(head) => head,
            Parsed::Defer(why) => {
                fast.hand_off(why.as_str());
                active.handed_over();
                return Left::HandOff(buf);
            }
            Parsed::Partial => {
                fast.hand_off("partial_head");
                active.handed_over();
                return Left::HandOff(buf);
            }
        };
        let guard = active.begin();
        let req = Request {
            last: active.at_limit(),
            buf: &buf,
            head: &head,
            client: info,
            client_ip: &client_ip,
            client_addr: &client_addr,
            shutdown: signal,
        };
        scratch.prepare();
        let served = fast.serve(io, req, &mut scratch).await;
        scratch.trim();
        match served {
            (_, Served::HandOff(_)) => {
                guard.given_back();
                active.handed_over();
                buf.append(&mut scratch.pipelined);
                return Left::HandOff(buf);
            }
            (_, Served::Close) => return Left::Done,
            (used, Served::KeepAlive) => {
                buf.drain(..used);
                buf.append(&mut scratch.pipelined);
            }
        }
    }
}

/// Parses the head at the start of `buf`, reading on while more bytes are already there (the
/// rest of a head split across reads: after the HTTP/2 sniff, for one); a head that would need
/// a wait is left to hyper, whose header timeout covers it.
async fn parse<I>(io: &mut I, buf: &mut Vec<u8>, http: &HttpOptions, info: &ClientInfo) -> Parsed
where
    I: AsyncRead + Unpin,
{
    loop {
        let parsed = h1::parse_request(buf, http.max_header_bytes, info.rules);
        if parsed != Parsed::Partial || buf.len() == buf.capacity() {
            return parsed;
        }
        match io.read_buf(buf).now_or_never() {
            Some(Ok(n)) if n > 0 => {}
            _ => return parsed,
        }
    }
}

/// Waits for the next request's first bytes; false when the connection should end instead
/// (closed, failed, no request begun within the header timeout, or a shutdown). A shutdown that comes before the
/// connection's first request still lets that request arrive, within the header timeout: it
/// may have been sent a moment before the listener stopped accepting.
///
/// `waits`: the connection's wait for the shutdown (polled until it resolves, never after) and
/// its header timer.
async fn next_bytes<I, S>(
    io: &mut I,
    buf: &mut Vec<u8>,
    http: &HttpOptions,
    (shutdown, timer): (Pin<&mut S>, &mut Option<Pin<Box<Sleep>>>),
    active: &ActiveRequests,
) -> bool
where
    I: AsyncRead + Unpin,
    S: Future<Output = ()> + FusedFuture,
{
    if shutdown.is_terminated() {
        return after_shutdown(io, buf, http, active).await;
    }
    // hyper's header timer runs from the moment it waits for a head, on a new connection and
    // between requests alike: a client that does not begin one within it is closed silently.
    // The connection's one timer is moved for each wait. The socket is polled first: when the
    // request is there, the timer and the shutdown are not polled at all.
    let deadline = deadline(Instant::now(), http.request_header_timeout);
    let read = tokio::select! {
        biased;
        read = io.read_buf(buf) => read,
        () = timer_at(timer, deadline) => return false,
        () = shutdown => return after_shutdown(io, buf, http, active).await,
    };
    matches!(read, Ok(n) if n > 0)
}

/// [`next_bytes`] once the shutdown has come.
async fn after_shutdown<I>(
    io: &mut I,
    buf: &mut Vec<u8>,
    http: &HttpOptions,
    active: &ActiveRequests,
) -> bool
where
    I: AsyncRead + Unpin,
{
    if active.started() {
        // A request already in the socket is served (and the connection closed after it);
        // only an idle one closes at once.
        return matches!(io.read_buf(buf).now_or_never(), Some(Ok(n)) if n > 0);
    }
    let first = tokio::time::timeout(http.request_header_timeout, io.read_buf(buf));
    matches!(first.await, Ok(Ok(n)) if n > 0)
}
