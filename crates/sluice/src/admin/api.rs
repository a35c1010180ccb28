//! The admin API's routes and handlers (axum), over the [`AdminState`] the app builds: what
//! `mod.rs`'s table lists.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use sluice_config::admin::{
    AcceptorStatus, CertificateStatus, ClusterStatus, ConsumerSliceStatus, ConsumerStatus,
    EndpointStatus, InstanceDrain, InstanceStatus, ListenerStatus, NameStatus, RelayStatus,
    SliceStatus, Status,
};
use tokio::net::TcpListener;
use tracing::info;

use crate::metrics::Exposition;
use crate::router::{RouteError, RouteSpec};
use sluice_reverse::handoff::ConsumerView;
use sluice_server::ShutdownSignal;
use sluice_upstream::reverse::{BrokerView, SliceId};
use sluice_upstream::{ReverseCluster, StaticCluster, Upstream};

use super::state::AdminState;

/// The admin API's routes over `state`.
pub(crate) fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/drain", post(drain_node))
        .route("/resume", post(resume_node))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/ui", get(dashboard))
        .route(
            "/clusters/{cluster}/instances/{instance}/drain",
            post(drain),
        )
        .route(
            "/clusters/{cluster}/instances/{instance}/resume",
            post(resume),
        )
        .route("/reload", post(reload))
        .route("/openapi.json", get(openapi))
        .route("/routes", get(list_routes).post(add_route))
        .route("/routes/{name}", delete(remove_route))
        .route("/routes/{name}/cache/purge", post(purge_cache))
        .route("/clusters/{cluster}/endpoints", post(add_endpoint))
        .route("/relays/{name}/pool", post(set_relay_pool))
        .route(
            "/clusters/{cluster}/endpoints/{addr}",
            delete(remove_endpoint),
        )
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such admin resource; see GET /status",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            same_origin_only,
        ))
        .with_state(state)
}

/// Defends the API against DNS rebinding and cross-site requests from browsers: without a
/// token (loopback only), the `Host` must be a loopback name or address, so a page whose name
/// an attacker re-pointed at 127.0.0.1 cannot read or change anything; and a change (any
/// method but GET and HEAD) that carries an `Origin` must come from the API's own origin.
async fn same_origin_only(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Err(why) = one_reading(&req) {
        return error(StatusCode::BAD_REQUEST, why);
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    if state.token.is_none() && host.is_some_and(|h| !is_loopback_host(h)) {
        return error(
            StatusCode::FORBIDDEN,
            "without [admin] token only a loopback Host (127.0.0.1, [::1], localhost) is served",
        );
    }
    let changes = !matches!(*req.method(), http::Method::GET | http::Method::HEAD);
    if changes && state.read_only {
        return error(
            StatusCode::FORBIDDEN,
            "this admin API is read-only ([admin] read_only = true): set a token and read_only = false to change routing",
        );
    }
    if let Some(origin) = req.headers().get(header::ORIGIN).filter(|_| changes) {
        let own = host.is_some_and(|h| {
            origin == format!("http://{h}").as_str() || origin == format!("https://{h}").as_str()
        });
        if !own {
            return error(
                StatusCode::FORBIDDEN,
                "cross-origin change refused: Origin is not this admin API",
            );
        }
    }
    next.run(req).await
}

/// The Host and Origin rules above judge one value each, so a request must give exactly one
/// `Host`, at most one `Origin`, and an origin-form target (an absolute-form target names a
/// host of its own). Browsers send nothing else; anything else is refused before the rules,
/// so they have no edge to slip past.
fn one_reading(req: &axum::extract::Request) -> Result<(), &'static str> {
    let count = |name| req.headers().get_all(name).iter().count();
    if count(header::HOST) != 1 {
        return Err("exactly one Host header is required");
    }
    let printable = |v: &http::HeaderValue| v.as_bytes().iter().all(|b| b.is_ascii_graphic());
    if !req.headers().get(header::HOST).is_some_and(printable) {
        // A Host the loopback rule cannot read must not be a Host it skips.
        return Err("the Host header must be printable ASCII");
    }
    if count(header::ORIGIN) > 1 {
        return Err("more than one Origin header");
    }
    if req.uri().authority().is_some() || !req.uri().path().starts_with('/') {
        return Err("the admin API takes origin-form targets only (GET /status)");
    }
    Ok(())
}

