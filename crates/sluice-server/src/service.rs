//! [`HttpService`]: the one bound every server function needs, named once.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use tower::util::Oneshot;
use tower::ServiceExt;
use tower_service::Service;

/// Any error a connection or a body may end with.
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tower service a [`Server`](super::Server) can run: it takes hyper's requests, never
/// fails (errors are responses), and can be cloned per connection and sent across threads.
///
/// Implemented for every tower `Service` with those properties; there is nothing to implement.
pub trait HttpService: Clone + Send + 'static {
    /// The response body.
    type Body: http_body::Body<Data = Bytes, Error = Self::BodyError> + Send + 'static;
    /// The response body's error.
    type BodyError: Into<BoxError>;
    /// The response future.
    type Future: Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;

    /// Waits until the service is ready, then calls it with `req`.
    fn serve(self, req: Request<Incoming>) -> Self::Future;
}

impl<S, B> HttpService for S
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Body = B;
    type BodyError = B::Error;
    type Future = Oneshot<S, Request<Incoming>>;

    fn serve(self, req: Request<Incoming>) -> Self::Future {
        self.oneshot(req)
    }
}

/// A tower service an [`H3Server`](crate::http3::H3Server) can run: the same as
/// [`HttpService`], over the request every transport but hyper's hands the proxy (its body a
/// [`RequestBody`](sluice_core::body::RequestBody)).
#[cfg(feature = "http3")]
pub trait H3Service: Clone + Send + 'static {
    /// The response body.
    type Body: http_body::Body<Data = Bytes, Error = Self::BodyError> + Send + 'static;
    /// The response body's error.
    type BodyError: Into<BoxError> + Send;
    /// The response future.
    type Future: Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;

    /// Waits until the service is ready, then calls it with `req`.
    fn serve(self, req: Request<sluice_core::body::RequestBody>) -> Self::Future;
}

#[cfg(feature = "http3")]
impl<S, B> H3Service for S
where
    S: Service<Request<sluice_core::body::RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    type Body = B;
    type BodyError = B::Error;
    type Future = Oneshot<S, Request<sluice_core::body::RequestBody>>;

    fn serve(self, req: Request<sluice_core::body::RequestBody>) -> Self::Future {
        self.oneshot(req)
    }
}
