//! [`ProxyService`]: the tower `Service` that routes a request and forwards or answers it.
//!
//! Hooks are tower `Layer`s around it; the server (`sluice-server`) runs it on connections.
//! HTTP/1.1 upgrades (WebSocket) are bridged by the `upgrade` submodule.

pub(crate) mod fast;
mod observe;
mod upgrade;

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri, Version};
use sluice_config::{Compression, Encoding};
use sluice_core::body::RequestBody;
use tracing::{debug, warn};

use self::observe::Observers;
use crate::access_log::{self, AccessLog};
use crate::metrics::Metrics;
use crate::otel::Tracing;
use crate::router::{Direct, RequestHead, Route, Routing, Target};
use sluice_core::admission::{self, Edits as AnswerEdits, Outcome};
use sluice_core::body::ProxyBody;
use sluice_core::checks::{self, check_request};
use sluice_core::compression;
use sluice_core::error::{Origin, ProxyError};
use sluice_core::grpc;
use sluice_core::headers::{
    add_forwarding, apply_edits, join_cookies, strip_hop_by_hop, strip_hop_by_hop_keep_upgrade,
    wants_trailers, Forwarding, TrailersWanted,
};
use sluice_core::request_id::RequestIds;
use sluice_core::route_feature::Asked;
use sluice_core::trace_context::{RequestTrace, SentContext, TRACEPARENT, TRACESTATE};
use sluice_core::{redirect, rewrite, ClientInfo};
use sluice_upstream::{Deadline, ServedBy, Upstream, WantsServedBy};

/// Routes each request with `R` and forwards it to the chosen upstream or answers it directly.
///
/// Cloning is cheap (one reference count): every clone shares the router and the rest, and a
/// server holds a clone per connection.
#[derive(Debug)]
pub struct ProxyService<R> {
    shared: Arc<Shared<R>>,
}

/// What every clone of a [`ProxyService`] shares.
#[derive(Debug)]
struct Shared<R> {
    router: Arc<R>,
    observers: Arc<Observers>,
}

impl<R> Clone for ProxyService<R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R> Clone for Shared<R> {
    fn clone(&self) -> Self {
        Self {
            router: Arc::clone(&self.router),
            observers: Arc::clone(&self.observers),
        }
    }
}

impl<R: Routing> ProxyService<R> {
    /// A proxy that asks `router` where each request goes.
    pub fn new(router: R) -> Self {
        Self::from_arc(Arc::new(router))
    }