/// `localhost`, `127.0.0.0/8` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let ip = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    ip.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Serves the admin API on `listener` until `signal` fires.
pub(crate) async fn serve(listener: TcpListener, state: Arc<AdminState>, signal: ShutdownSignal) {
    if let Ok(addr) = listener.local_addr() {
        info!(admin.addr = %addr, auth = state.token.is_some(), "admin API listening");
    }
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown(signal.wait())
        .await;
    if let Err(error) = served {
        tracing::warn!(%error, "the admin API stopped");
    }
}

/// A JSON error body with its status.
fn error(status: StatusCode, reason: &str) -> Response {
    (status, Json(json!({ "error": reason }))).into_response()
}

/// Passes when the request carries the admin token (or none is configured).
struct Authorized;

impl FromRequestParts<Arc<AdminState>> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AdminState>,
    ) -> Result<Self, Self::Rejection> {
        let Some(token) = &state.token else {
            return Ok(Authorized);
        };
        let given = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if token.matches(given.as_bytes()) {
            Ok(Authorized)
        } else {
            Err(error(
                StatusCode::UNAUTHORIZED,
                "missing or invalid bearer token",
            ))
        }
    }
}

async fn status(_: Authorized, State(state): State<Arc<AdminState>>) -> Response {
    // A standalone acceptor's consumers, read once: the loans they hold count in its slices.
    let consumers = state
        .consumers
        .as_ref()
        .map_or_else(Vec::new, BrokerView::consumers);
    let mut lent: BTreeMap<SliceId, usize> = BTreeMap::new();
    for (id, _, n) in consumers.iter().flat_map(|c| &c.slices) {
        *lent.entry(id.clone()).or_default() += n;
    }
    let clusters = state
        .clusters
        .iter()
        .map(|(name, u)| match u {
            Upstream::Reverse(s) => reverse_status(name, s.cluster(), &lent),
            Upstream::Static(c) => static_status(name, c),
        })
        .collect();
    Json(Status {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        node: state.readiness.state().as_str().to_owned(),
        uptime_seconds: state.started.elapsed().as_secs_f64(),
        listeners: state.listeners_now(),
        acceptor: state.acceptor.map(|addr| AcceptorStatus {
            addr: addr.to_string(),
        }),
        clusters,
        relays: state.relays.iter().map(relay_status).collect(),
        caches: cache_status(&state),
        consumers: consumer_status(consumers),
    })
    .into_response()
}

/// Every route's cache, in the routes' order.
fn cache_status(state: &AdminState) -> Vec<sluice_config::admin::CacheStatus> {
    let Some(routes) = &state.routes else {
        return Vec::new();
    };
    let cached = routes.list().into_iter().filter_map(|spec| {
        let route = routes.named(&spec.name)?;
        crate::cache::status(&spec.name, route.registered())
    });
    cached.collect()
}

fn consumer_status(consumers: Vec<ConsumerView>) -> Vec<ConsumerStatus> {
    let slice = |(id, credit, lent): (SliceId, u32, usize)| ConsumerSliceStatus {
        cluster: id.cluster,
        slice: id.slice,
        credit,
        lent: count(lent),
    };
    consumers
        .into_iter()
        .map(|c| ConsumerStatus {
            id: c.id,
            slices: c.slices.into_iter().map(slice).collect(),
        })
        .collect()
}

/// A reverse cluster's status; `lent`: the sessions a standalone acceptor lent to its
/// consumers, by slice (empty elsewhere).
fn reverse_status(
    name: &str,
    c: &ReverseCluster,
    lent: &BTreeMap<SliceId, usize>,
) -> ClusterStatus {
    let slices = c
        .slice_names()
        .into_iter()
        .map(|s| {
            let lent = lent.get(&SliceId::new(name, s.as_str())).copied();
            slice_status(c, s, lent.unwrap_or(0))
        })
        .collect();
    let registered = c.instances();
    let links = c.links().list();
    let declared = |id: &str| {
        links
            .iter()
            .find(|l| l.instance == id)
            .map(|l| l.capacity())
    };
    let mut instances: Vec<_> = registered
        .iter()
        .map(|i| InstanceStatus {
            // With one acceptor there is no control link: what its sessions declared.
            declared: declared(i.id()).or_else(|| i.declared()),
            draining: i.is_draining(),
            id: i.id().to_owned(),
            retiring: count(i.retiring()),
            sessions: count(i.sessions()),
            upgraded: count(i.upgraded()),
        })
        .collect();
    // A drained instance whose sessions have all closed stays listed until it is resumed.
    let gone = c
        .held()
        .into_iter()
        .filter(|h| !registered.iter().any(|i| i.id() == h));
    instances.extend(gone.map(|id| InstanceStatus {
        declared: None,
        draining: true,
        id,
        retiring: 0,
        sessions: 0,
        upgraded: 0,
    }));
    ClusterStatus::reverse(name, count(c.sessions()), slices, instances)
}

