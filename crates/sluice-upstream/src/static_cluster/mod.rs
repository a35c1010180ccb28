//! Static clusters: listening endpoints reached over pooled keep-alive HTTP/1.1 connections.
//!
//! A request picks an endpoint by the cluster's [`LbPolicy`], takes the most recently used
//! idle connection to it (or connects), and gives the connection back when the response body
//! has been read to the end. An endpoint whose connect fails is ejected for a backoff and the
//! request moves on to another endpoint (the request was not sent, so any method may move).

mod endpoint;
mod follow;
mod h2;
mod health;
mod lb;
mod metrics;
mod pool;
pub mod raw;
mod refresh;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Request, Response};
use tokio::time::Instant;
use tracing::debug;

pub use endpoint::Endpoint;
pub use follow::FollowedName;
pub use metrics::StaticMetrics;
pub(crate) use sluice_config::HealthCheck;
pub use sluice_config::StaticOptions;

use self::follow::Follow;
use self::lb::Balancer;
use self::metrics::ConnectCounters;
use self::pool::Conn;
use crate::connect::{connect, connect_http1, Connected};
use crate::dns::Dns;
use crate::tls::UpstreamTls;
use sluice_config::UpstreamProtocol;
use sluice_core::body::ProxyBody;
use sluice_core::error::ProxyError;
use sluice_core::retry::{Policy, RetryMetrics};

mod send;

/// Connect attempts per request: a dead endpoint costs a request at most this many connects.
const MAX_CONNECT_ATTEMPTS: usize = 3;

/// A handle to a static cluster. Clones share the cluster; endpoints can be added and removed
/// at runtime through any clone while requests are flowing.
#[derive(Debug, Clone)]
pub struct StaticCluster {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    opts: Arc<StaticOptions>,
    endpoints: ArcSwap<Vec<Arc<Endpoint>>>,
    balancer: Balancer,
    /// The zero of the millisecond clock used for ejection deadlines.
    epoch: Instant,
    /// Whether the idle reaper and health checks run (they start inside a Tokio runtime).
    tasks_started: AtomicBool,
    /// Where new connections are counted.
    connects: ConnectCounters,
    /// Where endpoints count their responses (each added endpoint gets its series).
    metrics: StaticMetrics,
    /// HTTPS to the endpoints (`opts.tls`, built).
    tls: Option<UpstreamTls>,
    /// `opts.retry`, when it allows retries.
    retry: Option<Arc<Policy>>,
    /// The endpoint names that follow DNS (`opts.resolve`), if any.
    follow: Option<Follow>,
}

impl StaticCluster {
    /// A cluster with these endpoints. Background tasks (idle reaping, health checks) start on
    /// first use inside a Tokio runtime. Fails only for `opts.tls` that rustls refuses (or no
    /// trust anchors: no `ca` and no system roots).
    pub fn new(
        name: impl Into<String>,
        endpoints: impl IntoIterator<Item = SocketAddr>,
        opts: StaticOptions,
    ) -> std::io::Result<Self> {
        Self::with_metrics(name, endpoints, opts, &StaticMetrics::default())
    }

    /// Builds the cluster a validated config describes, counting its connects in `metrics`
    /// and its retries in `retries`. Names that follow DNS (`resolve`) are looked up with
    /// `dns` once [`resolve_now`](Self::resolve_now) or [`start`](Self::start) runs.
    pub fn from_config(
        name: &str,
        cfg: &sluice_config::StaticCluster,
        (metrics, retries): (&StaticMetrics, &RetryMetrics),
        dns: &Dns,
    ) -> std::io::Result<Self> {
        let endpoints = cfg.endpoints.iter().copied();
        let mut cluster = Self::build(name, endpoints, cfg.options.clone(), metrics, retries)?;
        if let (Some(bounds), false) = (cfg.options.resolve, cfg.names.is_empty()) {
            let follow = Follow::new(name, &cfg.names, (dns.clone(), bounds), metrics);
            let inner = Arc::get_mut(&mut cluster.inner).ok_or_else(|| {
                std::io::Error::other("a cluster being built has no other handle")
            })?;
            inner.follow = Some(follow);
        }
        Ok(cluster)
    }

    /// As [`new`](Self::new), counting new connections in `metrics`.
    pub fn with_metrics(
        name: impl Into<String>,
        endpoints: impl IntoIterator<Item = SocketAddr>,
        opts: StaticOptions,
        metrics: &StaticMetrics,
    ) -> std::io::Result<Self> {
        Self::build(name, endpoints, opts, metrics, &RetryMetrics::default())
    }