    /// A proxy sharing an existing router.
    pub fn from_arc(router: Arc<R>) -> Self {
        let shared = Shared {
            router,
            observers: Arc::default(),
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Traces requests (see [`Tracing`]); by default none is.
    pub fn with_tracing(self, tracing: Tracing) -> Self {
        self.edit(|s| Arc::make_mut(&mut s.observers).tracing = Some(tracing))
    }

    /// Gives every request an ID (see [`RequestIds`]); by default requests get none.
    pub fn with_request_ids(self, ids: RequestIds) -> Self {
        self.edit(|s| Arc::make_mut(&mut s.observers).request_ids = Some(ids))
    }

    /// Logs every answered request to `log`; by default nothing is logged.
    pub fn with_access_log(self, log: AccessLog) -> Self {
        self.edit(|s| Arc::make_mut(&mut s.observers).access_log = Some(log))
    }

    /// Counts every request in `metrics` (by route and status, with its latency); by
    /// default nothing is counted.
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        self.edit(|s| Arc::make_mut(&mut s.observers).metrics = Some(metrics))
    }

    /// This proxy with `change` made (to its own copy, when clones share it).
    fn edit(self, change: impl FnOnce(&mut Shared<R>)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        change(&mut shared);
        Self {
            shared: Arc::new(shared),
        }
    }

    /// The HTTP/1 fast path sharing this proxy's router, metrics and access log, for a
    /// [`Server`](sluice_server::Server) to serve HTTP/1.1 requests with.
    pub fn fast_path(&self) -> fast::FastPath {
        fast::FastPath::new(
            Arc::clone(&self.shared.router) as Arc<dyn Routing>,
            Arc::clone(&self.shared.observers),
            std::any::TypeId::of::<Self>(),
        )
    }

    /// Handles one request; failures become short plain-text error responses. Its body is any
    /// transport's: hyper's `Incoming`, or another's boxed (`BoxBody`, see [`RequestBody`]).
    pub async fn handle<B: Into<RequestBody>>(&self, req: Request<B>) -> Response<ProxyBody> {
        let mut req = req.map(Into::into);
        let started = Instant::now();
        let client = req
            .extensions()
            .get::<ClientInfo>()
            .copied()
            .unwrap_or_default();
        let observers = &self.shared.observers;
        let id = observers.request_id(req.headers(), client.trusted);
        let trace = observers.tracing.as_ref().and_then(|_| {
            let fields = req.headers().iter();
            let sent = SentContext::of(fields.map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())));
            observers.trace(sent, client.trusted)
        });
        // Kept only when a log or a trace wants them: the request itself moves on.
        let logged = observers.records(trace.as_ref()).then(|| {
            req.extensions_mut().insert(WantsServedBy);
            Logged::of(&req, started, id.as_ref().map(|(_, v)| v))
        });
        let http1 = req.version() <= Version::HTTP_11;
        // gRPC runs over HTTP/2 only, and its client reads Sluice's own failures from fields.
        let grpc = !http1 && grpc::is_grpc(req.headers());
        let mut matched = None;
        let stamp = id.as_ref().map(|(n, v)| (*n, v));
        let stamps = Stamps {
            id: stamp,
            trace: trace.as_ref(),
        };
        let mut edits = AnswerEdits::default();
        let dispatched = self.dispatch(req, &client, &stamps, &mut matched, &mut edits);
        let mut res = match dispatched.await {
            Ok(res) => res,
            Err(e) => {
                log_failure(&e, &client, matched.as_deref());
                match grpc {
                    true => grpc::response(&e, stamp),
                    false => e.response_with_id(http1, stamp),
                }
            }
        };
        // The route's features' edits (a CORS route's fields), on whatever answers: the
        // upstream's or Sluice's own error (a feature's own answer has them already).
        edits.apply(res.headers_mut());
        let route = matched
            .as_ref()
            .map_or("-", |r: &Arc<Route>| r.name.as_str());
        if let Some(metrics) = &observers.metrics {
            metrics.request(route, res.status().as_u16(), started.elapsed());
        }
        match logged {
            Some(logged) => {
                let trace = trace.filter(|t| t.sampled);
                logged.at_end(res, client.peer, matched, trace, Arc::clone(observers))
            }
            None => res,
        }
    }

    async fn dispatch(
        &self,
        mut req: Request<RequestBody>,
        client: &ClientInfo,
        stamps: &Stamps<'_>,
        matched: &mut Option<Arc<Route>>,
        edits: &mut AnswerEdits,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        check_request(&req)?;
        sluice_wire::normalize::normalize_request(&mut req, client.rules)?;
        let host = request_host(&req);
        let path = sluice_wire::normalize::match_path(req.uri().path());
        let head = RequestHead {
            method: req.method(),
            uri: req.uri(),
            path: &path,
            headers: req.headers(),
            host: host.as_deref(),
            client: client.peer,
        };
        let route = self.shared.router.route(&head).ok_or(ProxyError::NoRoute)?;
        *matched = Some(Arc::clone(&route));
        drop((host, path));
        // Asked before the request moves on; `None` on a route that does not compress.
        let accepted = route.compression.as_ref().and_then(|c| {
            let fields = req.headers().get_all(header::ACCEPT_ENCODING).iter();
            compression::negotiate(&c.encodings, fields.map(HeaderValue::as_bytes))
        });
        let head_request = req.method() == http::Method::HEAD;
        let (mut keeps, stored) = match admit(&route, &req, client, edits).await? {
            Admitted::Pass(keeps) => (keeps, None),
            Admitted::Own(res) => return Ok(res),
            Admitted::Stored(res) => return Ok(dress(&route, res, accepted, head_request)),
            Admitted::Refresh(res, keeps) => (keeps, Some(res)),
        };
        let rules = client.rules.escaped_slashes;
        let target = rewrite::target(route.rewrite.as_ref(), req.uri(), rules)?;
        let res = match &route.target {
            Target::Direct(direct) => {
                let host = request_host(&req);
                let place =
                    redirect::Place::of(client.tls, host.as_deref(), req.uri(), target.as_ref());
                direct_response(direct, &place)?.map(ProxyBody::full)
            }
            Target::Upstream(upstream) => {
                let limit = checks::body_limit(route.max_request_body, client.max_body);
                // A declared length is refused before any of the body is read.
                checks::check_body_length(http_body::Body::size_hint(req.body()).lower(), limit)?;
                let client_side = upgrade::requested(&mut req);
                keeps.ask(req.headers_mut());
                let edits = Edits {
                    route: &route,
                    stamps,
                    limit,
                    target,
                };
                let mut req = upstream_request(req, client, &edits, client_side.is_some());
                grpc_deadline(&mut req);
                // A stored answer now; the request, with no body to read, refreshes it.
                let unread = client_side.is_some() || !http_body::Body::is_end_stream(req.body());
                if let Some(stored) = stored.filter(|_| !unread) {
                    refresh(upstream.clone(), req, keeps);
                    return Ok(dress(&route, stored, accepted, head_request));
                }
                let res = match upstream.send(req).await {
                    Ok(res) => kept(res, keeps),
                    Err(e) => {
                        return in_place_of(e, keeps)
                            .map(|r| dress(&route, r, accepted, head_request))
                    }
                };
                upgrade::respond(res, client_side, client.peer)
            }
        };
        Ok(dress(&route, res, accepted, head_request))
    }
}

