//! Pooled keep-alive connections.

use hyper::client::conn::http1::SendRequest;
use std::collections::VecDeque;

use tokio::net::TcpStream;
use tokio::time::Instant;

use sluice_config::StaticOptions;
use sluice_core::body::ProxyBody;

/// An HTTP/1.1 client connection and how many requests it has carried.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) sender: SendRequest<ProxyBody>,
    pub(crate) served: u64,
}

impl Conn {
    pub(crate) fn new(sender: SendRequest<ProxyBody>) -> Self {
        Self { sender, served: 0 }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Whether the connection has carried a request before (and so may have gone stale).
    pub(crate) fn is_reused(&self) -> bool {
        self.served > 0
    }
}

/// An idle connection and when it became idle.
#[derive(Debug)]
pub(crate) struct IdleConn {
    pub(crate) conn: Conn,
    pub(crate) since: Instant,
}

/// An idle fast-path connection and when it became idle.
#[derive(Debug)]
pub(crate) struct IdleRaw {
    pub(crate) conn: RawConn,
    since: Instant,
}

impl IdleRaw {
    pub(crate) fn new(conn: RawConn) -> Self {
        Self {
            conn,
            since: Instant::now(),
        }
    }

    /// How long it has been idle.
    pub(crate) fn idle_for(&self, now: Instant) -> std::time::Duration {
        now.duration_since(self.since)
    }
}

/// A connection to an endpoint and how many requests it has carried.
#[derive(Debug)]
pub(crate) struct RawConn {
    /// The socket.
    pub(crate) stream: TcpStream,
    /// Requests it has carried before the current one.
    pub(crate) served: u64,
}

/// An idle keep-alive connection has nothing to read: bytes or an end of stream mean the
/// upstream closed it (or broke the protocol), and it must not carry a request.
pub(crate) fn is_quiet(conn: &RawConn) -> bool {
    let mut probe = [0u8; 1];
    matches!(conn.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Drops idle connections past the idle timeout or closed by the upstream.
pub(crate) fn reap_raw(idle: &mut VecDeque<IdleRaw>, opts: &StaticOptions) {
    let now = Instant::now();
    idle.retain(|e| e.idle_for(now) < opts.pool.idle_timeout && is_quiet(&e.conn));
}
