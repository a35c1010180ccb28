//! [`FastPath`]: HTTP/1.1 requests to static clusters and reverse slices served without
//! hyper, header maps or a task per exchange: the client connection's task routes the
//! request, writes its head upstream by copying the client's field lines with the proxy's
//! edits (`sluice_wire::h1::write_head`), relays the body, reads the response head with
//! `sluice_wire::h1::parse_response` and relays the response the same way, on a pooled plain
//! TCP connection or a leased session's socket, which it drives itself
//! (`sluice_upstream::leased::Leased`). A session's response is read ahead up to its cluster's
//! `response_buffer` before the client gets it, as on the hyper path, so a slow client does
//! not hold the session.
//!
//! It takes only what it serves exactly as the hyper path does (the differential tests over
//! `crates/sluice-wire/corpus/` hold it to that): a request the parser takes
//! (`h1::Parsed::Take`) whose body, if any, has a `Content-Length` and has been read whole,
//! routed to a static cluster without TLS or to a reverse slice, or answered by the route
//! itself (`direct_response`, for a request without a body), by a route whose edits leave the
//! framing fields alone. Anything else is handed back, unread, to hyper
//! ([`Served::HandOff`]), which serves the connection from that request on.

mod answer;
mod body;
mod conn;
mod pool;
mod relay;
mod request;

use std::sync::Arc;
use tokio::time::Instant;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, Version};
use sluice_wire::h1::BodyFraming;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::debug;

use crate::access_log;
use crate::metrics::RouteCounters;
use crate::proxy::observe::Observers;
use crate::router::{Direct, Feature, Features, Route, Routing, Target};
use sluice_core::admission::{self, Outcome};
use sluice_core::error::ProxyError;
use sluice_core::fields::Fields;
use sluice_core::headers::apply_edits;
use sluice_core::route_feature::{Asked, Hooks};
use sluice_core::trace_context::{RequestTrace, SentContext};
use sluice_core::{checks, compression, redirect, rewrite};
use sluice_upstream::reverse::raw::SessionLease;
use sluice_upstream::{ReverseSlice, StaticCluster, Upstream};

/// The built-in route features this path renders (the rest are hyper's path's, which renders
/// them all): a route with any other feature is handed to it before anything else is done.
/// Edits of the framing fields (which this path writes itself) are not here; compression is,
/// as a request its route would compress is handed off by what the client accepts
/// (`compress`).
pub(crate) const RENDERS: Features = Features::of(&[
    Feature::BodyLimit,
    Feature::Rewrite,
    Feature::Compression,
    Feature::HeaderEdits,
]);

/// The hooks of registered route features this path drives: a refusal, after a wait or not
/// (a rate limit, basic auth). A route whose features answer requests themselves or edit
/// answers (CORS) is hyper's path's, as is one with a feature that does not say.
pub(crate) const DRIVES: Hooks = Hooks::REFUSE.and(Hooks::WAIT);

pub(crate) use self::relay::Exchange;
pub(crate) use self::request::{timer_at, Request, Scratch, Served};

/// The fast path of a [`ProxyService`](super::ProxyService): its router, metrics and access
/// log, shared. Cloning is cheap.
#[derive(Clone)]
pub struct FastPath {
    router: Arc<dyn Routing>,
    observers: Arc<Observers>,
    /// The type of the proxy service it belongs to.
    service: std::any::TypeId,
}

impl std::fmt::Debug for FastPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastPath").finish_non_exhaustive()
    }
}

impl FastPath {
    pub(super) fn new(
        router: Arc<dyn Routing>,
        observers: Arc<Observers>,
        service: std::any::TypeId,
    ) -> Self {
        Self {
            router,
            observers,
            service,
        }
    }

