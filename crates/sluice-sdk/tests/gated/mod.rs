//! [`Gated`]: a test service that counts requests in flight (and the most at once) and holds
//! the gated ones until the test lets them through.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::sync::Semaphore;

/// Answers `body`; a request to a gated path first takes a permit of `gate`.
#[derive(Clone)]
pub(crate) struct Gated {
    pub(crate) gate: Arc<Semaphore>,
    pub(crate) in_flight: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    /// The one path that waits (`None`: every path).
    only: Option<&'static str>,
    body: &'static str,
}

impl Gated {
    /// A service whose gate starts shut (`open`: open for good), holding `only` (or every
    /// path) until it passes, and answering `body`.
    pub(crate) fn new(open: bool, only: Option<&'static str>, body: &'static str) -> Self {
        let permits = if open { Semaphore::MAX_PERMITS } else { 0 };
        Self {
            gate: Arc::new(Semaphore::new(permits)),
            in_flight: Arc::default(),
            max: Arc::default(),
            only,
            body,
        }
    }

    /// The most requests in flight at once.
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

impl tower::Service<Request<Incoming>> for Gated {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let now = this.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            this.max.fetch_max(now, Ordering::SeqCst);
            if this.only.is_none_or(|path| req.uri().path() == path) {
                if let Ok(permit) = this.gate.acquire().await {
                    permit.forget();
                }
            }
            this.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(Response::new(Full::from(this.body)))
        })
    }
}
