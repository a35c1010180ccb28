//! Pooled keep-alive connections and their return to the pool when a response ends.

use std::sync::Arc;

use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use super::endpoint::InFlight;
use super::StaticOptions;
use crate::body::{ProxyBody, Release};

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

/// Travels with a response body: returns the connection to its endpoint's pool when the body
/// has been read to the end, and releases the endpoint's in-flight count when dropped.
///
/// A body dropped before its end drops the connection instead, because HTTP/1.1 cannot reuse a
/// connection with an unread response on it.
#[derive(Debug)]
pub(crate) struct ReturnOnEnd {
    conn: Option<Conn>,
    opts: Arc<StaticOptions>,
    in_flight: InFlight,
}

impl ReturnOnEnd {
    pub(crate) fn new(conn: Option<Conn>, opts: Arc<StaticOptions>, in_flight: InFlight) -> Self {
        Self {
            conn,
            opts,
            in_flight,
        }
    }
}

impl Release for ReturnOnEnd {
    /// The response has ended cleanly: the connection may carry another request.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.in_flight.endpoint().checkin(conn, &self.opts);
        }
    }
}