/// `200 ready` while the node serves; `503` and its state while it starts, drains or stops,
/// so that an L4 balancer or Kubernetes stops sending it clients. Served without the token,
/// as `/healthz` is: probes carry none.
/// `200 ready` while the node takes traffic and can serve it: past its start, not draining,
/// and every reverse cluster it routes to holds a session or its start-up window has passed
/// (a client-facing balancer that sent requests to a node no service has found yet would
/// get them held, then refused). The acceptor needs no readiness: see docs/kubernetes.
async fn ready(State(state): State<Arc<AdminState>>) -> Response {
    let node = state.readiness.state();
    if !state.readiness.is_ready() {
        let body = format!("{}\n", node.as_str());
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    let awaiting = state.clusters.iter().find_map(|(name, u)| match u {
        Upstream::Reverse(s) => s.cluster().awaiting_sessions().map(|left| (name, left)),
        Upstream::Static(_) => None,
    });
    match awaiting {
        Some((name, left)) => {
            let body = format!(
                "starting: no session of cluster {name} yet (ready when one registers, at most {:.1} s more)\n",
                left.as_secs_f64()
            );
            (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        }
        None => (StatusCode::OK, format!("{}\n", node.as_str())).into_response(),
    }
}

/// Drains the node: `/ready` turns 503 for good, so balancers stop sending clients; requests
/// and sessions carry on (a Kubernetes `preStop`, before the SIGTERM that stops it).
async fn drain_node(_: Authorized, State(state): State<Arc<AdminState>>) -> Response {
    state.readiness.drain();
    info!("node drained by the admin API: /ready answers 503");
    Json(json!({ "node": state.readiness.state().as_str() })).into_response()
}

/// Undoes `POST /drain`: `/ready` answers as before it (200 once sessions are here). 409 for a
/// node that is stopping, which nothing undoes.
async fn resume_node(_: Authorized, State(state): State<Arc<AdminState>>) -> Response {
    if state.readiness.state() == sluice_net::NodeState::Stopping {
        return error(
            StatusCode::CONFLICT,
            "the node is stopping: nothing resumes it",
        );
    }
    if state.readiness.resume() {
        info!("node resumed by the admin API: /ready answers as before the drain");
    }
    Json(json!({ "node": state.readiness.state().as_str() })).into_response()
}

impl AdminState {
    /// The listeners, with the certificates each serves now.
    fn listeners_now(&self) -> Vec<ListenerStatus> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()) as i64;
        let mut listeners = self.listeners.clone();
        for l in &mut listeners {
            let Some(certs) = self.certificates.get(&l.name) else {
                continue;
            };
            l.certificates = certs
                .listed()
                .into_iter()
                .map(|c| CertificateStatus {
                    days_left: c.not_after.map(|t| (t - now) as f64 / 86_400.0),
                    names: c.names,
                    not_after: c.not_after,
                })
                .collect();
        }
        listeners
    }
}

/// A slice's load here, and what this node asks its services for on their control links.
/// `lent`: its sessions a standalone acceptor lent to consumers (NGINX workers, Sluice
/// processes), which are its instances' still and count in `sessions`.
fn slice_status(c: &ReverseCluster, name: String, lent: usize) -> SliceStatus {
    let load = c.load(&name);
    let (asks_for, why) = match (load.queued, load.sessions) {
        (0, 0) if lent > 0 => (0, format!("none here; {lent} lent to consumers")),
        (0, 0) => (0, "no requests and no sessions".to_owned()),
        (0, _) if lent > 0 => (
            0,
            format!("its sessions serve what comes; {lent} lent to consumers"),
        ),
        (0, _) => (0, "its sessions serve what comes".to_owned()),
        (q, 0) => (
            count(q),
            format!("{q} requests wait and no session is registered"),
        ),
        (q, _) => (count(q), format!("{q} requests wait for a session")),
    };
    SliceStatus {
        asks_for,
        idle: count(c.idle_sessions(&name)),
        in_flight: count(load.in_flight),
        oldest_wait_ms: u64::try_from(c.oldest_wait(&name).as_millis()).unwrap_or(u64::MAX),
        queued: count(load.queued),
        sessions: count(load.sessions + lent),
        why,
        name,
    }
}

