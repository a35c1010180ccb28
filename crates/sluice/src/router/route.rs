//! What a router sees of a request ([`RequestHead`]), what it decides ([`Route`],
//! [`Target`]), and the trait a router implements ([`Routing`]).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use sluice_config::{Compression, HeaderEdits, LocationTemplate, Rewrite};

use crate::global_limit::GlobalLimit;
use crate::upstream::Upstream;
use sluice_core::admission::Admission;
use sluice_core::basic_auth::BasicAuth;
use sluice_core::cors::Cors;
use sluice_core::rate_limit::RateLimit;

/// What the router sees of a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The request target, normalised (see `sluice_wire::normalize`).
    pub uri: &'a Uri,
    /// The path routes match: the target's path with each segment's `;` parameters removed
    /// ([`sluice_wire::normalize::match_path`]), as Tomcat, Jetty and Spring read it, so that
    /// `/internal;x/a` meets a rule on `/internal/`. The upstream gets the target as it is.
    pub path: &'a str,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The host the client asked for, lowercase and without port (Host or :authority).
    pub host: Option<&'a str>,
    /// The client's address.
    pub client: SocketAddr,
}

/// Chooses the route of each request. `None` answers 404.
pub trait Routing: Send + Sync + 'static {
    /// Returns the route for this request, or `None` when nothing matches.
    fn route(&self, head: &RequestHead<'_>) -> Option<Arc<Route>>;

    /// Whether [`route`](Self::route) reads the request's headers now. When it does not, the
    /// HTTP/1 fast path passes an empty map instead of building one per request. The default
    /// says it does.
    fn reads_headers(&self) -> bool {
        true
    }
}

impl<R: Routing + ?Sized> Routing for Arc<R> {
    fn route(&self, head: &RequestHead<'_>) -> Option<Arc<Route>> {
        (**self).route(head)
    }

    fn reads_headers(&self) -> bool {
        (**self).reads_headers()
    }
}

/// Where a route sends requests and which headers it edits.
#[derive(Debug)]
pub struct Route {
    /// Name for logs.
    pub name: String,
    /// Proxy or answer directly.
    pub target: Target,
    /// The largest request body forwarded, over the listener's (see
    /// [`HttpOptions::max_request_body`](sluice_config::HttpOptions)); default: the listener's.
    pub max_request_body: Option<u64>,
    /// Requests per client (or key) over time ([`with_rate_limit`](Self::with_rate_limit));
    /// shared by the copies of a route a reload keeps.
    pub(crate) rate_limit: Option<Arc<RateLimit>>,
    /// A limit shared by every node, asked of a rate-limit service after `rate_limit`
    /// (`global_rate_limit` of a configured route; [`crate::global_limit`]).
    pub(crate) global_rate_limit: Option<Arc<GlobalLimit>>,
    /// The users who may use it ([`with_basic_auth`](Self::with_basic_auth)).
    pub(crate) basic_auth: Option<Arc<BasicAuth>>,
    /// Which web origins may call it ([`with_cors`](Self::with_cors)).
    pub(crate) cors: Option<Arc<Cors>>,
    /// How the path is rewritten before it goes upstream (or into a redirect's `{path}`);
    /// `None` (the default): not at all. Routes still match the path as sent.
    pub rewrite: Option<Rewrite>,
    /// How responses are compressed by the client's `Accept-Encoding`; default `None`:
    /// never.
    pub compression: Option<Compression>,
    /// Edits of the forwarded request's headers.
    pub request_headers: HeaderEdits,
    /// Edits of the response's headers (also applied to direct responses).
    pub response_headers: HeaderEdits,
}

impl Route {
    /// A route that forwards to `upstream`, without header edits.
    pub fn to_upstream(name: impl Into<String>, upstream: impl Into<Upstream>) -> Arc<Self> {
        Arc::new(Self::new(name, Target::Upstream(upstream.into())))
    }

    /// A route that answers `status` with a plain-text `body`.
    pub fn direct(
        name: impl Into<String>,
        status: StatusCode,
        body: impl Into<Bytes>,
    ) -> Arc<Self> {
        let headers = vec![(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        )];
        let target = Target::Direct(Direct {
            status,
            location: None,
            headers,
            body: body.into(),
        });
        Arc::new(Self::new(name, target))
    }

    /// Its admission features, in the order every transport applies them
    /// ([`Admission::admit`]).
    pub(crate) fn admission(&self) -> Admission<'_> {
        Admission {
            rate_limit: self.rate_limit.as_deref(),
            cors: self.cors.as_deref(),
            basic_auth: self.basic_auth.as_deref(),
        }
    }

    /// A route with this target and no header edits.
    pub fn new(name: impl Into<String>, target: Target) -> Self {
        Self {
            name: name.into(),
            target,
            max_request_body: None,
            rate_limit: None,
            global_rate_limit: None,
            basic_auth: None,
            cors: None,
            rewrite: None,
            compression: None,
            request_headers: HeaderEdits::default(),
            response_headers: HeaderEdits::default(),
        }
    }

    /// This route with a rate limit (`rate_limit` of a configured route): a request past it
    /// is answered 429 with `Retry-After`.
    pub fn with_rate_limit(mut self, limit: &sluice_config::RateLimit) -> Self {
        self.rate_limit = Some(Arc::new(RateLimit::new(limit)));
        self
    }

    /// This route for its `users` only (`basic_auth` of a configured route): a request
    /// without one's credentials is answered 401 with `WWW-Authenticate: Basic`.
    pub fn with_basic_auth(mut self, users: &sluice_config::BasicAuth) -> Self {
        self.basic_auth = Some(Arc::new(BasicAuth::new(users)));
        self
    }

    /// This route with a CORS policy (`cors` of a configured route): Sluice answers its
    /// preflights and puts the CORS fields on its answers.
    pub fn with_cors(mut self, cors: &sluice_config::Cors) -> Self {
        self.cors = Some(Arc::new(Cors::new(cors)));
        self
    }
}

