//! What the server hands the fast path ([`Request`]) and what it gets back ([`Served`]).

use sluice_net::shutdown::ShutdownSignal;
use sluice_wire::h1::RequestHead;

use crate::server::ClientInfo;

/// What became of a request the fast path was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// Answered; the connection may carry another request.
    KeepAlive,
    /// Answered (or the client went away); the connection closes.
    Close,
    /// Not for the fast path (and why): nothing was read or written, hyper serves it.
    HandOff(&'static str),
}

/// A request the fast path took, with what routing and logging need.
pub(crate) struct Request<'a> {
    /// The client's bytes, starting with the head.
    pub(crate) buf: &'a [u8],
    /// The parsed head.
    pub(crate) head: &'a RequestHead,
    /// The connection's client.
    pub(crate) client: &'a ClientInfo,
    /// The server's shutdown: once triggered, responses close their connection.
    pub(crate) shutdown: &'a ShutdownSignal,
}