    /// Serves `req` over `client`; returns how many bytes of `req.buf` it used (head and body)
    /// and what follows. Bytes the client pipelines while the request waits are kept in
    /// `scratch.pipelined`.
    pub(crate) async fn serve<C>(
        &self,
        client: &mut C,
        req: Request<'_>,
        scratch: &mut Scratch,
    ) -> (usize, Served)
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let started = Instant::now();
        let parts = match Parts::of(&req, self.router.reads_headers()) {
            Ok(parts) => parts,
            Err(reason) => return (0, self.hand_off(reason)),
        };
        let Some(route) = self.route(&parts, &req) else {
            return (0, self.hand_off("route"));
        };
        let plan = match self.plan(&req, &parts, &route) {
            Ok(plan) => plan,
            Err(reason) => return (0, self.hand_off(reason)),
        };
        if let Some(metrics) = &self.observers.metrics {
            metrics.fast_path_request();
        }
        let id = self.observers.request_id(&Sent(&req), req.client.trusted);
        let id = id.as_ref().map(|(n, v)| (*n, v));
        let outcome = self.forward(client, scratch, &plan, id, started).await;
        // A session the fast path does not drive was leased: hyper's path serves the request.
        if let Served::HandOff(reason) = outcome.served {
            return (0, self.hand_off(reason));
        }
        // A request whose client hung up before its answer is neither counted nor logged, as
        // on the hyper path, which drops it.
        if outcome.status != 0 {
            let logged = Logged {
                outcome: &outcome,
                started,
                id: id.and_then(|(_, v)| v.to_str().ok()),
                trace: plan.trace.as_ref().filter(|t| t.sampled),
            };
            self.account(&parts, &req, &route, &logged, &mut scratch.counted);
        }
        (outcome.used, outcome.served)
    }

    /// What becomes of a request routed to `route`, decided before any I/O: where it goes, the
    /// target its rewrite makes and its trace; or, for what this path does not serve as
    /// hyper's does, the reason it is handed off.
    fn plan<'p>(
        &self,
        req: &'p Request<'p>,
        parts: &'p Parts<'p>,
        route: &'p Route,
    ) -> Result<Plan<'p>, &'static str> {
        let dest = Dest::of(route).ok_or("route")?;
        // A body over the limit is refused by hyper's path (413, the connection closed).
        let limit = checks::body_limit(route.max_request_body, req.client.max_body);
        let declared = match req.head.body {
            BodyFraming::Length(n) => n,
            // A chunked body was left to hyper by `Parts::of` already.
            BodyFraming::None | BodyFraming::Chunked => 0,
        };
        checks::check_body_length(declared, limit).map_err(|_| "limit")?;
        // hyper's server decides whether to read or drop a body the route's own answer leaves
        // unread, and so whether the connection stays: left to it.
        if declared > 0 && matches!(dest, Dest::Direct(_)) {
            return Err("body");
        }
        // A rewrite that makes no valid path is answered by hyper's path (500) too.
        let rules = req.client.rules.escaped_slashes;
        let target =
            rewrite::target(route.rewrite.as_ref(), parts.uri, rules).map_err(|_| "rewrite")?;
        // hyper's path compresses (`sluice_core::compression`); this one relays bytes as they are.
        if accepts_compression(req, route) {
            return Err("compress");
        }
        let sent = (self.observers.tracing.as_ref()).map(|_| SentContext::of(fields(req)));
        let trace = sent.and_then(|sent| self.observers.trace(sent, req.client.trusted));
        // A client's `tracestate` that does not go upstream with its trace is removed by
        // hyper's path (the head writer here only replaces fields).
        let sent_state = sent.is_some_and(|s| s.tracestate.is_some());
        if sent_state && trace.as_ref().is_some_and(|t| !t.keeps_tracestate()) {
            return Err("trace");
        }
        Ok(Plan {
            req,
            parts,
            route,
            dest,
            target,
            trace,
        })
    }

    /// Admits the planned request and answers it, or exchanges it upstream, to its end.
    async fn forward<C>(
        &self,
        client: &mut C,
        scratch: &mut Scratch,
        plan: &Plan<'_>,
        id: Option<(&HeaderName, &HeaderValue)>,
        started: Instant,
    ) -> relay::Outcome
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let Plan {
            req, parts, route, ..
        } = *plan;
        let traceparent = plan.trace.as_ref().map(|t| &t.traceparent);
        let target = plan.target.as_ref().map(|t| t.as_str().as_bytes());
        // Refused as a lease would be: the answer, the log line and the counts are the same.
        let admitted = admit(route, req, &parts.method).await;
        // A password's check is not the upstream's time: as on hyper's path, the exchange's
        // timeouts start after it.
        let taken = match route.registered().is_empty() {
            true => started,
            false => Instant::now(),
        };
        let exchange = Exchange::new(req, route, &parts.method, taken, id, traceparent).to(target);
        match plan.dest {
            Dest::Direct(d) => {
                let answered = admitted.and_then(|()| {
                    let host = host(req).map(super::strip_port);
                    let rewritten = plan.target.as_ref();
                    let place = redirect::Place::of(req.client.tls, host, parts.uri, rewritten);
                    own_answer(d, route, &place)
                });
                exchange.answer(client, answered).await
            }
            Dest::Static(cluster) => {
                let lease = async {
                    admitted?;
                    cluster.lease_raw(taken).await
                };
                exchange.run(client, scratch, lease, None).await
            }
            Dest::Reverse(slice) => {
                // As the hyper path stamps it: the client's TCP peer, over any copy the
                // client or the route put there.
                let addr = req.client_addr.as_bytes();
                let stamp = Some((sluice_session::HEADER_CLIENT_ADDR, addr));
                let lease = async {
                    admitted?;
                    SessionLease::lease(slice).await
                };
                exchange.run(client, scratch, lease, stamp).await
            }
        }
    }

    /// Leaves a request to hyper, counting why: `body` (chunked, not all here, or to a route
    /// that answers itself), `trailers` (the client accepts them), `head` (not a valid method,
    /// target or field), `route` (somewhere the fast path does not go), `limit` (a whole body
    /// over `max_request_body`: hyper's path answers 413; a larger one not all here counts as
    /// `body`), `trace` (a `tracestate` to remove), `rewrite` (the route's rewrite made no
    /// valid path: hyper's path answers 500), `compress` (the route compresses and the client
    /// accepts an encoding it offers), `session` (the slice's queue gave it a stream of an
    /// HTTP/2 session that registered after the route was chosen), or the parser's reason.
    pub(crate) fn hand_off(&self, reason: &'static str) -> Served {
        if let Some(metrics) = &self.observers.metrics {
            metrics.fast_path_handoff(reason);
        }
        Served::HandOff(reason)
    }

    /// The route, when this path renders every built-in feature it has ([`RENDERS`]) and
    /// drives every hook its registered features use ([`DRIVES`]); where it leads is
    /// [`Dest::of`]'s to say.
    fn route(&self, parts: &Parts<'_>, req: &Request<'_>) -> Option<Arc<Route>> {
        let host = host(req)?;
        let path = sluice_wire::normalize::match_path(parts.uri.path());
        let head = crate::router::RequestHead {
            method: &parts.method,
            uri: parts.uri,
            path: &path,
            headers: &parts.headers,
            host: Some(super::strip_port(host)),
            client: req.client.peer,
        };
        let route = self.router.route(&head)?;
        let renders = route.features().beyond(RENDERS).is_empty();
        (renders && route.hooks().within(DRIVES)).then_some(route)
    }

    /// Counts the request, logs it and queues its spans, as the hyper path does.
    fn account(
        &self,
        parts: &Parts<'_>,
        req: &Request<'_>,
        route: &Route,
        logged: &Logged<'_>,
        counted: &mut Option<RouteCounters>,
    ) {
        let Logged {
            outcome, started, ..
        } = *logged;
        if let Some(e) = &outcome.error {
            debug!(client.addr = %req.client.peer, error = %e, status = outcome.status, "upstream failed");
        }
        let elapsed = outcome.head_at.unwrap_or(started).duration_since(started);
        if let Some(metrics) = &self.observers.metrics {
            metrics.request_cached(counted, &route.name, outcome.status, elapsed);
        }
        if self.observers.records(logged.trace) {
            // As `HeaderValue::to_str`: visible ASCII only.
            let text = |name: &[u8]| {
                field(req, name)
                    .filter(|v| v.iter().all(|b| (32..127).contains(b) || *b == b'\t'))
                    .and_then(|v| std::str::from_utf8(v).ok())
            };
            let request_bytes = match req.head.body {
                BodyFraming::None => Some(0),
                BodyFraming::Length(n) => Some(n),
                BodyFraming::Chunked => None,
            };
            let entry = access_log::Entry {
                client: req.client.peer,
                method: &parts.method,
                uri: parts.uri,
                version: Version::HTTP_11,
                status: outcome.status,
                bytes: outcome.sent,
                complete: outcome.complete,
                request_bytes,
                route: &route.name,
                // The body has gone out by now: `$request_time`.
                elapsed: started.elapsed(),
                upstream: &outcome.by,
                user_agent: text(b"user-agent"),
                referer: text(b"referer"),
                request_id: logged.id,
            };
            self.observers.record(&entry, Some(route), logged.trace);
        }
    }
}

