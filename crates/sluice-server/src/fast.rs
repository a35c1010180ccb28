//! [`FastHttp1`]: what serves an HTTP/1.1 connection's requests before hyper does (the proxy's
//! fast path, `proxy::fast`), for as long as it takes them, and gives the connection back
//! ([`Left`]) at a request boundary with nothing of that request consumed. The server defines
//! it and knows nothing of what implements it: `server` is transport.

use std::any::TypeId;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sluice_net::http::HttpOptions;
use tokio::io::{AsyncRead, AsyncWrite};

pub use super::active::ActiveRequests;
use sluice_core::ClientInfo;
use sluice_net::shutdown::ShutdownSignal;

/// A client connection's byte stream (plain TCP or TLS), as the fast path sees it.
pub trait ConnIo: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> ConnIo for T {}

/// What a fast path left of a connection.
#[derive(Debug)]
pub enum Left {
    /// Nothing: the connection is done.
    Done,
    /// hyper serves the rest, starting with these bytes.
    HandOff(Vec<u8>),
    /// No request came for a while, or the shutdown came, while the connection waited for
    /// one since the instant given: the server waits on (an idle connection holds nothing of
    /// the fast path's), closes the connection when the header timeout from that instant
    /// ends or the shutdown leaves it nothing to serve, and else serves the request from its
    /// first bytes again.
    Idle(tokio::time::Instant),
}

/// What a fast path is given with a connection.
#[derive(Debug, Clone, Copy)]
pub struct Conn<'a> {
    /// The client.
    pub info: &'a ClientInfo,
    /// The listener's HTTP settings (limits, timeouts).
    pub http: &'a HttpOptions,
    /// The server's shutdown signal.
    pub signal: &'a ShutdownSignal,
    /// The connection's requests in flight, for the graceful shutdown.
    pub active: &'a Arc<ActiveRequests>,
    /// Fields the listener puts on every answer (`Alt-Svc`, where it serves HTTP/3), over
    /// any of the same name, as hyper's server does on this listener.
    pub fields: &'a [(http::HeaderName, http::HeaderValue)],
}

/// The future a fast path serves a connection with.
pub type Serving<'a> = Pin<Box<dyn Future<Output = Left> + Send + 'a>>;

/// Serves HTTP/1.1 requests on a connection until it ends, a request is left to hyper, or it
/// waits for one and is left to the server.
pub trait FastHttp1: Send + Sync + std::fmt::Debug + 'static {
    /// Serves `io`, beginning with `first` (bytes the server has read from it already: the
    /// HTTP/2 sniff's, an idle connection's next request; may be empty), until the connection
    /// ends (`Left::Done`), hyper is to serve the rest (`Left::HandOff`), or it waits for a
    /// request (`Left::Idle`). That last one is owed when no request has begun a while after
    /// the wait began, and at once when the shutdown comes during the wait: the server keeps
    /// idle connections, closes one whose header timeout from the instant given has passed,
    /// and decides what a shutdown leaves of it.
    fn serve<'a>(&'a self, io: &'a mut dyn ConnIo, conn: Conn<'a>, first: Vec<u8>) -> Serving<'a>;

    /// The type of the service whose requests it serves: a server uses the fast path only for
    /// that service, so that a service wrapped in tower layers is never bypassed.
    fn service_type(&self) -> TypeId;
}
