//! Sluice: a Layer-7 reverse proxy engine and a framework for building proxies.
//!
//! Build a whole proxy from a configuration with [`Proxy`], or assemble your own from the
//! parts: a [`Routing`] implementation (or the configured [`RouteTable`]) inside a
//! [`ProxyService`], wrapped in any tower `Layer`s as request/response hooks, served by one or
//! more [`Server`]s under a [`Group`]'s graceful shutdown. Clusters are handles: endpoints can
//! be added and removed at runtime while requests flow.
//!
//! What a framework user needs is re-exported at the crate's root; the modules themselves are
//! private, but for [`options`] (the configuration converted into the runtime crates' options):
//! - the app: [`Proxy`] (with [`Inherited`] for a hot restart, [`ReloadHook`] and [`InPlace`]
//!   for reloads), [`Standalone`] and [`StandaloneAcceptor`] (`sluice acceptor`), [`config`];
//! - listeners: [`Server`] (TLS by a rustls config or by [`Certificates`], HTTP settings from
//!   [`default_http_options`]), [`Group`], [`Shutdown`], [`os_signal`], [`HttpService`], and the
//!   HTTP/1 fast path a server may take from the proxy ([`FastPath`], [`FastHttp1`]);
//! - routes: [`Routing`], [`RouteTable`], [`Route`] (built with its `with_*` methods),
//!   [`Matcher`], [`RequestHead`], [`Target`], [`Direct`]; a route feature of one's own is a
//!   [`RouteFeature`] (its hooks, in [`route_feature`]), and what transports render of the
//!   built-in ones, [`Feature`];
//! - clusters: [`Upstream`], [`StaticCluster`] (its [`Endpoint`]s, [`StaticOptions`],
//!   [`StaticMetrics`], [`LbPolicy`], and for endpoint names that follow DNS [`Dns`] and
//!   [`FollowedName`]), [`ReverseCluster`] and [`ReverseSlice`], whose services
//!   dial in through an [`Acceptor`];
//! - the service: [`ProxyService`] (whose requests' bodies are any transport's: [`RequestBody`]),
//!   [`ProxyBody`], [`ProxyError`] and its [`Origin`],
//!   [`ClientInfo`], [`AccessLog`], [`Metrics`], [`RequestIds`], [`Tracing`].
//!
//! # Layout
//!
//! - `access_log`: one line per request (Common Log Format or JSON) to stdout or a file.
//! - `admin`: the admin API (status, drain, endpoints, `/metrics`) for `sluice ctl`.
//! - `otel`: [`Tracing`], each sampled request's spans exported over OTLP.
//! - `app`: [`Proxy`], a configuration turned into bound listeners, routes and clusters.
//! - `standalone`: [`Standalone`], `sluice acceptor`: the standalone acceptor with the admin
//!   API.
//! - `reload`: applying a re-read configuration in place when only routes and endpoints
//!   changed.
//! - `restart`: hot restart: a successor takes the listening sockets and idle sessions over
//!   the upgrade socket (`sluice-handoff` messages and fd passing).
//! - `router`: matching requests to routes (host, path prefix, method, headers, client CIDR).
//! - `proxy`: the tower `Service` that applies a route (header edits, direct responses, error
//!   answers, HTTP/1.1 Upgrade bridging), and `proxy::fast`, the HTTP/1.1 fast path.
//! - `upstream`: clusters, the `sluice-upstream` crate (below this one: it knows no routes or
//!   listeners). `upstream::static_cluster` holds endpoints, keep-alive pools, load
//!   balancing, passive ejection, active health checks and endpoint names that follow DNS
//!   (`follow`, looked up by `upstream::dns`); `upstream::reverse` is the HTTP
//!   half of reverse clusters: the HTTP/1.1 client on registered sessions, the exchange on a
//!   leased one, and request/response buffering so slow clients do not hold sessions.
//! - [`options`]: the configuration converted into the options `sluice-reverse` and
//!   `sluice-relay` take (they do not know the TOML model).
//! - `metrics`: Prometheus metrics of requests, handshakes, sessions and queues.
//!
//! The rules both data paths render, without I/O (request checks, forwarding and hop-by-hop
//! headers, rewrites and redirects, the route features' rules, read-ahead and retries), the
//! typed failures and the body type are the `sluice-core` crate. The client-facing transport —
//! listeners, TLS (rustls), HTTP/1.1 and HTTP/2 connections (hyper), the connection loop the
//! fast path plugs into, idle timeouts, the HTTP/1 request-smuggling guard, graceful
//! shutdown — is `sluice-server`, which knows nothing of routes or upstreams.
//!
//! The reverse-session engine (the acceptor, slice pools and admission queues, leases,
//! hand-over, the standalone acceptor and its consumers) is the `sluice-reverse` crate, which
//! speaks no HTTP; the socket table, accept loops, shutdown signals, TLS configs and log tallies
//! both share are `sluice-net`. Configuration parsing lives in the `sluice-config` crate, the
//! session protocol codec in `sluice-session`, the fd-passing handoff protocol in
//! `sluice-handoff`, the service SDK in `sluice-sdk`; the `sluice` binary is in `sluice-cli`.