/// Whether the route's registered features let the request through, as on every transport
/// ([`admission::admit`]). Their hooks are ones this path drives ([`DRIVES`]): none answers
/// or edits an answer here.
async fn admit(route: &Route, req: &Request<'_>, method: &Method) -> Result<(), ProxyError> {
    if route.registered().is_empty() {
        return Ok(());
    }
    let sent = Sent(req);
    let host = host(req).map(|h| match h {
        h if h.bytes().any(|b| b.is_ascii_uppercase()) => h.to_ascii_lowercase().into(),
        h => std::borrow::Cow::Borrowed(h),
    });
    let asked = Asked {
        method,
        fields: &sent,
        client: req.client.peer.ip(),
        path: req.head.uri.path(),
        query: req.head.uri.query(),
        host: host.as_deref(),
        tls: req.client.tls,
    };
    match admission::admit(route.registered(), &asked).await.outcome {
        Outcome::Pass => Ok(()),
        Outcome::Refused(e) => Err(e),
        // A feature that answers yet says it does not (`RouteFeature::hooks`): refused
        // rather than skipped.
        Outcome::Answer(_) | Outcome::Refresh(_) => Err(ProxyError::NotImplemented(
            "a route feature's own answer on the HTTP/1 fast path",
        )),
    }
}