    fn build(
        name: impl Into<String>,
        endpoints: impl IntoIterator<Item = SocketAddr>,
        opts: StaticOptions,
        metrics: &StaticMetrics,
        retries: &RetryMetrics,
    ) -> std::io::Result<Self> {
        let name = name.into();
        let tls = opts
            .tls
            .as_ref()
            .map(|t| UpstreamTls::new(&name, t, opts.protocol))
            .transpose()?;
        let mut list: Vec<Arc<Endpoint>> = Vec::new();
        for addr in endpoints {
            if !list.iter().any(|e| e.addr() == addr) {
                let counted = metrics.endpoint(&name, addr);
                list.push(Arc::new(Endpoint::with_metrics(addr, counted)));
            }
        }
        let inner = Inner {
            retry: Policy::new(&name, &opts.retry, retries),
            tls,
            balancer: Balancer::new(opts.lb),
            opts: Arc::new(opts),
            endpoints: ArcSwap::from_pointee(list),
            epoch: Instant::now(),
            tasks_started: AtomicBool::new(false),
            connects: metrics.cluster(&name),
            metrics: metrics.clone(),
            name,
            follow: None,
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The current endpoints.
    pub fn endpoints(&self) -> Vec<Arc<Endpoint>> {
        self.inner.endpoints.load().as_ref().clone()
    }

    /// How much longer `endpoint` sits out after failed connects (zero: it is not ejected).
    pub fn ejected_for(&self, endpoint: &Endpoint) -> Duration {
        let left = endpoint
            .ejected_until_ms()
            .saturating_sub(self.inner.now_ms());
        Duration::from_millis(left)
    }

    /// Whether active health checks run for this cluster (else every endpoint is healthy).
    pub fn has_health_check(&self) -> bool {
        self.inner.opts.health_check.is_some()
    }

    /// Adds an endpoint; returns false if it was already there. Takes effect for the next
    /// request; requests in flight are not affected. An address added so stays when DNS no
    /// longer gives it for a followed name.
    pub fn add_endpoint(&self, addr: SocketAddr) -> bool {
        if let Some(follow) = &self.inner.follow {
            follow.disown(addr);
        }
        insert_endpoint(&self.inner, addr, false)
    }

    /// Removes an endpoint; returns false if it was not there. Requests in flight to it
    /// finish; its idle connections are closed and it receives nothing new.
    pub fn remove_endpoint(&self, addr: SocketAddr) -> bool {
        if let Some(follow) = &self.inner.follow {
            follow.disown(addr);
        }
        drop_endpoint(&self.inner, addr)
    }

    /// Looks up the endpoint names that follow DNS now, all at once, and applies what they
    /// resolve to; the proxy does it before it serves, so it starts with their addresses.
    /// Does nothing for a cluster without `resolve`.
    pub async fn resolve_now(&self) {
        refresh::resolve_all(&self.inner).await;
    }

    /// The endpoint names that follow DNS, with their addresses now (empty without
    /// `resolve`).
    pub fn followed_names(&self) -> Vec<FollowedName> {
        self.inner
            .follow
            .as_ref()
            .map(Follow::status)
            .unwrap_or_default()
    }

    /// The endpoints that followed names brought in (which DNS may take out again).
    pub fn followed_addrs(&self) -> std::collections::BTreeSet<SocketAddr> {
        let follow = self.inner.follow.as_ref();
        follow.map(Follow::owned).unwrap_or_default()
    }

    /// Sends a request to an endpoint picked by the load-balancing policy.
    pub async fn send(&self, req: Request<ProxyBody>) -> Result<Response<ProxyBody>, ProxyError> {
        self.start_tasks();
        send::send(&self.inner, req).await
    }

    /// Starts the idle reaper and the health checks now rather than on the first request, so
    /// that a dead endpoint is known before traffic arrives. Must run inside a Tokio runtime;
    /// calling it again does nothing.
    pub fn start(&self) {
        self.start_tasks();
    }

    fn start_tasks(&self) {
        if self.inner.tasks_started.load(Ordering::Acquire)
            || self.inner.tasks_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        tokio::spawn(reap_idle(Arc::downgrade(&self.inner)));
        for endpoint in self.inner.endpoints.load().iter() {
            health::spawn(&self.inner, Arc::clone(endpoint));
        }
        refresh::spawn(&self.inner);
    }
}

/// Adds an endpoint at `addr` unless there is one; true if it was added. `pending`: out of
/// rotation until its first health check passes.
fn insert_endpoint(inner: &Arc<Inner>, addr: SocketAddr, pending: bool) -> bool {
    let counted = inner.metrics.endpoint(&inner.name, addr);
    let endpoint = Arc::new(Endpoint::with_metrics(addr, counted));
    if pending {
        endpoint.set_pending();
    }
    let mut added = false;
    inner.endpoints.rcu(|list| {
        added = !list.iter().any(|e| e.addr() == addr);
        let mut next = list.as_ref().clone();
        if added {
            next.push(Arc::clone(&endpoint));
        }
        next
    });
    if added && inner.tasks_started.load(Ordering::Acquire) {
        health::spawn(inner, endpoint);
    }
    added
}

/// Removes the endpoint at `addr`; false if there was none.
fn drop_endpoint(inner: &Inner, addr: SocketAddr) -> bool {
    let mut removed = None;
    inner.endpoints.rcu(|list| {
        removed = list.iter().find(|e| e.addr() == addr).cloned();
        list.iter()
            .filter(|e| e.addr() != addr)
            .cloned()
            .collect::<Vec<_>>()
    });
    removed.map(|e| e.remove()).is_some()
}

impl Inner {
    fn now_ms(&self) -> u64 {
        endpoint::millis(self.epoch.elapsed())
    }

    /// Why no endpoint can take a request: a followed name that never resolved, when the
    /// cluster has no endpoint at all; else none is usable.
    fn no_endpoint(&self, endpoints: &[Arc<Endpoint>]) -> ProxyError {
        let unresolved = match endpoints.is_empty() {
            true => self.follow.as_ref().and_then(Follow::unresolved),
            false => None,
        };
        let cluster = self.name.clone();
        match unresolved {
            Some((name, error)) => ProxyError::Unresolved {
                cluster,
                name,
                why: error.map_or_else(|| "not looked up yet".to_owned(), |e| e.to_string()),
            },
            None => ProxyError::NoEndpoint { cluster },
        }
    }

    /// `at` in cluster epoch milliseconds (a clock reading the caller already has).
    fn ms_at(&self, at: Instant) -> u64 {
        endpoint::millis(at.saturating_duration_since(self.epoch))
    }
}

/// Closes idle connections past the idle timeout, so that idle sockets do not linger until the
/// next request happens to look at them. Ends when the cluster is dropped.
async fn reap_idle(cluster: Weak<Inner>) {
    let period = match cluster.upgrade() {
        Some(c) => {
            (c.opts.pool.idle_timeout / 2).clamp(Duration::from_millis(50), Duration::from_secs(5))
        }
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        let Some(c) = cluster.upgrade() else { return };
        for endpoint in c.endpoints.load().iter() {
            endpoint.reap_idle(&c.opts);
        }
    }
}

/// Takes an idle connection to `endpoint` that is ready for a request, or connects a new one.
async fn acquire(inner: &Inner, endpoint: &Endpoint) -> Result<Conn, ProxyError> {
    if let Some(conn) = checkout_ready(inner, endpoint).await {
        return Ok(conn);
    }
    // Boxed: connecting is the cold path once the pool is warm, and its state (the TCP connect
    // and hyper's handshake) would otherwise sit inline in every request's future.
    Box::pin(connect_fresh(inner, endpoint)).await
}

/// The most recently used idle HTTP/1.1 connection to `endpoint` that is ready for a request.
async fn checkout_ready(inner: &Inner, endpoint: &Endpoint) -> Option<Conn> {
    while let Some(mut conn) = endpoint.checkout(&inner.opts) {
        // A connection goes back to the pool when its response ends, which can be a moment
        // before hyper's dispatcher is ready for the next request; `ready` waits out that
        // moment and fails for a connection the upstream closed meanwhile. It could also wait
        // for a slow client's upload that the upstream answered early, so it is bounded: a
        // connection not ready within the connect timeout is closed instead.
        let ready = tokio::time::timeout(inner.opts.connect_timeout, conn.sender.ready());
        if matches!(ready.await, Ok(Ok(()))) {
            return Some(conn);
        }
        debug!(upstream.addr = %endpoint.addr(), "discarded a closed pooled connection");
    }
    None
}

async fn connect_fresh(inner: &Inner, endpoint: &Endpoint) -> Result<Conn, ProxyError> {
    let tls = inner.tls.as_ref();
    let connected = connect_http1(endpoint.addr(), inner.opts.connect_timeout, tls).await;
    counted(inner, endpoint, connected).map(Conn::new)
}

/// A new connection to `endpoint` as the cluster's `protocol` says (HTTP/2 for `h2c`, what
/// ALPN agreed over TLS).
async fn connect_any(inner: &Inner, endpoint: &Endpoint) -> Result<Connected, ProxyError> {
    connect_as(inner, endpoint, inner.opts.protocol).await
}

/// [`connect_any`] speaking `protocol` instead of the cluster's (`h2c` for a plaintext `auto`
/// cluster's gRPC calls).
async fn connect_as(
    inner: &Inner,
    endpoint: &Endpoint,
    protocol: UpstreamProtocol,
) -> Result<Connected, ProxyError> {
    let (tls, opts) = (inner.tls.as_ref(), &inner.opts);
    let protocol = (protocol, &opts.h2);
    let connected = connect(endpoint.addr(), opts.connect_timeout, tls, protocol).await;
    counted(inner, endpoint, connected)
}

/// Counts a connect, and ejects `endpoint` when it failed.
fn counted<T>(
    inner: &Inner,
    endpoint: &Endpoint,
    connected: Result<T, ProxyError>,
) -> Result<T, ProxyError> {
    inner.connects.count(connected.is_ok());
    match connected {
        Ok(conn) => {
            endpoint.connect_succeeded();
            Ok(conn)
        }
        Err(e) => {
            endpoint.connect_failed(inner.now_ms(), &inner.opts);
            debug!(cluster = %inner.name, upstream.addr = %endpoint.addr(), error = %e, "ejected endpoint after connect failure");
            Err(e)
        }
    }
}

fn wrap_response(
    res: Response<hyper::body::Incoming>,
    ret: impl sluice_core::body::Release + 'static,
) -> Response<ProxyBody> {
    let (parts, body) = res.into_parts();
    Response::from_parts(parts, ProxyBody::guarded(body, ret))
}
