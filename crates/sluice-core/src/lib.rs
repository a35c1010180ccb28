//! The core every data path of Sluice renders, without I/O of its own: what a request may be
//! and where it goes is decided here, and the transports (the HTTP/1 fast path, hyper's
//! HTTP/1.1 and HTTP/2) only move its bytes.
//!
//! # Layout
//!
//! - `error`: [`ProxyError`], typed failures: where each came from
//!   ([`Origin`]), the status it maps to, and the one error answer both paths
//!   render.
//! - `body`: [`ProxyBody`], the single body type that flows through the proxy
//!   (a client's, limited and timed; an upstream's, guarded by its lease; compressed).
//! - Request rules: `checks` (what a request must be, body limits), `headers` (hop-by-hop
//!   stripping, forwarding fields, a route's edits), `rewrite` and `redirect` (a route's path
//!   and `Location`), `grpc` (gRPC's status answers and deadlines).
//! - Route features: `route_feature` ([`route_feature::RouteFeature`], a feature's phase
//!   hooks, and its registration; `sluice`'s `registry::REGISTERED` is the one list that
//!   builds them from configuration): `rate_limit`, `cors`, `basic_auth` (whose hashes run on the blocking
//!   pool); `admission`, which runs a route's hooks for every transport over a request's
//!   [`fields::Fields`]. `compression` (the decision; the encoder is `body`'s).
//! - Attempts: `read_ahead` (what is read before a response goes to the client) and `retry`
//!   (when a request goes out again, and the retry budget).
//! - Observability: `request_id`, `trace_context` (W3C trace context).
//! - [`ClientInfo`]: what is known of a request's client.
//!
//! Request normalisation is `sluice_wire::normalize`'s; the socket-level pieces are
//! `sluice-net`'s; the `sluice` crate puts the transports, the upstreams and the application
//! on top.

pub mod body;
pub mod error;

pub mod admission;
pub mod attempts;
pub mod basic_auth;
pub mod cache;
pub mod checks;
pub mod client;
pub mod compression;
pub mod cors;
pub mod fields;
pub mod grpc;
pub mod headers;
pub mod rate_limit;
pub mod read_ahead;
pub mod redirect;
pub mod request_id;
pub mod retry;
pub mod rewrite;
pub mod route_feature;
pub mod trace_context;

pub use body::ProxyBody;
pub use client::ClientInfo;
pub use error::{Origin, ProxyError};
