//! What a router sees of a request ([`RequestHead`]), what it decides ([`Route`],
//! [`Target`]), and the trait a router implements ([`Routing`]).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use sluice_config::{Compression, HeaderEdits, LocationTemplate, Rewrite};

use crate::http::basic_auth::BasicAuth;
use crate::http::cors::Cors;
use crate::http::rate_limit::RateLimit;
use crate::upstream::Upstream;

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

    /// A route with this target and no header edits.
    pub fn new(name: impl Into<String>, target: Target) -> Self {
        Self {
            name: name.into(),
            target,
            max_request_body: None,
            rate_limit: None,
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