/// An answer that stands for the upstream's (the upstream's own, or a stored one) with the
/// route's response edits, compressed as the route and the client's `accepted` encoding say.
fn dress(
    route: &Route,
    mut res: Response<ProxyBody>,
    accepted: Option<Encoding>,
    head_request: bool,
) -> Response<ProxyBody> {
    apply_edits(res.headers_mut(), &route.response_headers);
    match &route.compression {
        Some(config) => compress(res, config, accepted, head_request),
        None => res,
    }
}

/// What answers in place of an upstream's failure: a feature's answer (a stale stored one),
/// or the failure.
fn in_place_of(
    error: ProxyError,
    keeps: admission::Keeps,
) -> Result<Response<ProxyBody>, ProxyError> {
    let answer = keeps.failed(&error).ok_or(error)?;
    let (res, body) = answer.render(AnswerEdits::default());
    Ok(res.map(|()| body.map_or_else(ProxyBody::empty, ProxyBody::full)))
}

/// Sends `req` to `upstream` in the background for `keeps` alone (a cache refreshing a stale
/// object it answered with, [`Outcome::Refresh`]): the answer goes through them and its body
/// is read to the end, so that they see it whole; a failure is theirs to note.
fn refresh(upstream: Upstream, req: Request<ProxyBody>, keeps: admission::Keeps) {
    tokio::spawn(async move {
        let res = match upstream.send(req).await {
            Ok(res) => kept(res, keeps),
            Err(e) => {
                drop(keeps.failed(&e));
                return;
            }
        };
        let mut body = res.into_body();
        while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut body).await {}
    });
}

/// The upstream's answer as the route's features keep it ([`admission::Keeps`]): its body
/// through their tees, or replaced by their answer (a revalidated stored object).
fn kept(res: Response<ProxyBody>, keeps: admission::Keeps) -> Response<ProxyBody> {
    if keeps.is_empty() {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    match keeps.answer(&mut parts) {
        admission::Outbound::Through(tees) => Response::from_parts(parts, body.teed(tees)),
        admission::Outbound::Replaced(answer) => {
            let (res, body) = answer.render(AnswerEdits::default());
            res.map(|()| body.map_or_else(ProxyBody::empty, ProxyBody::full))
        }
    }
}

impl<R: Routing, B: Into<RequestBody> + Send + 'static> tower_service::Service<Request<B>>
    for ProxyService<R>
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}

/// The own HTTP/2 transport hands each request to the one pipeline, as every transport does.
impl<R: Routing> sluice_server::h2own::Pipeline for ProxyService<R> {
    fn call(&self, req: Request<RequestBody>) -> sluice_server::h2own::Answering {
        let this = self.clone();
        Box::pin(async move { this.handle(req).await })
    }

    fn service_type(&self) -> std::any::TypeId {
        std::any::TypeId::of::<Self>()
    }
}

/// The host the client asked for: the URI authority (HTTP/2, absolute-form) or Host header,
/// lowercase, without the port. Borrowed unless it had to be lowercased.
fn request_host(req: &Request<RequestBody>) -> Option<Cow<'_, str>> {
    let raw = match req.uri().authority() {
        Some(a) => a.host(),
        None => req.headers().get(header::HOST)?.to_str().ok()?,
    };
    let host = strip_port(raw);
    Some(if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    })
}