/// Each endpoint's health (the active check's verdict; always true without checks), its
/// ejection (milliseconds left, failed connects in a row, ejections so far) and its load.
fn static_status(name: &str, c: &StaticCluster) -> ClusterStatus {
    let endpoints = c
        .endpoints()
        .iter()
        .map(|e| EndpointStatus {
            addr: e.addr().to_string(),
            connect_failures: u64::from(e.connect_failures()),
            ejected_ms: u64::try_from(c.ejected_for(e).as_millis()).unwrap_or(u64::MAX),
            ejections: e.ejections(),
            healthy: e.is_healthy(),
            idle_connections: count(e.idle_connections()),
            in_flight: count(e.in_flight()),
        })
        .collect();
    let mut status = ClusterStatus::static_cluster(name, c.has_health_check(), endpoints);
    let names = c.followed_names();
    if !names.is_empty() {
        status.names = Some(names.iter().map(name_status).collect());
    }
    status
}

/// A followed endpoint name: its addresses and lookups.
fn name_status(n: &sluice_upstream::static_cluster::FollowedName) -> NameStatus {
    NameStatus {
        name: n.name.clone(),
        addrs: n.addrs.iter().map(ToString::to_string).collect(),
        failures: u64::from(n.failures),
        last_error: n.last_error.clone(),
        next_in_ms: u64::try_from(n.next_in.as_millis()).unwrap_or(u64::MAX),
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// One relay in `/status`: its counters (`connect_ms_avg`: the mean connect to the next hop).
fn relay_status(r: &sluice_relay::RelayHandle) -> RelayStatus {
    let s = r.stats.snapshot();
    RelayStatus {
        name: r.name.clone(),
        addr: r.addr.to_string(),
        active: s.active,
        accepted: s.accepted,
        refused: s.refused,
        pool_idle: s.pool_idle,
        pool_misses: s.pool_misses,
        pool_dead: s.pool_dead,
        early_connects: s.early,
        bytes_up: s.bytes_up,
        bytes_down: s.bytes_down,
        connects: s.connects,
        connect_ms_avg: (s.connect_micros as f64 / 1e3) / (s.connects.max(1) as f64),
        next_hop: r.next_hop().map(|n| NameStatus {
            name: n.name,
            addrs: n.addrs.iter().map(ToString::to_string).collect(),
            failures: u64::from(n.failures),
            last_error: n.last_error,
            next_in_ms: u64::try_from(n.next_in.as_millis()).unwrap_or(u64::MAX),
        }),
        sockmap: r.sockmap(),
        kernel_spliced: s.kernel_spliced,
        bytes_kernel: s.bytes_kernel,
    }
}

/// `/metrics` in the format the scraper's `Accept` asks for: OpenMetrics to Prometheus (which
/// asks for it first), the Prometheus text format to anything else.
async fn metrics(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Exposition::negotiate(accept);
    let body = state.metrics.render_as(format);
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::VARY, "Accept"),
        ],
        body,
    )
        .into_response()
}

async fn drain(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    Path((cluster, instance)): Path<(String, String)>,
) -> Response {
    let Some(Upstream::Reverse(slice)) = state.clusters.get(&cluster) else {
        return cluster_error(&state, &cluster, "reverse");
    };
    if !slice.cluster().drain_and_hold(&instance) {
        let reason = format!("cluster {cluster:?} has no instance {instance:?}");
        return error(StatusCode::NOT_FOUND, &reason);
    }
    Json(InstanceDrain {
        cluster,
        draining: true,
        instance,
    })
    .into_response()
}

async fn resume(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    Path((cluster, instance)): Path<(String, String)>,
) -> Response {
    let Some(Upstream::Reverse(slice)) = state.clusters.get(&cluster) else {
        return cluster_error(&state, &cluster, "reverse");
    };
    if !slice.cluster().resume(&instance) {
        let reason = format!("instance {instance:?} of cluster {cluster:?} is not drained");
        return error(StatusCode::NOT_FOUND, &reason);
    }
    Json(InstanceDrain {
        cluster,
        draining: false,
        instance,
    })
    .into_response()
}