/// The request's fields as the client sent them (names matched without regard to case).
struct Sent<'r, 'b>(&'r Request<'b>);

impl Fields for Sent<'_, '_> {
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        let name = name.as_bytes();
        fields(self.0)
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }
}

/// What an exchange left for the metrics and the access log.
struct Logged<'a> {
    outcome: &'a relay::Outcome,
    started: Instant,
    id: Option<&'a str>,
    /// The request's trace, when sampled.
    trace: Option<&'a RequestTrace>,
}

/// The route's fixed answer with its response edits, as hyper's path makes it.
fn own_answer(
    direct: &Direct,
    route: &Route,
    place: &redirect::Place<'_>,
) -> Result<http::Response<Bytes>, ProxyError> {
    let mut res = super::direct_response(direct, place)?;
    apply_edits(res.headers_mut(), &route.response_headers);
    Ok(res)
}

/// A request the fast path takes, as [`FastPath::plan`] decided it.
struct Plan<'p> {
    req: &'p Request<'p>,
    parts: &'p Parts<'p>,
    route: &'p Route,
    dest: Dest<'p>,
    /// The target the route's rewrite made (`None`: the client's goes upstream).
    target: Option<PathAndQuery>,
    /// The request's trace (`None` without `[tracing]`).
    trace: Option<RequestTrace>,
}

