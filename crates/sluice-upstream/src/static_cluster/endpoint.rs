//! One endpoint of a static cluster: its address, load, ejection state and idle connections,
//! and the connection's return to them when a response ends.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use super::pool::{reap_raw, Conn, IdleConn, IdleRaw, RawConn};
use sluice_config::StaticOptions;
use sluice_core::body::Release;

/// A listening backend of a static cluster.
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    /// Requests between endpoint selection and the end of their response body.
    in_flight: AtomicUsize,
    /// Milliseconds since the cluster's epoch until which the endpoint is ejected.
    ejected_until_ms: AtomicU64,
    /// Consecutive connect failures; the ejection backoff doubles with each.
    connect_failures: AtomicU32,
    /// Ejections since the endpoint was added.
    ejections: AtomicU64,
    /// The active health check's verdict (true when no check is configured).
    healthy: AtomicBool,
    /// Set when the endpoint was removed from its cluster: nothing new is sent to it.
    removed: AtomicBool,
    /// Added by DNS while health checks run: out of rotation until its first check passes.
    pending: AtomicBool,
    /// Idle keep-alive connections, most recently used at the back.
    idle: Mutex<VecDeque<IdleConn>>,
    /// Idle keep-alive connections of the HTTP/1 fast path (plain sockets), likewise.
    raw_idle: Mutex<VecDeque<IdleRaw>>,
    /// Its responses by status class, and their latency.
    metrics: super::metrics::EndpointMetrics,
    /// Its HTTP/2 connections.
    pub(crate) h2: super::h2::H2Pool,
    /// It agreed to HTTP/2 by ALPN (a `protocol = "auto"` cluster's).
    speaks_h2: AtomicBool,
}

impl Endpoint {
    /// An endpoint whose responses are counted in `metrics`.
    pub(crate) fn with_metrics(addr: SocketAddr, metrics: super::metrics::EndpointMetrics) -> Self {
        Self {
            metrics,
            ..Self::new(addr)
        }
    }

    /// Counts one response head from this endpoint.
    pub(crate) fn observe(&self, status: u16, elapsed: std::time::Duration) {
        self.metrics.observe(status, elapsed);
    }