#[derive(Deserialize)]
struct EndpointBody {
    addr: String,
}

/// `POST /relays/{name}/pool`'s body.
#[derive(Debug, serde::Deserialize)]
struct PoolBody {
    size: usize,
}

/// Changes a relay's pool size at runtime (a relay configured with `pool > 0`).
async fn set_relay_pool(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    body: Result<Json<PoolBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Some(relay) = state.relays.iter().find(|r| r.name == name) else {
        return error(StatusCode::NOT_FOUND, &format!("no relay named {name:?}"));
    };
    let Ok(Json(body)) = body else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected a JSON body {\"size\": N}",
        );
    };
    if body.size > 4096 || !relay.set_pool(body.size) {
        let reason = format!("relay {name:?} has no pool (configure `pool`), or size > 4096");
        return error(StatusCode::CONFLICT, &reason);
    }
    Json(json!({ "relay": name, "pool": body.size })).into_response()
}

async fn add_endpoint(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    Path(cluster): Path<String>,
    body: Result<Json<EndpointBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Some(Upstream::Static(c)) = state.clusters.get(&cluster) else {
        return cluster_error(&state, &cluster, "static");
    };
    let Ok(Json(body)) = body else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected a JSON body {\"addr\": \"host:port\"}",
        );
    };
    let addrs = match resolve(&body.addr).await {
        Ok(addrs) => addrs,
        Err(reason) => return error(StatusCode::BAD_REQUEST, &reason),
    };
    let added = addrs.iter().fold(false, |any, a| c.add_endpoint(*a) | any);
    let status = if added {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let body = json!({ "cluster": cluster, "addr": body.addr, "addrs": addrs, "added": added });
    (status, Json(body)).into_response()
}

async fn remove_endpoint(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    Path((cluster, addr)): Path<(String, String)>,
) -> Response {
    let Some(Upstream::Static(c)) = state.clusters.get(&cluster) else {
        return cluster_error(&state, &cluster, "static");
    };
    let addrs = match resolve(&addr).await {
        Ok(addrs) => addrs,
        Err(reason) => return error(StatusCode::BAD_REQUEST, &reason),
    };
    let removed = addrs
        .iter()
        .fold(false, |any, a| c.remove_endpoint(*a) | any);
    if !removed {
        let reason = format!("cluster {cluster:?} has no endpoint {addr}");
        return error(StatusCode::NOT_FOUND, &reason);
    }
    Json(json!({ "cluster": cluster, "addr": addr, "addrs": addrs, "removed": true }))
        .into_response()
}

/// An endpoint as the configuration takes it: `IP:port`, or `host:port` resolved now (every
/// address of the name), off the async threads since the system resolver blocks.
async fn resolve(text: &str) -> Result<Vec<SocketAddr>, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let text = text.to_owned();
    tokio::task::spawn_blocking(move || sluice_config::resolve_endpoint(&text))
        .await
        .map_err(|e| format!("resolving the endpoint failed: {e}"))?
}

/// 404 for an unknown cluster, 409 for one of the other kind.
fn cluster_error(state: &AdminState, cluster: &str, kind: &str) -> Response {
    if state.clusters.contains_key(cluster) {
        let reason = format!("cluster {cluster:?} is not a {kind} cluster");
        error(StatusCode::CONFLICT, &reason)
    } else {
        error(StatusCode::NOT_FOUND, &format!("no cluster {cluster:?}"))
    }
}

/// 404 where a proxy's routes cannot change (an admin API without [`AdminState::with_routes`]).
fn no_routes() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "this proxy's routes are not changeable",
    )
}

async fn list_routes(_: Authorized, State(state): State<Arc<AdminState>>) -> Response {
    match &state.routes {
        Some(routes) => Json(json!({ "routes": routes.list() })).into_response(),
        None => no_routes(),
    }
}

