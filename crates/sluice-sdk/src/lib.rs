//! Serve any hyper/tower HTTP service through Sluice by *dialing in*: the service opens
//! connections to the proxy's acceptor and registers each as a session (docs/design.md §3), so the
//! proxy never connects to it and each session is one unit of declared concurrency.
//!
//! [`serve`] keeps [`Options::capacity`] sessions registered, re-dials a replacement whenever
//! the proxy closes one or an upgrade (WebSocket) consumes one, backs off with jitter while the
//! acceptor is unreachable or busy, stops for good on 400/401/404, and on 410 (an operator
//! drained the instance; see [`Error::is_drained`]) waits, probing every
//! [`Options::drained_probe`] until the instance is resumed. [`Sessions`] changes the capacity at
//! runtime and drains gracefully. Each request carries the client's address as the proxy saw
//! it in its extensions ([`ClientAddr`]).
//!
//! An acceptor address that names many nodes — `dns:NAME:PORT` (every A/AAAA record,
//! re-resolved every [`Options::resolve_interval`]) or a list `a:7070,b:7070` — makes the
//! instance dial every node and split its capacity among them by their demand
//! (`protocol/README.md`, "Many nodes"): a control link to each node reports how much it is
//! asked for, surplus sessions are retired there (`RETIRE`) and dialed where the queue is,
//! and the sessions held everywhere never number more than the capacity.
//! [`Sessions::nodes`] lists them.
//!
//! ```no_run
//! use std::convert::Infallible;
//! use sluice_sdk::{serve, Acceptor, Identity, Options};
//!
//! # async fn run() -> Result<(), sluice_sdk::Error> {
//! let mut identity = Identity::new("hello");
//! identity.token = Some("s3cret".into());
//! // One acceptor; `Acceptor::parse("dns:sluice-acceptor:7070")?` would split among many.
//! let mut options = Options::new(Acceptor::Tcp("127.0.0.1:7070".into()), identity);
//! options.capacity = 8;
//! let service = tower::service_fn(|_req: http::Request<hyper::body::Incoming>| async {
//!     Ok::<_, Infallible>(http::Response::new(String::from("hello\n")))
//! });
//! let sessions = serve(options, service)?;
//! sessions.set_capacity(4); // four idle sessions close now (busy ones after their response)
//! tokio::signal::ctrl_c().await.ok();
//! sessions.shutdown().await // drain, then wait until the proxy has closed every session
//! # }
//! ```
//!
//! # HTTP/2 sessions: gRPC
//!
//! With [`Options::streams`] set to `Some(n)`, every session speaks HTTP/2 instead of HTTP/1.1
//! (`protocol/README.md`, "HTTP/2 sessions"): hyper's HTTP/2 server, allowing `n` streams at
//! once, of which the proxy leases one per request, so the instance takes `capacity × n`
//! requests at once. That is how a gRPC service dials in: a server tonic generates,
//! `XServer<T>`, is a [`SessionService`] as it is (several go in one
//! `tonic::service::Routes`). A shrink, a retirement and [`Sessions::shutdown`] close an
//! HTTP/2 session with `GOAWAY`: the proxy opens no stream on it after that, and those in
//! flight finish. An acceptor that does not take HTTP/2 sessions stops the slots with
//! [`Error::Http2Unsupported`].
//!
//! ```no_run
//! use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
//! use sluice_sdk::{serve, Acceptor, Identity, Options};
//! # use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService;
//! # use opentelemetry_proto::tonic::collector::trace::v1::*;
//! # struct Collector;
//! # #[tonic::async_trait]
//! # impl TraceService for Collector {
//! #     async fn export(&self, _: tonic::Request<ExportTraceServiceRequest>)
//! #         -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
//! #         Ok(tonic::Response::new(Default::default()))
//! #     }
//! # }
//!
//! # async fn run() -> Result<(), sluice_sdk::Error> {
//! let acceptor = Acceptor::Tcp("127.0.0.1:7070".into());
//! let mut options = Options::new(acceptor, Identity::new("traces"));
//! options.capacity = 2; // two connections,
//! options.streams = Some(50); // of 50 calls at once each
//! // Any tonic-generated server (here OTLP's trace collector), with no adapter.
//! let sessions = serve(options, TraceServiceServer::new(Collector))?;
//! tokio::signal::ctrl_c().await.ok();
//! sessions.shutdown().await
//! # }
//! ```
//!
//! # Layout
//! * [`options`]: [`Options`], [`Acceptor`], [`TlsOptions`], [`Backoff`].
//! * `resolve`: [`Resolver`], and the order nodes are listed in.
//! * `sessions`: the [`Sessions`] handle: resize, observe, shut down.
//! * `client`: [`ClientAddr`], the client's address in each request's extensions.
//! * `slot`: one task per session: dial, register, serve (HTTP/1.1 or HTTP/2), re-dial.
//! * `fleet`: many nodes: their control links, the split by demand, the node a slot dials.
//! * `dial`: TCP/UNIX/TLS connections and the registration and drain handshakes.
//! * `retire`: the service wrapper that answers `Connection: close` to retire a session.
//! * `report`: the log lines per instance: one per outage, not per slot per attempt.
//! * `state`: counters shared by the handle and the slots.

mod client;
mod dial;
mod error;
mod fleet;
pub mod options;
mod report;
mod resolve;
mod retire;
mod service;
mod sessions;
mod slot;
mod state;

pub use client::ClientAddr;
pub use error::Error;
pub use options::{Acceptor, Backoff, Options, TlsOptions};
pub use resolve::Resolver;
pub use service::{BoxError, SessionService};
pub use sessions::Sessions;
pub use sluice_session::Identity;
pub use state::{NodeStatus, Status};

/// Starts keeping `options.capacity` sessions registered, each serving HTTP/1.1 (with upgrades),
/// or HTTP/2 with [`Options::streams`], with a clone of `service`. Returns at once; sessions register in the background (watch
/// [`Sessions::subscribe`]). Fails only for invalid options or outside a Tokio runtime.
pub fn serve<S: SessionService>(options: Options, service: S) -> Result<Sessions, Error> {
    Sessions::start(options, service)
}
