//! The request path of a reverse slice: lease, exchange, and the retries.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{HeaderName, HeaderValue, Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;
use tracing::debug;

use super::buffer;
use super::halves::Halves;
use super::protocol::{refused, HeldLease, Lease, ReverseSlice, Session, SessionClient, SlicePool};
use crate::exchange::{self, Answer, Failure, Replay};
use crate::served::{note_served_by, ServedBy, WantsServedBy};
use sluice_core::attempts::{self, Attempts, Ended, Next, Tried};
use sluice_core::body::ProxyBody;
use sluice_core::error::ProxyError;
use sluice_core::read_ahead;
use sluice_core::retry::{self, Retries};
use sluice_core::ClientInfo;

/// Reads a body that fits `request_buffer`, then leases a session and exchanges the request
/// on it. A session that dies before any response byte costs the request a second session
/// when the request can be replayed: hyper gave it back unsent, or it is idempotent and its
/// body is in memory; a failure or answer the cluster's retry policy lists costs it another
/// session as the policy allows (`sluice_core::retry`). The order of those decisions is
/// `sluice_core::attempts::drive`'s, as for every data path.
pub(crate) async fn send(
    slice: &ReverseSlice,
    mut req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let pool = slice.pool();
    stamp_client_addr(&mut req);
    let wants = req.extensions().get::<WantsServedBy>().is_some();
    let req = buffer::request(req, pool.options().request_buffer).await?;
    let mut retries = Retries::new(
        pool.protocol_options().retry(),
        retry::is_idempotent(req.method()),
    );
    let (session, queued) = pool.lease_waited().await.map_err(refused)?;
    // Copied only once a session is leased: a request refused for capacity never pays for it.
    // Any session may have been ended by its service while it was idle, so the stale rule may
    // always need it.
    let replay = (retries.may_replay() || retry::is_idempotent(req.method()))
        .then(|| Replay::of(&req))
        .flatten();
    let mut up = ToSessions {
        pool,
        replay,
        queued,
    };
    match attempts::drive(&mut up, (session, req), &mut retries).await {
        Ended::Answered((mut res, instance)) => {
            let queued = up.queued;
            note_served_by(wants, &mut res, || ServedBy {
                instance: Some(instance),
                queued: Some(queued),
                leased_at: leased_at(queued),
                ..ServedBy::default()
            });
            Ok(res)
        }
        Ended::Failed(e) => Err(e),
        // hyper's path learns of a client that left by being dropped.
        Ended::Gone => Err(ProxyError::UpstreamInvalid("client gone")),
    }
}

/// One request's attempts on a reverse slice's sessions.
struct ToSessions<'a> {
    pool: &'a Arc<SlicePool>,
    /// A copy of the request, when it may go again.
    replay: Option<Replay>,
    /// How long the request has waited for sessions, all attempts together.
    queued: std::time::Duration,
}

impl ToSessions<'_> {
    /// Another session for `req`, or the request's error.
    async fn lease(
        &mut self,
        req: Request<ProxyBody>,
    ) -> Next<(Session, Request<ProxyBody>), Answered> {
        match self.pool.lease_waited().await {
            Ok((session, waited)) => {
                self.queued += waited;
                Next::Lease((session, req))
            }
            Err(e) => Next::Failed(refused(e)),
        }
    }
}

/// An answer, and the instance whose session gave it.
type Answered = (Response<ProxyBody>, Arc<sluice_reverse::Instance>);