/// `POST /routes`: a [`RouteSpec`] and where it goes (`position`: 0 is matched first, the
/// default; larger than the count appends).
async fn add_route(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    body: Result<Json<serde_json::Value>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Some(routes) = &state.routes else {
        return no_routes();
    };
    let (route, position) = match body.map_err(|e| e.to_string()).and_then(parse_route) {
        Ok(parsed) => parsed,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("expected a route as JSON: {e}"),
            )
        }
    };
    let name = route.name.clone();
    match routes.add(route, position) {
        Ok(()) => (StatusCode::CREATED, Json(json!({ "added": name }))).into_response(),
        Err(e) => route_error(&e),
    }
}

/// The body of `POST /routes`: the route's fields (unknown ones refused) and `position`.
fn parse_route(Json(mut body): Json<serde_json::Value>) -> Result<(RouteSpec, usize), String> {
    let position = match body.as_object_mut().and_then(|o| o.remove("position")) {
        None => 0,
        Some(p) => p
            .as_u64()
            .and_then(|p| usize::try_from(p).ok())
            .ok_or("position must be a whole number")?,
    };
    let route = serde_json::from_value(body).map_err(|e| e.to_string())?;
    Ok((route, position))
}

async fn remove_route(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Response {
    let Some(routes) = &state.routes else {
        return no_routes();
    };
    match routes.remove(&name) {
        Ok(spec) => Json(json!({ "removed": spec })).into_response(),
        Err(e) => route_error(&e),
    }
}

/// `POST /routes/{name}/cache/purge`: `{"key": "https://host/path?query"}` removes one key
/// (with its variants), `{"prefix": "https://host/img/"}` every key that starts with it.
async fn purge_cache(
    _: Authorized,
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    body: Result<Json<serde_json::Value>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Some(routes) = &state.routes else {
        return no_routes();
    };
    let what = match body.map_err(|e| e.to_string()).and_then(parse_purge) {
        Ok(what) => what,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let Some(route) = routes.named(&name) else {
        return error(StatusCode::NOT_FOUND, &format!("no route {name:?}"));
    };
    match crate::cache::purge(route.registered(), &what) {
        Some(purged) => Json(json!({ "route": name, "purged": purged })).into_response(),
        None => error(
            StatusCode::CONFLICT,
            &format!("route {name:?} has no cache (its `cache` is off)"),
        ),
    }
}

/// The body of a purge: exactly one of `key` and `prefix`, a non-empty string.
fn parse_purge(Json(body): Json<serde_json::Value>) -> Result<crate::cache::Purge, String> {
    use crate::cache::Purge;
    let expected =
        "expected {\"key\": \"https://host/path?query\"} or {\"prefix\": \"https://host/path\"}";
    let object = body.as_object().filter(|o| o.len() == 1).ok_or(expected)?;
    let text = |v: &serde_json::Value| {
        v.as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .ok_or(expected)
    };
    match object.iter().next() {
        Some((k, v)) if k == "key" => Ok(Purge::Key(text(v)?)),
        Some((k, v)) if k == "prefix" => Ok(Purge::Prefix(text(v)?)),
        _ => Err(expected.to_owned()),
    }
}

fn route_error(e: &RouteError) -> Response {
    let status = match e {
        RouteError::Invalid(_) => StatusCode::BAD_REQUEST,
        RouteError::NotFound(_) => StatusCode::NOT_FOUND,
        RouteError::Exists(_) => StatusCode::CONFLICT,
    };
    error(status, &e.to_string())
}

/// The live dashboard: one static page, embedded at build time, that polls `/status` and
/// `/metrics` with the token from its URL fragment. Served without auth as it holds no data;
/// the policy keeps it to its own origin.
async fn dashboard() -> Response {
    let csp = "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; \
               style-src 'unsafe-inline'; frame-ancestors 'none'";
    let page = axum::response::Html(include_str!("dashboard.html"));
    ([(header::CONTENT_SECURITY_POLICY, csp)], page).into_response()
}

async fn reload(_: Authorized, State(state): State<Arc<AdminState>>) -> Response {
    let Some(hook) = &state.reload else {
        let reason =
            "reload is not available here: `sluice run` with `[runtime] upgrade_socket` reloads";
        return error(StatusCode::CONFLICT, reason);
    };
    match hook.run().await {
        Ok(done) => Json(json!({ "reloaded": true, "message": done })).into_response(),
        Err(reason) => error(StatusCode::BAD_REQUEST, &reason),
    }
}

/// The API's OpenAPI 3 description (`docs/admin-openapi.json`, checked in).
async fn openapi() -> Response {
    let doc = include_str!("../../../../docs/admin-openapi.json");
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}
