//! Sluice: a Layer-7 reverse proxy engine and a framework for building proxies.
//!
//! Build a whole proxy from a configuration with [`Proxy`], or assemble your own from the
//! parts: a [`Routing`] implementation (or the configured [`RouteTable`]) inside a
//! [`ProxyService`], wrapped in any tower `Layer`s as request/response hooks, served by one or
//! more [`Server`]s under a [`Group`]'s graceful shutdown. Clusters are handles: endpoints can
//! be added and removed at runtime while requests flow.
//!
//! # Layout
//!
//! - [`access_log`]: one line per request (Common Log Format or JSON) to stdout or a file.
//! - `admin`: the admin API (status, drain, endpoints, `/metrics`) for `sluice ctl`.
//! - [`app`]: [`Proxy`], a configuration turned into bound listeners, routes and clusters.
//! - [`standalone`]: [`Standalone`], `sluice acceptor`: the standalone acceptor with the
//!   admin API.
//! - [`server`]: listeners, TLS (rustls), HTTP/1.1 and HTTP/2 connections (hyper), idle
//!   timeouts, the HTTP/1 request-smuggling guard (`Content-Length` with `Transfer-Encoding`),
//!   graceful shutdown.
//! - `reload`: applying a re-read configuration in place when only routes and endpoints
//!   changed.
//! - `restart`: hot restart: a successor takes the listening sockets and idle sessions over
//!   the upgrade socket (`sluice-handoff` messages and fd passing).
//! - [`router`]: matching requests to routes (host, path prefix, method, headers, client CIDR).
//! - [`proxy`]: the tower `Service` that applies a route: forwarding headers, hop-by-hop
//!   stripping, header edits, direct responses, error statuses, and HTTP/1.1 Upgrade
//!   (WebSocket) bridging.
//! - [`upstream`]: clusters. [`upstream::static_cluster`] holds endpoints, keep-alive pools,
//!   load balancing, passive ejection and active health checks;
//!   [`upstream::reverse`] is the HTTP half of reverse clusters: the HTTP/1.1 client on
//!   registered sessions, the exchange on a leased one, and request/response buffering so
//!   slow clients do not hold sessions.
//! - [`options`]: the configuration converted into the options `sluice-reverse` and
//!   `sluice-relay` take (they do not know the TOML model).
//! - [`metrics`]: Prometheus metrics of requests, handshakes, sessions and queues.
//! - [`http`]: request checks and header rules shared by the proxy paths.
//! - [`body`]: the single body type that flows through the proxy.
//! - [`error`]: typed failures and the status each maps to.
//!
//! The reverse-session engine (the acceptor, slice pools and admission queues, leases,
//! hand-over, the standalone acceptor and its consumers) is the `sluice-reverse` crate, which
//! speaks no HTTP; the socket table, accept loops, shutdown signals, TLS configs and log tallies
//! both share are `sluice-net`. Configuration parsing lives in the `sluice-config` crate, the
//! session protocol codec in `sluice-session`, the fd-passing handoff protocol in
//! `sluice-handoff`, the service SDK in `sluice-sdk`; the `sluice` binary is in `sluice-cli`.

pub mod access_log;
pub(crate) mod admin;
pub mod app;
pub mod body;
pub mod error;
pub mod http;
pub mod metrics;
pub mod options;
mod process;
pub mod proxy;
pub(crate) mod reload;
pub(crate) mod restart;
pub mod router;
pub mod server;
pub mod standalone;
pub mod upstream;

pub use admin::{ReloadFuture, ReloadHook};
pub use app::{Proxy, StartError};
pub use body::ProxyBody;
pub use error::ProxyError;
pub use proxy::ProxyService;
pub use reload::{Applied, InPlace};
pub use restart::{Inherited, RestartError};
pub use router::{Matcher, RequestHead, Route, RouteTable, Routing, Target};
pub use server::{ClientInfo, Group, Server, Shutdown, ShutdownSignal};
pub use sluice_config as config;
pub use sluice_config::LbPolicy;
pub use standalone::Standalone;
pub use upstream::reverse::StandaloneAcceptor;
pub use upstream::{ReverseCluster, ReverseSlice, StaticCluster, StaticOptions, Upstream};