// A build without the admin API (the `admin` feature off) leaves what only the API reads
// (the status it renders, `/routes`' edits) unused; the default build checks them all.
#![cfg_attr(not(feature = "admin"), allow(dead_code))]

pub(crate) mod access_log;
pub(crate) mod admin;
pub(crate) mod app;
pub(crate) mod cache;
pub(crate) mod global_limit;
pub(crate) mod metrics;
pub mod options;
#[cfg(feature = "otel")]
pub(crate) mod otel;
#[cfg(not(feature = "otel"))]
#[path = "otel/absent.rs"]
pub(crate) mod otel;
mod process;
pub(crate) mod proxy;
mod quic;
pub(crate) mod reload;
pub(crate) mod restart;
pub(crate) mod router;
pub(crate) mod standalone;

pub use access_log::AccessLog;
pub use admin::{ReloadFuture, ReloadHook};
pub use app::{Proxy, StartError};
pub use metrics::{Exposition, Metrics};
pub use otel::{Tracing, TracingError};
pub use proxy::fast::FastPath;
pub use proxy::ProxyService;
pub use reload::{Applied, InPlace};
pub use restart::{Inherited, RestartError};
pub use router::{
    Direct, Feature, Features, Matcher, RequestHead, Route, RouteTable, Routing, Target, Unbuilt,
};
/// The configuration a [`Proxy`] is built from — load or parse it, then [`Proxy::bind`] — and
/// the types a hand-built [`Route`] names ([`Route::with_rewrite`] and the rest). The whole
/// model is the `sluice-config` crate's; a framework user who builds routes in code needs no
/// more than this.
pub mod config {
    pub use sluice_config::{
        embedded_default, load_file, load_file_without_secrets, parse_str, BasicAuth, Compression,
        Config, ConfigError, Cors, CorsOrigins, Encoding, HeaderEdits, LocationTemplate,
        OriginMatch, RateLimit, RateLimitKey, Rewrite, DEFAULT_SLICE,
    };
}
pub use sluice_config::LbPolicy;
pub use sluice_core::body::{ProxyBody, RequestBody};
pub use sluice_core::error::{Origin, ProxyError};
pub use sluice_core::request_id::RequestIds;
pub use sluice_core::retry::RetryMetrics;
pub use sluice_core::route_feature::RouteFeature;

/// A route feature's hooks ([`RouteFeature`]) and what they see and decide; [`REGISTERED`](route_feature::REGISTERED)
/// lists Sluice's own, in the order their hooks run.
pub mod route_feature {
    pub use crate::router::registry::REGISTERED;
    pub use sluice_core::route_feature::*;
}
pub use sluice_server::fast::FastHttp1;
pub use sluice_server::tls::Certificates;
pub use sluice_server::{
    default_http_options, os_signal, ClientInfo, Group, HttpOptions, HttpService, Server, Shutdown,
    ShutdownSignal,
};
pub use sluice_upstream::dns::{Dns, LookupError, Resolved};
pub use sluice_upstream::reverse::{Acceptor, ReverseClusterOptions, StandaloneAcceptor};
pub use sluice_upstream::static_cluster::{Endpoint, FollowedName, StaticMetrics};
pub use sluice_upstream::{ReverseCluster, ReverseSlice, StaticCluster, StaticOptions, Upstream};
pub use standalone::Standalone;
