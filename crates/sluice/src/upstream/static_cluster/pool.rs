//! Pooled keep-alive connections.

use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use crate::body::ProxyBody;

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