/// The authority the client asked for, as [`request_host`] but with its port, if it named one
/// (a cache's key: another port is another origin).
fn request_authority(req: &Request<RequestBody>) -> Option<Cow<'_, str>> {
    let raw = match req.uri().authority() {
        Some(a) => a.as_str(),
        None => req.headers().get(header::HOST)?.to_str().ok()?,
    };
    // Without user info (`user@host`, which absolute-form may carry).
    let raw = raw.rsplit_once('@').map_or(raw, |(_, h)| h);
    Some(match raw.bytes().any(|b| b.is_ascii_uppercase()) {
        true => Cow::Owned(raw.to_ascii_lowercase()),
        false => Cow::Borrowed(raw),
    })
}

pub(crate) fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// The fields the proxy sets over any copy on a request's way upstream.
struct Stamps<'a> {
    /// The request's ID.
    id: Option<(&'a HeaderName, &'a HeaderValue)>,
    /// Its trace: `traceparent`, and the client's `tracestate` kept or removed with it.
    trace: Option<&'a RequestTrace>,
}

/// What the proxy does to a request on its way upstream besides the forwarding fields.
struct Edits<'a> {
    route: &'a Route,
    stamps: &'a Stamps<'a>,
    /// The most body bytes forwarded.
    limit: Option<u64>,
    /// The target the route's rewrite made, when it made one.
    target: Option<PathAndQuery>,
}

/// Turns the client's request into the one sent upstream: origin-form target (the rewritten
/// one, when the route rewrites), a Host header, hop-by-hop headers removed (but `Upgrade`
/// kept when `upgrade`), forwarding headers added, the route's edits applied, then the
/// request's ID and trace context set over any copy; its body counted against the limit.
fn upstream_request(
    req: Request<RequestBody>,
    client: &ClientInfo,
    edits: &Edits<'_>,
    upgrade: bool,
) -> Request<ProxyBody> {
    let (mut parts, body) = req.into_parts();
    if wants_trailers(&parts.headers) {
        // `TE` is hop-by-hop; an HTTP/2 upstream is told again (gRPC needs it).
        parts.extensions.insert(TrailersWanted);
    }
    if upgrade {
        strip_hop_by_hop_keep_upgrade(&mut parts.headers);
    } else {
        strip_hop_by_hop(&mut parts.headers);
    }
    if parts.version >= Version::HTTP_2 {
        // RFC 9113 §8.2.3, RFC 9114 §4.2.1: HTTP/2 and HTTP/3 may split Cookie into several
        // fields; HTTP/1.1 needs one.
        join_cookies(&mut parts.headers);
    }
    // HTTP/2 and absolute-form requests name the host in the target; HTTP/1.1 upstreams need
    // it in Host, and the target in origin form.
    let absolute = match parts.uri.authority() {
        Some(authority) => {
            if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
                parts.headers.insert(header::HOST, value);
            }
            true
        }
        None => false,
    };
    let fwd = Forwarding {
        client: client.peer,
        proto: if client.tls { "https" } else { "http" },
        host: parts.headers.get(header::HOST).cloned(),
        trusted: client.trusted,
    };
    add_forwarding(&mut parts.headers, &fwd);
    apply_edits(&mut parts.headers, &edits.route.request_headers);
    if let Some((name, value)) = edits.stamps.id {
        parts.headers.insert(name.clone(), value.clone());
    }
    if let Some(trace) = edits.stamps.trace {
        parts.headers.insert(TRACEPARENT, trace.traceparent.clone());
        if !trace.keeps_tracestate() {
            parts.headers.remove(TRACESTATE);
        }
    }
    if let Some(target) = &edits.target {
        parts.uri = Uri::from(target.clone());
    } else if absolute {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = Uri::try_from(path).unwrap_or_else(|_| Uri::from_static("/"));
    }
    parts.version = Version::HTTP_11;
    let body = ProxyBody::from_client_limited(body, client.body_timeout, edits.limit);
    Request::from_parts(parts, body)
}

