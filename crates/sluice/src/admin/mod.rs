//! The admin API (docs/design.md §6): JSON over HTTP on `[admin] listen`, for `sluice ctl` and
//! automation. Every request needs `Authorization: Bearer <token>` when `[admin] token` is set
//! (the configuration requires one off loopback).
//!
//! | method and path | what |
//! |---|---|
//! | `GET /healthz` | `200 ok` while the process serves |
//! | `GET /ready` | `200 ready` while the node takes traffic; `503` with `starting`, `draining` or `stopping` (for L4 balancers and Kubernetes readiness; no token needed) |
//! | `POST /drain` | drain the node: `/ready` turns 503 for good; requests and sessions carry on (a `preStop` before SIGTERM) |
//! | `GET /status` | listeners, acceptor, clusters: slices (idle, queued), instances (sessions, draining), static endpoints (health, ejection, load); a standalone acceptor's consumers (credit, sessions lent) |
//! | `POST /clusters/{cluster}/instances/{instance}/drain` | drain an instance and keep it out: its registrations are refused (410) until resumed |
//! | `POST /clusters/{cluster}/instances/{instance}/resume` | let a drained instance register again |
//! | `POST /reload` | re-read the configuration file and apply it (`sluice run`: a hot restart of the same binary, so no request fails; a file that does not load is 400 with its `file:line:col` error, and nothing changes) |
//! | `GET /routes` | the routes in match order |
//! | `POST /routes` `{"name", "hosts", "path_prefix", "methods", "client_cidr", "cluster", "slice", "position"}` | add a route (matched first by default), e.g. a client-CIDR slicing rule |
//! | `DELETE /routes/{name}` | remove a route |
//! | `POST /clusters/{cluster}/endpoints` `{"addr": "host:port"}` | add an endpoint to a static cluster (a name: each of its addresses, resolved now, as the configuration does) |
//! | `DELETE /clusters/{cluster}/endpoints/{addr}` | remove one (a name: each of its addresses) |
//! | `GET /metrics` | the Prometheus text format, or OpenMetrics when `Accept` prefers it ([`Metrics`]) |
//! | `POST /relays/{name}/pool` | `{"size": N}`: a relay's pool size, at runtime |
//! | `GET /openapi.json` | this API as OpenAPI 3 (`docs/admin-openapi.json`) |
//! | `GET /ui` | a live dashboard page that polls `/status` and `/metrics` (served without the token; it takes one from `#token=`) |
//!
//! Errors are `{"error": "<reason>"}` with 400 (bad input), 401 (token), 404 (no such
//! cluster, instance or endpoint) or 409 (the cluster is not of the kind the call needs).

#[cfg(feature = "admin")]
mod api;
mod state;

#[cfg(feature = "admin")]
pub(crate) use self::api::serve;
pub(crate) use self::state::AdminState;
pub use self::state::{ReloadFuture, ReloadHook};

/// Built without the `admin` feature there is no admin listener: `Proxy::bind` refuses
/// `[admin]` by name (`bind_admin`), so this is never given one.
#[cfg(not(feature = "admin"))]
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    _state: std::sync::Arc<AdminState>,
    _signal: sluice_server::ShutdownSignal,
) {
    drop(listener);
}