/// A feature a route may carry, each named once here. [`Route::features`] says which a route
/// has; a transport states the ones it renders, and hands a request whose route has any other
/// to a transport that renders every feature (hyper's path): a feature added to [`Route`] is
/// enforced everywhere by default, never silently skipped (issue 49: "fails closed").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `max_request_body` of its own.
    BodyLimit,
    /// `rate_limit`.
    RateLimit,
    /// `global_rate_limit` (a call to a rate-limit service: hyper's path alone renders it).
    GlobalRateLimit,
    /// `basic_auth`.
    BasicAuth,
    /// `cors`.
    Cors,
    /// `rewrite`.
    Rewrite,
    /// `compression`.
    Compression,
    /// `request_headers` or `response_headers` edits of ordinary fields.
    HeaderEdits,
    /// Edits of the fields that frame a message or its connection (`Content-Length`,
    /// `Transfer-Encoding`, `Connection`, `Host`, `TE`, `Upgrade`).
    FramingEdits,
}

impl Feature {
    /// Every feature, for tests that must cover them all.
    pub const ALL: [Feature; 9] = [
        Feature::BodyLimit,
        Feature::RateLimit,
        Feature::GlobalRateLimit,
        Feature::BasicAuth,
        Feature::Cors,
        Feature::Rewrite,
        Feature::Compression,
        Feature::HeaderEdits,
        Feature::FramingEdits,
    ];

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// A set of [`Feature`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features(u16);

impl Features {
    /// The set of `list`.
    pub const fn of(list: &[Feature]) -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < list.len() {
            bits |= list[i].bit();
            i += 1;
        }
        Self(bits)
    }

    /// Whether `f` is in the set.
    pub const fn has(self, f: Feature) -> bool {
        self.0 & f.bit() != 0
    }

    /// The features of this set that `rendered` lacks: what a transport rendering
    /// `rendered` would skip.
    pub const fn beyond(self, rendered: Features) -> Features {
        Features(self.0 & !rendered.0)
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn with(self, f: Feature, on: bool) -> Self {
        match on {
            true => Self(self.0 | f.bit()),
            false => self,
        }
    }
}

impl Route {
    /// The features this route carries. Every field is named here, so a field added to
    /// [`Route`] does not compile until it says whether it is a feature (and a feature
    /// no transport has claimed is rendered by hyper's path alone).
    pub fn features(&self) -> Features {
        let Route {
            name: _,
            target: _,
            max_request_body,
            rate_limit,
            global_rate_limit,
            basic_auth,
            cors,
            rewrite,
            compression,
            request_headers,
            response_headers,
        } = self;
        let edits = |e: &HeaderEdits| !e.remove.is_empty() || !e.set.is_empty();
        let framing = edits_framing(request_headers) || edits_framing(response_headers);
        Features::default()
            .with(Feature::BodyLimit, max_request_body.is_some())
            .with(Feature::RateLimit, rate_limit.is_some())
            .with(Feature::GlobalRateLimit, global_rate_limit.is_some())
            .with(Feature::BasicAuth, basic_auth.is_some())
            .with(Feature::Cors, cors.is_some())
            .with(Feature::Rewrite, rewrite.is_some())
            .with(Feature::Compression, compression.is_some())
            .with(
                Feature::HeaderEdits,
                edits(request_headers) || edits(response_headers),
            )
            .with(Feature::FramingEdits, framing)
    }
}

/// Whether `edits` touch the fields that frame a message or its connection.
fn edits_framing(edits: &HeaderEdits) -> bool {
    use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TE, TRANSFER_ENCODING, UPGRADE};
    let framing = |n: &HeaderName| {
        [
            CONNECTION,
            CONTENT_LENGTH,
            HOST,
            TE,
            TRANSFER_ENCODING,
            UPGRADE,
        ]
        .contains(n)
    };
    edits.remove.iter().any(framing) || edits.set.iter().any(|(n, _)| framing(n))
}

/// What a route does with a request.
#[derive(Debug)]
pub enum Target {
    /// Forward to this cluster.
    Upstream(Upstream),
    /// Answer with a fixed response.
    Direct(Direct),
}

/// A fixed response (Envoy's direct_response, NGINX's `return`), or a redirect.
#[derive(Debug, Clone)]
pub struct Direct {
    /// The status code.
    pub status: StatusCode,
    /// A redirect's `Location`, filled in per request; `None`: not a redirect.
    pub location: Option<LocationTemplate>,
    /// Response headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body; `Bytes` so each response shares it instead of copying.
    pub body: Bytes,
}