impl Attempts for ToSessions<'_> {
    type Lease = (Session, Request<ProxyBody>);
    type Answer = Answered;
    /// The request when hyper gave it back unsent.
    type Back = Option<Request<ProxyBody>>;

    async fn attempt(
        &mut self,
        (session, req): (Session, Request<ProxyBody>),
    ) -> Tried<Answered, Option<Request<ProxyBody>>> {
        let instance = Arc::clone(session.instance());
        let shared = session.is_shared();
        let body = exchange::kept(self.replay.as_ref());
        match send_on(self.pool, session, req).await {
            Ok(res) => Tried::Answer {
                status: res.status().as_u16(),
                len: http_body::Body::size_hint(res.body()).exact(),
                answer: (res, instance),
                body,
            },
            // A stream of an HTTP/2 session that refused it unprocessed (a GOAWAY hyper had not
            // yet acted on, or REFUSED_STREAM) goes to another session without using up the
            // retry a stale HTTP/1.1 session gets: several sessions may be going away at once
            // (an instance's graceful shutdown); one going away ended with the failure.
            Err(failure) => Tried::Failed(attempts::Failure {
                refused: shared && failure.failed == retry::Failed::Unsent,
                failed: failure.failed,
                error: failure.error,
                // Any session may have been ended by its service while it was idle.
                stale: true,
                body,
                back: failure.unsent,
            }),
        }
    }

    async fn renew(
        &mut self,
        unsent: Option<Request<ProxyBody>>,
        error: ProxyError,
    ) -> Next<(Session, Request<ProxyBody>), Answered> {
        debug!(%error, "session failed before the response; retrying on another");
        match exchange::again(unsent, self.replay.as_ref()) {
            Some(req) => self.lease(req).await,
            None => Next::Failed(error),
        }
    }

    /// Any session is elsewhere: the same as [`Self::renew`].
    async fn elsewhere(
        &mut self,
        unsent: Option<Request<ProxyBody>>,
        error: ProxyError,
    ) -> Next<(Session, Request<ProxyBody>), Answered> {
        self.renew(unsent, error).await
    }

    /// Reads the answer off first, so that its session is free for the next attempt (the only
    /// one, maybe).
    async fn replace(
        &mut self,
        (res, instance): Answered,
    ) -> Next<(Session, Request<ProxyBody>), Answered> {
        let Some(req) = self.replay.as_ref().map(Replay::request) else {
            return Next::Answer((res, instance));
        };
        let status = res.status().as_u16();
        debug!(instance = %instance.id(), status, "retrying the request on another session");
        exchange::discard(res, self.pool.options().response_timeout);
        self.lease(req).await
    }

    fn failed(&mut self, _: Option<Request<ProxyBody>>, _: &ProxyError) {}
}

/// When a request that waited `queued` for its session got it: now, read only if it waited.
pub(super) fn leased_at(queued: std::time::Duration) -> Option<std::time::Instant> {
    (!queued.is_zero()).then(std::time::Instant::now)
}

/// Sets `Sluice-Client-Addr` to the client's TCP peer as the server saw it, replacing every
/// copy a client (or a route's header edit) put there: services trust it as the client's
/// address. A request that came without [`ClientInfo`] (a framework caller's own) carries none.
fn stamp_client_addr(req: &mut Request<ProxyBody>) {
    let name = HeaderName::from_static(sluice_session::HEADER_CLIENT_ADDR);
    let peer = req.extensions().get::<ClientInfo>().map(|c| c.peer);
    let value = peer.and_then(|p| HeaderValue::try_from(sluice_session::client_addr_value(p)).ok());
    match value {
        Some(value) => {
            req.headers_mut().insert(name, value);
        }
        None => {
            req.headers_mut().remove(name);
        }
    }
}