/// Where the fast path sends a request.
#[derive(Clone, Copy)]
enum Dest<'r> {
    /// Nowhere: the route answers (`direct_response`).
    Direct(&'r Direct),
    /// A static cluster without TLS: a pooled plain TCP connection.
    Static(&'r StaticCluster),
    /// A reverse slice: a leased session's socket.
    Reverse(&'r ReverseSlice),
}

impl<'r> Dest<'r> {
    /// Where `route` leads, if the fast path goes there.
    fn of(route: &'r Route) -> Option<Self> {
        match &route.target {
            Target::Upstream(Upstream::Static(c)) if c.is_plain() => Some(Self::Static(c)),
            // hyper's HTTP/2 client serves slices with HTTP/2 sessions.
            Target::Upstream(Upstream::Reverse(s)) if !s.pool().multiplexed() => {
                Some(Self::Reverse(s))
            }
            // Interim and bodiless statuses, `Trailer` fields (dropped for `HEAD`) and a
            // compressing route's `Vary` are left to hyper's server and the compression layer.
            Target::Direct(d) if Self::renders_as_hyper(d, route) => Some(Self::Direct(d)),
            _ => None,
        }
    }

    /// Whether `route`'s own answer is one [`answer::render`] writes as hyper's server does.
    fn renders_as_hyper(direct: &Direct, route: &Route) -> bool {
        let status = direct.status;
        let trailer = |n: &HeaderName| n == http::header::TRAILER;
        !status.is_informational()
            && !matches!(status.as_u16(), 204 | 304)
            && route.compression.is_none()
            && !direct.headers.iter().any(|(n, _)| trailer(n))
            && !route.response_headers.set.iter().any(|(n, _)| trailer(n))
    }
}

/// The request's method, target and fields as the router reads them.
struct Parts<'a> {
    method: Method,
    /// As the parser parsed it.
    uri: &'a Uri,
    headers: HeaderMap,
}

impl<'a> Parts<'a> {
    /// Refused (with the reason) for a request whose body is chunked or not all in the buffer
    /// yet (hyper relays those, reading the upstream's answer while it sends), and for one that
    /// accepts trailers (`TE: trailers`), which hyper's server forwards and the fast path does
    /// not. The header map is built only for a router that reads it.
    fn of(req: &Request<'a>, with_headers: bool) -> Result<Self, &'static str> {
        let (buf, head) = (req.buf, req.head);
        let whole = match head.body {
            BodyFraming::None => true,
            BodyFraming::Length(n) => n <= (buf.len() - head.len) as u64,
            BodyFraming::Chunked => false,
        };
        if !whole {
            return Err("body");
        }
        if accepts_trailers(req) {
            return Err("trailers");
        }
        let invalid = "head";
        let method = Method::from_bytes(head.method(buf)).map_err(|_| invalid)?;
        let uri = &head.uri;
        let mut headers = HeaderMap::new();
        if with_headers {
            headers.reserve(head.fields.len());
            for field in &head.fields {
                let name = HeaderName::from_bytes(&buf[field.name.clone()]).map_err(|_| invalid)?;
                let value =
                    HeaderValue::from_bytes(&buf[field.value.clone()]).map_err(|_| invalid)?;
                headers.append(name, value);
            }
        }
        Ok(Self {
            method,
            uri,
            headers,
        })
    }
}

/// The request's fields: name, value.
fn fields<'b>(req: &Request<'b>) -> impl Iterator<Item = (&'b [u8], &'b [u8])> + 'b {
    let buf = req.buf;
    let head = req.head;
    head.fields
        .iter()
        .map(move |f| (&buf[f.name.clone()], &buf[f.value.clone()]))
}

/// The request's `Host`, as the parser took it (already in its normal form).
fn host<'b>(req: &Request<'b>) -> Option<&'b str> {
    std::str::from_utf8(&req.buf[req.head.host.clone()]).ok()
}

/// The value of the request's first field named `name`.
fn field<'b>(req: &Request<'b>, name: &[u8]) -> Option<&'b [u8]> {
    let buf = req.buf;
    let field = req
        .head
        .fields
        .iter()
        .find(|f| buf[f.name.clone()].eq_ignore_ascii_case(name));
    field.map(|f| &buf[f.value.clone()])
}

/// Whether `route` compresses responses and the client accepts one of its encodings.
fn accepts_compression(req: &Request<'_>, route: &Route) -> bool {
    let Some(config) = &route.compression else {
        return false;
    };
    let values = fields(req)
        .filter(|(name, _)| name.eq_ignore_ascii_case(b"accept-encoding"))
        .map(|(_, value)| value);
    compression::negotiate(&config.encodings, values).is_some()
}

/// Whether the client accepts trailer fields (`TE: trailers`, RFC 9110 §10.1.4).
fn accepts_trailers(req: &Request<'_>) -> bool {
    let buf = req.buf;
    let te = req
        .head
        .fields
        .iter()
        .filter(|f| buf[f.name.clone()].eq_ignore_ascii_case(b"te"));
    te.map(|f| &buf[f.value.clone()]).any(|v| {
        v.split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
    })
}
