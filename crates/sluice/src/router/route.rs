//! What a router sees of a request ([`RequestHead`]), what it decides ([`Route`],
//! [`Target`]), and the trait a router implements ([`Routing`]).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use sluice_config::{Compression, HeaderEdits, LocationTemplate, Rewrite};

use sluice_core::route_feature::{Hooks, RouteFeature};
use sluice_upstream::Upstream;

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
    pub(crate) max_request_body: Option<u64>,
    /// Its registered features ([`RouteFeature`]: a rate limit, CORS, basic auth, or a
    /// framework user's own), whose hooks every transport runs in this order
    /// ([`with_feature`](Self::with_feature)).
    pub(crate) registered: Vec<Arc<dyn RouteFeature>>,
    /// How the path is rewritten before it goes upstream (or into a redirect's `{path}`);
    /// `None` (the default): not at all. Routes still match the path as sent.
    pub(crate) rewrite: Option<Rewrite>,
    /// How responses are compressed by the client's `Accept-Encoding`; default `None`:
    /// never.
    pub(crate) compression: Option<Compression>,
    /// Edits of the forwarded request's headers.
    pub(crate) request_headers: HeaderEdits,
    /// Edits of the response's headers (also applied to direct responses).
    pub(crate) response_headers: HeaderEdits,
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

    /// A route with this target and no header edits.
    pub fn new(name: impl Into<String>, target: Target) -> Self {
        Self {
            name: name.into(),
            target,
            max_request_body: None,
            registered: Vec::new(),
            rewrite: None,
            compression: None,
            request_headers: HeaderEdits::default(),
            response_headers: HeaderEdits::default(),
        }
    }

    /// This route with a feature of its own (run after those it has): a configured route's
    /// `rate_limit`, `cors` or `basic_auth` (`sluice_core::{rate_limit, cors,
    /// basic_auth}`), or any [`RouteFeature`] of a framework user's.
    pub fn with_feature(mut self, feature: Arc<dyn RouteFeature>) -> Self {
        self.registered.push(feature);
        self
    }

    /// This route with a largest request body of its own, over the listener's.
    pub fn with_max_request_body(mut self, bytes: u64) -> Self {
        self.max_request_body = Some(bytes);
        self
    }

    /// This route with a path rewrite: what goes upstream (or into a redirect's `{path}`);
    /// routes still match the path as sent.
    pub fn with_rewrite(mut self, rewrite: Rewrite) -> Self {
        self.rewrite = Some(rewrite);
        self
    }

    /// This route compressing its responses by the client's `Accept-Encoding`.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = Some(compression);
        self
    }

    /// This route with edits of the forwarded request's fields.
    pub fn with_request_headers(mut self, edits: HeaderEdits) -> Self {
        self.request_headers = edits;
        self
    }

    /// This route with edits of its answers' fields (its own answers' too).
    pub fn with_response_headers(mut self, edits: HeaderEdits) -> Self {
        self.response_headers = edits;
        self
    }

    /// Its registered features, in the order their hooks run.
    pub fn registered(&self) -> &[Arc<dyn RouteFeature>] {
        &self.registered
    }

    /// The hooks its registered features use: a transport serves the route only when it
    /// drives them all ([`Hooks::within`]).
    pub fn hooks(&self) -> Hooks {
        (self.registered.iter()).fold(Hooks::NONE, |all, f| all.and(f.hooks()))
    }
}

/// A built-in feature of a route — how it rewrites, compresses, edits and limits what it
/// forwards — each named once here ([`Route::features`] says which a route has). The features
/// that only admit, refuse, answer or dress a request are registered instead
/// ([`RouteFeature`], [`Route::hooks`]). A transport states the built-in features it renders
/// and the hooks it drives, and hands a request whose route has any other to a transport that
/// renders everything (hyper's path): a feature added is enforced everywhere by default, never
/// silently skipped (issue 49: "fails closed").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `max_request_body` of its own.
    BodyLimit,
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
    pub const ALL: [Feature; 5] = [
        Feature::BodyLimit,
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
            // Registered features say what they need by their hooks (`Route::hooks`).
            registered: _,
            rewrite,
            compression,
            request_headers,
            response_headers,
        } = self;
        let edits = |e: &HeaderEdits| !e.remove.is_empty() || !e.set.is_empty();
        let framing = edits_framing(request_headers) || edits_framing(response_headers);
        Features::default()
            .with(Feature::BodyLimit, max_request_body.is_some())
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
