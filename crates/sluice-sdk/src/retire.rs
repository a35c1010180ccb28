//! [`Retiring`]: the user's service, as hyper sees it on one session. It puts the request's
//! [`ClientAddr`] in its extensions. When the session owes a
//! retirement, its next response carries `Connection: close`, so the proxy closes the session
//! after that response (DESIGN.md §3, "Retire") and no request is ever lost to the shrink.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::header::{HeaderValue, CONNECTION};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tower::util::Oneshot;
use tower::ServiceExt;
use tower_service::Service;

use crate::state::Shared;
use crate::ClientAddr;

/// What one session learned while serving.
#[derive(Debug, Default)]
pub(crate) struct SessionFlags {
    /// At least one response was produced.
    pub(crate) served: AtomicBool,
    /// A response carried `Connection: close` for a retirement: do not re-dial.
    pub(crate) retired: AtomicBool,
}

/// Calls a clone of the user's service per request, as `TowerToHyperService` does.
#[derive(Debug, Clone)]
pub(crate) struct Retiring<S> {
    service: S,
    shared: Arc<Shared>,
    flags: Arc<SessionFlags>,
    /// The session's peer: the client address of a request that names none.
    peer: Option<SocketAddr>,
}

impl<S> Retiring<S> {
    pub(crate) fn new(
        service: S,
        shared: Arc<Shared>,
        flags: Arc<SessionFlags>,
        peer: Option<SocketAddr>,
    ) -> Self {
        Self {
            service,
            shared,
            flags,
            peer,
        }
    }
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Retiring<S>
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = RetiringFuture<S>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        if let Some(client) = ClientAddr::from_headers(req.headers(), self.peer) {
            req.extensions_mut().insert(client);
        }
        RetiringFuture {
            inner: self.service.clone().oneshot(req),
            shared: self.shared.clone(),
            flags: self.flags.clone(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The user's response future; marks the response when the session retires.
    #[derive(Debug)]
    pub(crate) struct RetiringFuture<S>
    where
        S: Service<Request<Incoming>>,
    {
        #[pin]
        inner: Oneshot<S, Request<Incoming>>,
        shared: Arc<Shared>,
        flags: Arc<SessionFlags>,
    }
}

impl<S, B> Future for RetiringFuture<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Output = Result<Response<B>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        this.flags.served.store(true, Ordering::Relaxed);
        // A 101 hands the connection to the upgrade; it ends the session anyway.
        if response.status() != StatusCode::SWITCHING_PROTOCOLS && retires(this.shared, this.flags)
        {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        Poll::Ready(Ok(response))
    }
}

fn retires(shared: &Shared, flags: &SessionFlags) -> bool {
    if flags.retired.load(Ordering::Relaxed) {
        return true;
    }
    let claimed = shared.claim_retirement();
    if claimed {
        flags.retired.store(true, Ordering::Relaxed);
        tracing::debug!("retiring session: answering with Connection: close");
    }
    claimed
}
