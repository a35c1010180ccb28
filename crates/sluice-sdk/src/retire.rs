//! [`Retiring`]: the user's service, as hyper sees it on one session. It puts the request's
//! [`ClientAddr`] in its extensions. When an HTTP/1.1 session owes a
//! retirement, its next response carries `Connection: close`, so the proxy closes the session
//! after that response (docs/design.md §3, "Retire") and no request is ever lost to the shrink.
//! An HTTP/2 session retires by `GOAWAY` instead, whatever it has in flight (the slot sends
//! it), so its responses claim nothing.
//! [`CloseRule`] says when a session owes one: with one acceptor, a shrink; with many nodes,
//! its node no longer being live (a shrink is a `RETIRE` the node carries out).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::header::{HeaderValue, CONNECTION};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tower::util::Oneshot;
use tower::ServiceExt;
use tower_service::Service;

use crate::client::ClientAddr;
use crate::fleet::Lease;
use crate::state::{Counts, Shared};

/// When a session closes on the SDK's side (idle at once, busy after its response).
#[derive(Debug, Clone)]
pub(crate) enum CloseRule {
    /// One acceptor: when a shrink owes a retirement (claimed; the slot then ends).
    Shrink(Arc<Shared>),
    /// Many nodes: when its node is not live any more (the slot dials elsewhere).
    Node(Arc<Lease>),
}

/// Wakes a session when its [`CloseRule`] may have changed its mind.
#[derive(Debug)]
pub(crate) enum Changes {
    Counts(tokio::sync::watch::Receiver<Counts>),
    Fleet(tokio::sync::watch::Receiver<u64>),
}

impl Changes {
    /// The next change; `false` if nothing can change any more (the handle is gone).
    pub(crate) async fn changed(&mut self) -> bool {
        match self {
            Changes::Counts(rx) => rx.changed().await.is_ok(),
            Changes::Fleet(rx) => rx.changed().await.is_ok(),
        }
    }
}

impl CloseRule {
    /// Claims a close for this session, if it owes one.
    pub(crate) fn claim(&self) -> bool {
        match self {
            CloseRule::Shrink(shared) => shared.claim_retirement(),
            CloseRule::Node(lease) => lease.claim_close(),
        }
    }

    pub(crate) fn subscribe(&self) -> Changes {
        match self {
            CloseRule::Shrink(shared) => Changes::Counts(shared.subscribe_counts()),
            CloseRule::Node(lease) => Changes::Fleet(lease.fleet().subscribe()),
        }
    }
}

/// What one session learned while serving.
#[derive(Debug, Default)]
pub(crate) struct SessionFlags {
    /// At least one response was produced.
    pub(crate) served: AtomicBool,
    /// A response carried `Connection: close` for a retirement, or the session was closed
    /// idle for one: do not re-dial.
    pub(crate) retired: AtomicBool,
    /// A request is being served: from its arrival until its response body is done
    /// (HTTP/1.1 sessions; an HTTP/2 session's streams overlap, and it never asks).
    pub(crate) busy: AtomicBool,
}

/// Calls a clone of the user's service per request, as `TowerToHyperService` does.
#[derive(Debug, Clone)]
pub(crate) struct Retiring<S> {
    service: S,
    /// `None` on an HTTP/2 session: no response claims a retirement.
    rule: Option<CloseRule>,
    flags: Arc<SessionFlags>,
    /// The session's peer: the client address of a request that names none.
    peer: Option<SocketAddr>,
}

impl<S> Retiring<S> {
    pub(crate) fn new(
        service: S,
        rule: Option<CloseRule>,
        flags: Arc<SessionFlags>,
        peer: Option<SocketAddr>,
    ) -> Self {
        Self {
            service,
            rule,
            flags,
            peer,
        }
    }
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Retiring<S>
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone,
{
    type Response = Response<Tracked<B>>;
    type Error = S::Error;
    type Future = RetiringFuture<S>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        if let Some(client) = ClientAddr::from_headers(req.headers(), self.peer) {
            req.extensions_mut().insert(client);
        }
        self.flags.busy.store(true, Ordering::SeqCst);
        RetiringFuture {
            inner: self.service.clone().oneshot(req),
            rule: self.rule.clone(),
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
        rule: Option<CloseRule>,
        flags: Arc<SessionFlags>,
    }
}

impl<S, B> Future for RetiringFuture<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Output = Result<Response<Tracked<B>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match ready!(this.inner.poll(cx)) {
            Ok(response) => response,
            Err(e) => {
                this.flags.busy.store(false, Ordering::SeqCst);
                return Poll::Ready(Err(e));
            }
        };
        let mut response = response.map(|body| Tracked {
            body,
            flags: Arc::clone(this.flags),
        });
        this.flags.served.store(true, Ordering::Relaxed);
        // A 101 hands the connection to the upgrade; it ends the session anyway.
        let retires = match this.rule {
            Some(rule) => {
                response.status() != StatusCode::SWITCHING_PROTOCOLS && retires(rule, this.flags)
            }
            None => false,
        };
        if retires {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        Poll::Ready(Ok(response))
    }
}

fn retires(rule: &CloseRule, flags: &SessionFlags) -> bool {
    if flags.retired.load(Ordering::Relaxed) {
        return true;
    }
    let claimed = rule.claim();
    if claimed {
        flags.retired.store(true, Ordering::Relaxed);
        tracing::debug!("retiring session: answering with Connection: close");
    }
    claimed
}

pin_project_lite::pin_project! {
    /// A response body that marks its session idle again when hyper is done with it.
    #[derive(Debug)]
    pub(crate) struct Tracked<B> {
        #[pin]
        body: B,
        flags: Arc<SessionFlags>,
    }

    impl<B> PinnedDrop for Tracked<B> {
        fn drop(this: Pin<&mut Self>) {
            this.flags.busy.store(false, Ordering::SeqCst);
        }
    }
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