/// A gRPC call's `grpc-timeout`, as a deadline for its response head that is shorter than the
/// cluster's response timeout when the call asks for less (then 504, told to the client as
/// DEADLINE_EXCEEDED). The field goes upstream too: the service bounds the rest of the call.
fn grpc_deadline(req: &mut Request<ProxyBody>) {
    if !grpc::is_grpc(req.headers()) {
        return;
    }
    let timeout = req
        .headers()
        .get(&grpc::GRPC_TIMEOUT)
        .and_then(|v| sluice_wire::grpc::timeout(v.as_bytes()));
    if let Some(at) = timeout.and_then(|t| std::time::Instant::now().checked_add(t)) {
        req.extensions_mut().insert(Deadline(at));
    }
}

/// What the access log and a trace keep of a request until its response body has ended.
struct Logged {
    method: http::Method,
    uri: Uri,
    version: Version,
    user_agent: Option<String>,
    referer: Option<String>,
    request_bytes: Option<u64>,
    request_id: Option<String>,
    started: Instant,
}

impl Logged {
    fn of(req: &Request<RequestBody>, started: Instant, id: Option<&HeaderValue>) -> Self {
        let text = |name| {
            let v = req.headers().get(name)?;
            v.to_str().ok().map(str::to_owned)
        };
        Self {
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            user_agent: text(header::USER_AGENT),
            referer: text(header::REFERER),
            request_bytes: http_body::Body::size_hint(req.body()).exact(),
            request_id: id.and_then(|v| v.to_str().ok()).map(str::to_owned),
            started,
        }
    }

    /// `res`, whose body has the `observers` record the request (its line, the `trace`'s
    /// spans) when it ends (NGINX's `$request_time` and `$body_bytes_sent`), or when it is
    /// dropped early.
    fn at_end(
        self,
        mut res: Response<ProxyBody>,
        client: std::net::SocketAddr,
        route: Option<Arc<Route>>,
        trace: Option<RequestTrace>,
        observers: Arc<Observers>,
    ) -> Response<ProxyBody> {
        let status = res.status().as_u16();
        let upstream = res
            .extensions_mut()
            .remove::<ServedBy>()
            .unwrap_or_default();
        let (parts, body) = res.into_parts();
        // The last `Cache-Status` member is this proxy's (an upstream's cache comes before).
        let cache_status = parts
            .headers
            .get_all(&crate::cache::CACHE_STATUS)
            .iter()
            .next_back();
        let cache_status = cache_status
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // hyper's server drops the body of an answer to `HEAD` unread: that is its end (the fast
        // path, which writes the head itself, counts it complete once the head is out).
        let head = self.method == http::Method::HEAD;
        let body = body.reported(Box::new(move |bytes, complete| {
            let complete = complete || head;
            let entry = access_log::Entry {
                client,
                method: &self.method,
                uri: &self.uri,
                version: self.version,
                status,
                bytes,
                complete,
                request_bytes: self.request_bytes,
                route: route.as_ref().map_or("-", |r| r.name.as_str()),
                elapsed: self.started.elapsed(),
                upstream: &upstream,
                user_agent: self.user_agent.as_deref(),
                referer: self.referer.as_deref(),
                request_id: self.request_id.as_deref(),
            };
            let cache = cache_status.as_deref();
            observers.record_answered(&entry, cache, route.as_deref(), trace.as_ref());
        }));
        Response::from_parts(parts, body)
    }
}

/// `res` compressed as the route's `config` and the client's `accepted` encoding decide, or
/// marked as varying with `Accept-Encoding` (see [`compression::decide`]).
#[cfg(feature = "compression")]
fn compress(
    mut res: Response<ProxyBody>,
    config: &Compression,
    accepted: Option<Encoding>,
    head_request: bool,
) -> Response<ProxyBody> {
    use compression::{Decision, ResponseFacts};
    let status = res.status().as_u16();
    let facts = ResponseFacts::of(status, head_request, res.headers());
    let decision = compression::decide(config, accepted, &facts);
    compression::apply(res.headers_mut(), decision);
    match decision {
        Decision::Compress { encoding, flush } => {
            res.map(|body| body.compressed(encoding, &config.levels, flush))
        }
        Decision::Vary | Decision::Leave => res,
    }
}

/// Built without the `compression` feature nothing is compressed (`Proxy::bind` refuses a
/// configuration that asks for it; a route built by hand is served as it comes).
#[cfg(not(feature = "compression"))]
fn compress(
    res: Response<ProxyBody>,
    _config: &Compression,
    _accepted: Option<Encoding>,
    _head_request: bool,
) -> Response<ProxyBody> {
    res
}