async fn send_on(
    pool: &Arc<SlicePool>,
    mut session: Session,
    mut req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, Failure> {
    exchange::frame_unsized_body(&mut req);
    let link = match session.client() {
        SessionClient::Http1(link) => link,
        SessionClient::H2(_) => return send_on_stream(pool, session, req).await,
    };
    let upgrade = req.headers().contains_key(http::header::UPGRADE);
    let Some(sender) = link.hyper(upgrade).await else {
        // The session ended as it was leased: nothing went out, so the request may go again.
        return Err(Failure {
            error: ProxyError::UpstreamInvalid("session closed"),
            failed: retry::Failed::Unsent,
            unsent: Some(req),
        });
    };
    let timeout = exchange::response_timeout(&req, pool.options().response_timeout);
    let answer = sender.try_send_request(req);
    let mut exchange = Exchange::start(pool, session, answer, timeout.after);
    let Ok((answer, session)) = tokio::time::timeout_at(exchange.deadline, &mut exchange).await
    else {
        exchange.forget();
        return Err(Failure::timed_out(timeout));
    };
    let res = exchange::answered(answer)?;
    finish(pool, session, res).await.map_err(Failure::later)
}

/// Exchanges `req` on one stream of an HTTP/2 session. Unlike an HTTP/1.1 session's, the
/// stream is given back whenever the exchange ends, also when the client leaves first: hyper
/// then resets the stream (`RST_STREAM` reaches the service, which cancels the request), and
/// the session carries on.
async fn send_on_stream(
    pool: &Arc<SlicePool>,
    mut session: Session,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, Failure> {
    let SessionClient::H2(stream) = session.client() else {
        return Err(Failure::later(ProxyError::UpstreamInvalid(
            "session closed",
        )));
    };
    let mut sender = stream.sender().clone();
    // The stream goes back when both its request body and its response are done (or dropped:
    // a client that leaves drops this future and both with it).
    let lease = Lease::new(Some(session), Arc::clone(pool));
    let (request_half, response_half) = Halves::split(lease);
    let req = req.map(|body| body.reported(Box::new(move |_, _| drop(request_half))));
    let timeout = exchange::response_timeout(&req, pool.options().response_timeout);
    match exchange::send_h2(&mut sender, req, timeout, "http", &"sluice").await {
        Ok(res) => buffer::response(res, pool.options().response_buffer, response_half)
            .await
            .map_err(Failure::later),
        Err(failure) => {
            // hyper gave the request back unsent: the connection is going away (a GOAWAY it
            // had not yet acted on), and its other streams must not be leased. A stream the
            // service refused (REFUSED_STREAM) leaves the connection as it was.
            response_half.give_back_now(failure.unsent.is_some());
            Err(failure)
        }
    }
}

/// Resolves to the answer and the session it came on.
type Answering = Pin<Box<dyn Future<Output = (Answer, Session)> + Send>>;

/// A request on a session, its answer still to come, while the client may still leave.
///
/// HTTP/1.1 cannot cancel a request, so a session whose answer goes unread is lost: its
/// connection must close, and the service re-dials. When the client leaves before the answer
/// (its request future is dropped, and this with it), a task of its own waits for the answer
/// and reads it off to its end, both by the request's deadline, and gives the session back, as
/// the fast path's `read_off` does. The session stays leased until then, as the service is
/// still working on the request: capacity is never overcommitted.
struct Exchange {
    /// `None` once it has resolved, or was forgotten.
    answer: Option<Answering>,
    pool: Arc<SlicePool>,
    deadline: Instant,
}

impl Exchange {
    fn start(
        pool: &Arc<SlicePool>,
        session: Session,
        answer: impl Future<Output = Answer> + Send + 'static,
        timeout: std::time::Duration,
    ) -> Self {
        Self {
            answer: Some(Box::pin(async move { (answer.await, session) })),
            pool: Arc::clone(pool),
            deadline: Instant::now() + timeout,
        }
    }

    /// Drops the exchange and its session without waiting for the answer.
    fn forget(mut self) {
        self.answer = None;
    }
}

impl Future for Exchange {
    type Output = (Answer, Session);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // Polled again after its answer, it has nothing more to give.
        let Some(answer) = this.answer.as_mut() else {
            return Poll::Pending;
        };
        let out = ready!(answer.as_mut().poll(cx));
        this.answer = None;
        Poll::Ready(out)
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let Some(answer) = self.answer.take() else {
            return;
        };
        // Outside a runtime (it is being dropped) the session closes with its connection.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = Arc::clone(&self.pool);
        let deadline = self.deadline;
        runtime.spawn(async move {
            let read_off = async {
                let (answer, session) = answer.await;
                match answer {
                    Ok(res) => read_off(&pool, session, res).await,
                    Err(e) => {
                        debug!(instance = %session.instance().id(), error = %e.error(), "the request of a client that left failed");
                    }
                }
            };
            // The whole exchange, body included, gets what was left of the request's time.
            if tokio::time::timeout_at(deadline, read_off).await.is_err() {
                debug!("the answer for a client that left did not end before the request's deadline; its session closes");
            }
        });
    }
}

/// Reads the answer of a client that left to its end ([`exchange::read_off`], up to
/// `response_buffer`'s read-off limit), and gives the session back if it may carry another
/// request.
async fn read_off(pool: &Arc<SlicePool>, mut session: Session, res: Response<Incoming>) {
    let reusable = exchange::keeps_connection(&res) && !is_upgrade(&mut session);
    let mut lease = Lease::new(reusable.then_some(session), Arc::clone(pool));
    let limit = read_ahead::read_off_limit(Some(pool.options().response_buffer));
    if exchange::read_off(res, limit).await {
        lease.finish();
    }
}

/// Whether hyper's client on an HTTP/1.1 session was started for an upgrade.
fn is_upgrade(session: &mut Session) -> bool {
    matches!(session.client(), SessionClient::Http1(link) if link.is_upgrade())
}

/// Reads the body ahead up to `response_buffer` and gives the session back as soon as the
/// body has been read off it (see [`buffer::response`]). Either way only if the session may
/// carry another request: `Connection: close` retires it; an upgrade consumes it.
async fn finish(
    pool: &Arc<SlicePool>,
    mut session: Session,
    res: Response<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    // A session hyper started on for an upgrade it did not get stays with hyper's connection,
    // which closes it (the service re-dials).
    let reusable = exchange::keeps_connection(&res) && !is_upgrade(&mut session);
    let mut res = res;
    if res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        // Listed as upgraded while the proxy's bridge holds this.
        let upgraded = sluice_reverse::UpgradedSession::new(session.instance());
        res.extensions_mut().insert(upgraded);
    } else if !reusable {
        debug!(instance = %session.instance().id(), status = res.status().as_u16(), "session retired by its response");
    }
    let lease = HeldLease(Lease::new(reusable.then_some(session), Arc::clone(pool)));
    buffer::response(res, pool.options().response_buffer, lease).await
}