    pub(crate) fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            in_flight: AtomicUsize::new(0),
            ejected_until_ms: AtomicU64::new(0),
            connect_failures: AtomicU32::new(0),
            ejections: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            removed: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            idle: Mutex::new(VecDeque::new()),
            raw_idle: Mutex::new(VecDeque::new()),
            metrics: super::metrics::EndpointMetrics::default(),
            h2: super::h2::H2Pool::default(),
            speaks_h2: AtomicBool::new(false),
        }
    }

    /// Whether it agreed to HTTP/2 by ALPN.
    pub(crate) fn speaks_h2(&self) -> bool {
        self.speaks_h2.load(Ordering::Relaxed)
    }

    /// It agreed to HTTP/2 by ALPN: its requests take streams from now on.
    pub(crate) fn agreed_h2(&self) {
        self.speaks_h2.store(true, Ordering::Relaxed);
    }

    /// The endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests currently using this endpoint.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether the active health check currently considers the endpoint healthy.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Connect failures in a row (0 after a connect succeeds).
    pub fn connect_failures(&self) -> u32 {
        self.connect_failures.load(Ordering::Relaxed)
    }

    /// How many times a failed connect ejected the endpoint since it was added.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Cluster-epoch milliseconds until which the endpoint is ejected (past: it is not).
    pub(crate) fn ejected_until_ms(&self) -> u64 {
        self.ejected_until_ms.load(Ordering::Relaxed)
    }

    /// Idle pooled connections right now (HTTP/2 connections, shared by streams, count as
    /// idle).
    pub fn idle_connections(&self) -> usize {
        self.lock_idle().len() + self.lock_raw_idle().len() + self.h2.connections()
    }

    /// Whether load balancing may pick this endpoint at `now_ms` (cluster epoch milliseconds).
    pub(crate) fn is_usable(&self, now_ms: u64) -> bool {
        !self.removed.load(Ordering::Relaxed)
            && self.healthy.load(Ordering::Relaxed)
            && self.ejected_until_ms.load(Ordering::Relaxed) <= now_ms
    }

    pub(crate) fn begin_request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    /// Records a failed connect: ejects for a backoff doubling per consecutive failure.
    pub(crate) fn connect_failed(&self, now_ms: u64, opts: &StaticOptions) {
        let failures = self
            .connect_failures
            .fetch_add(1, Ordering::Relaxed)
            .min(16);
        let base = opts.ejection.backoff.as_millis() as u64;
        let max = opts.ejection.max_backoff.as_millis() as u64;
        let backoff = base.saturating_mul(1 << failures).min(max);
        self.ejected_until_ms
            .store(now_ms + backoff, Ordering::Relaxed);
        self.ejections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connect_succeeded(&self) {
        if self.connect_failures.load(Ordering::Relaxed) != 0 {
            self.connect_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Out of rotation until its first health check passes (an address DNS just gave).
    pub(crate) fn set_pending(&self) {
        self.pending.store(true, Ordering::Relaxed);
        self.healthy.store(false, Ordering::Relaxed);
    }

    /// Whether it waits for its first passing check; true only the first time it is asked.
    pub(crate) fn take_pending(&self) -> bool {
        self.pending.swap(false, Ordering::Relaxed)
    }

    pub(crate) fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    /// Marks the endpoint removed and closes its idle connections.
    pub(crate) fn remove(&self) {
        self.removed.store(true, Ordering::Relaxed);
        self.lock_idle().clear();
        self.lock_raw_idle().clear();
        self.h2.clear();
    }

    /// Takes the most recently used idle connection that is still open and not expired.
    pub(crate) fn checkout(&self, opts: &StaticOptions) -> Option<Conn> {
        let now = Instant::now();
        let mut idle = self.lock_idle();
        while let Some(entry) = idle.pop_back() {
            if now.duration_since(entry.since) < opts.pool.idle_timeout && !entry.conn.is_closed() {
                return Some(entry.conn);
            }
        }
        None
    }

    /// Puts a finished connection back, evicting the oldest idle one when full.
    pub(crate) fn checkin(&self, conn: Conn, opts: &StaticOptions) {
        if conn.is_closed() {
            return;
        }
        let entry = IdleConn {
            conn,
            since: Instant::now(),
        };
        park(
            self,
            self.lock_idle(),
            entry,
            opts.pool.max_idle_per_endpoint,
        );
    }

    /// Puts a finished fast-path connection back, as [`checkin`](Self::checkin) does.
    pub(crate) fn checkin_raw(&self, conn: RawConn, opts: &StaticOptions) {
        let entry = IdleRaw::new(conn);
        park(
            self,
            self.lock_raw_idle(),
            entry,
            opts.pool.max_idle_per_endpoint,
        );
    }

    /// Closes idle connections that have been idle for the pool's idle timeout.
    pub(crate) fn reap_idle(&self, opts: &StaticOptions) {
        let now = Instant::now();
        let mut idle = self.lock_idle();
        while idle.front().is_some_and(|e| {
            now.duration_since(e.since) >= opts.pool.idle_timeout || e.conn.is_closed()
        }) {
            idle.pop_front();
        }
        drop(idle);
        reap_raw(&mut self.lock_raw_idle(), opts);
    }

    /// The fast path's idle connections.
    pub(super) fn lock_raw_idle(&self) -> MutexGuard<'_, VecDeque<IdleRaw>> {
        self.raw_idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_idle(&self) -> MutexGuard<'_, VecDeque<IdleConn>> {
        // A panic while holding this lock cannot leave the deque inconsistent.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Adds `entry` to the locked idle list `idle`, evicting the oldest when it holds `max`.
/// Removal is checked under the lock: `remove` clears the lists under it, so nothing lands
/// after.
fn park<T>(endpoint: &Endpoint, mut idle: MutexGuard<'_, VecDeque<T>>, entry: T, max: usize) {
    if max == 0 || endpoint.is_removed() {
        return;
    }
    if idle.len() >= max {
        idle.pop_front();
    }
    idle.push_back(entry);
}

/// A duration in whole milliseconds, saturating (a backoff of centuries is "forever").
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Counts one request against an endpoint's in-flight load until dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Endpoint>);

impl InFlight {
    pub(crate) fn endpoint(&self) -> &Arc<Endpoint> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Travels with a response body: returns the connection to its endpoint's pool when the body
/// has been read to the end, and releases the endpoint's in-flight count when dropped.
///
/// A body dropped before its end drops the connection instead, because HTTP/1.1 cannot reuse a
/// connection with an unread response on it.
#[derive(Debug)]
pub(crate) struct ReturnOnEnd {
    conn: Option<Conn>,
    opts: Arc<StaticOptions>,
    in_flight: InFlight,
}

impl ReturnOnEnd {
    pub(crate) fn new(conn: Option<Conn>, opts: Arc<StaticOptions>, in_flight: InFlight) -> Self {
        Self {
            conn,
            opts,
            in_flight,
        }
    }
}

impl Release for ReturnOnEnd {
    /// The response has ended cleanly: the connection may carry another request.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.in_flight.endpoint().checkin(conn, &self.opts);
        }
    }
}