/// What the route's registered features made of a request ([`admit`]).
enum Admitted {
    /// On upstream, with what they keep of it.
    Pass(admission::Keeps),
    /// A feature's own answer (an allowed CORS preflight), dressed already.
    Own(Response<ProxyBody>),
    /// A feature's answer with a body (a cache's hit), which stands for the upstream's.
    Stored(Response<ProxyBody>),
    /// A stored answer, and the request goes upstream in the background with what the
    /// features keep of it (a cache's refresh).
    Refresh(Response<ProxyBody>, admission::Keeps),
}

/// Whether the route's registered features let the request through
/// ([`admission::admit`]: their hooks in order, as on every transport), refuse it, or answer
/// it themselves (an allowed CORS preflight, a cache's hit). The edits every answer gets are
/// left in `edits`.
async fn admit(
    route: &Route,
    req: &Request<RequestBody>,
    client: &ClientInfo,
    edits: &mut AnswerEdits,
) -> Result<Admitted, ProxyError> {
    if route.registered().is_empty() {
        return Ok(Admitted::Pass(admission::Keeps::default()));
    }
    let host = request_authority(req);
    let asked = Asked {
        method: req.method(),
        fields: req.headers(),
        client: client.peer.ip(),
        path: req.uri().path(),
        query: req.uri().query(),
        host: host.as_deref(),
        tls: client.tls,
    };
    let admission = admission::admit(route.registered(), &asked).await;
    match admission.outcome {
        Outcome::Pass => {
            *edits = admission.edits;
            Ok(Admitted::Pass(admission.keeps))
        }
        Outcome::Refused(e) => {
            *edits = admission.edits;
            Err(e)
        }
        Outcome::Refresh(answer) => {
            let (res, body) = answer.render(admission.edits);
            let res = res.map(|()| body.map_or_else(ProxyBody::empty, ProxyBody::full));
            Ok(Admitted::Refresh(res, admission.keeps))
        }
        Outcome::Answer(answer) => {
            let (res, body) = answer.render(admission.edits);
            Ok(match body {
                Some(body) => Admitted::Stored(res.map(|()| ProxyBody::full(body))),
                None => Admitted::Own(res.map(|()| ProxyBody::empty())),
            })
        }
    }
}

/// The route's fixed answer, for both paths (the route's response edits are applied after,
/// as to every answer); a redirect's `Location` names the request's host and path (`place`).
pub(crate) fn direct_response(
    direct: &Direct,
    place: &redirect::Place<'_>,
) -> Result<Response<Bytes>, ProxyError> {
    let mut res = Response::new(direct.body.clone());
    *res.status_mut() = direct.status;
    for (name, value) in &direct.headers {
        res.headers_mut().append(name.clone(), value.clone());
    }
    if let Some(template) = &direct.location {
        let location = redirect::location(template, place)?;
        res.headers_mut().insert(header::LOCATION, location);
    }
    Ok(res)
}

/// Upstream failures are what an operator must see at the default level, with the cluster
/// (a static cluster logs them itself, naming the endpoint too); client mistakes and capacity
/// refusals are routine and stay at debug.
fn log_failure(e: &ProxyError, client: &ClientInfo, route: Option<&Route>) {
    let status = e.status().as_u16();
    let upstream = route.and_then(|r| match &r.target {
        Target::Upstream(u) => Some(u),
        Target::Direct(_) => None,
    });
    match (e.origin(), upstream) {
        (Origin::Upstream, Some(Upstream::Static(_))) => {
            debug!(client.addr = %client.peer, error = %e, status, "upstream failed")
        }
        (Origin::Upstream, Some(Upstream::Reverse(s))) => {
            warn!(client.addr = %client.peer, cluster = %s.name(), slice = %s.slice(), error = %e, status, "upstream failed")
        }
        (Origin::Upstream, None) => {
            warn!(client.addr = %client.peer, error = %e, status, "upstream failed")
        }
        // The client's own limit (a gRPC call's `grpc-timeout`), not a refusal.
        (Origin::Client, _) if matches!(e, ProxyError::DeadlineExceeded) => {
            debug!(client.addr = %client.peer, status, "the request's own deadline passed before its response")
        }
        (Origin::Client | Origin::Internal, _) => {
            debug!(client.addr = %client.peer, error = %e, status, "request refused")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::strip_port;

    #[test]
    fn strip_port_handles_names_v4_and_v6() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("example.com"), "example.com");
        assert_eq!(strip_port("[::1]:8080"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
    }
}
