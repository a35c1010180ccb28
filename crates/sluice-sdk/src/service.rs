//! [`SessionService`]: what the SDK can serve on sessions.

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use tower_service::Service;

/// The error type services and bodies may return, as hyper accepts it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tower service the SDK can run on sessions: it takes hyper's requests, its errors and
/// response bodies are ones hyper accepts, and it can be cloned per session and moved across
/// tasks. Implemented for every such service; there is nothing to implement.
pub trait SessionService:
    Service<Request<Incoming>, Response = Response<Self::Body>, Error: Into<BoxError>, Future: Send>
    + Clone
    + Send
    + 'static
{
    /// The response body.
    type Body: Body<Data: Send, Error: Into<BoxError>> + Send + 'static;
}

impl<S, B> SessionService for S
where
    S: Service<Request<Incoming>, Response = Response<B>, Error: Into<BoxError>, Future: Send>
        + Clone
        + Send
        + 'static,
    B: Body<Data: Send, Error: Into<BoxError>> + Send + 'static,
{
    type Body = B;
}
