//! The fast path's side of a static cluster: plain TCP connections it drives itself, leased
//! by the same load balancing, in-flight counts, connect ejection and pool limits as hyper's
//! connections, and pooled apart from them (each kind is only ever reused by its own path).

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

use super::endpoint::{Endpoint, InFlight};
use super::pool::{is_quiet, RawConn};
use super::{Inner, StaticCluster, StaticOptions};
use crate::leased::Leased;
use sluice_core::error::ProxyError;
use sluice_core::read_ahead::IO_BUFFER_BYTES;
use sluice_core::retry::Policy;

/// A connection leased for one request; [`Leased::release`] gives it back.
#[derive(Debug)]
pub struct RawLease {
    /// The connection.
    conn: RawConn,
    in_flight: InFlight,
    inner: Arc<Inner>,
    /// The endpoints this request tried before (a retry's; empty, and not allocated, else).
    tried: Vec<Arc<Endpoint>>,
}

impl Leased for RawLease {
    type Io = TcpStream;

    fn io(&mut self) -> &mut TcpStream {
        &mut self.conn.stream
    }

    fn response_timeout(&self) -> std::time::Duration {
        self.inner.opts.response_timeout
    }

    fn may_be_stale(&self) -> bool {
        self.conn.served > 0
    }

    fn retry_policy(&self) -> Option<&Arc<Policy>> {
        self.inner.retry.as_ref()
    }

    /// A connection to an endpoint this request has not tried, if one can be connected; else
    /// to one it has tried (`send::pick_and`).
    fn another(&self) -> impl Future<Output = Result<Self, ProxyError>> + Send + 'static {
        let cluster = StaticCluster {
            inner: Arc::clone(&self.inner),
        };
        let mut tried = self.tried.clone();
        tried.push(Arc::clone(self.in_flight.endpoint()));
        async move { cluster.lease_raw_avoiding(Instant::now(), tried).await }
    }

    /// A fresh connection to the same endpoint.
    async fn renew(&mut self) -> Result<(), ProxyError> {
        let endpoint = Arc::clone(self.in_flight.endpoint());
        self.conn = connect(&self.inner, &endpoint).await?;
        Ok(())
    }

    /// Only with a retry policy that may replay: the hyper path then reads bodies that fit the
    /// fast path's buffer before it sends them, else it streams them.
    fn replays_bodies(&self, len: usize) -> bool {
        let policy = self.inner.retry.as_ref();
        policy.is_some_and(|p| p.replays()) && len <= IO_BUFFER_BYTES
    }

    fn frees_first(&self) -> bool {
        false
    }

    fn read_ahead(&self) -> Option<usize> {
        None
    }

    /// Back to the pool when `reusable` and under the per-connection request limit, else
    /// closed.
    fn release(self, reusable: bool) {
        let mut conn = self.conn;
        conn.served += 1;
        let opts = &self.inner.opts;
        let limit = opts.pool.max_requests_per_connection.unwrap_or(u64::MAX);
        if reusable && conn.served < limit {
            self.in_flight.endpoint().checkin_raw(conn, opts);
        }
    }

    fn log_failure(&self, e: &ProxyError) {
        super::send::log_failure(&self.inner, self.in_flight.endpoint().addr(), e);
    }

    fn observe_response(&self, status: u16, elapsed: std::time::Duration) {
        self.in_flight.endpoint().observe(status, elapsed);
    }

    fn served_by(&self) -> crate::served::ServedBy {
        crate::served::ServedBy {
            endpoint: Some(self.in_flight.endpoint().addr()),
            ..Default::default()
        }
    }
}

impl StaticCluster {
    /// Whether the fast path can reach this cluster: HTTP/1.1 over plain TCP (it speaks
    /// neither TLS nor HTTP/2; an `auto` cluster without TLS speaks HTTP/1.1).
    pub fn is_plain(&self) -> bool {
        let http1 = !matches!(
            self.inner.opts.protocol,
            sluice_config::UpstreamProtocol::H2 | sluice_config::UpstreamProtocol::H2c
        );
        self.inner.tls.is_none() && http1
    }

    /// Leases a connection for one request: an endpoint picked by the load-balancing policy,
    /// its most recently used idle fast-path connection or a new one. A failed connect ejects
    /// the endpoint and moves on to another, as [`send`](Self::send) does. `now` is the
    /// request's clock reading (ejections and idle expiry are judged by it).
    pub async fn lease_raw(&self, now: Instant) -> Result<RawLease, ProxyError> {
        self.lease_raw_avoiding(now, Vec::new()).await
    }

    /// As [`lease_raw`](Self::lease_raw), from an endpoint not in `tried` (a retry's) if one can
    /// be connected, else from one in it (`send::pick_and`).
    async fn lease_raw_avoiding(
        &self,
        now: Instant,
        tried: Vec<Arc<Endpoint>>,
    ) -> Result<RawLease, ProxyError> {
        self.start_tasks();
        let inner = &self.inner;
        let endpoints = inner.endpoints.load_full();
        let avoided = tried
            .iter()
            .filter_map(|a| endpoints.iter().position(|e| Arc::ptr_eq(e, a)));
        let mut tried_here: Vec<usize> = avoided.collect();
        let acquire = |endpoint: Arc<Endpoint>| async move {
            match checkout(&endpoint, &inner.opts, now) {
                Some(conn) => Ok(conn),
                None => connect(inner, &endpoint).await,
            }
        };
        let now_ms = inner.ms_at(now);
        let (_, conn, in_flight) =
            super::send::pick_and(inner, &endpoints, now_ms, &mut tried_here, acquire).await?;
        Ok(RawLease {
            conn,
            in_flight,
            inner: Arc::clone(inner),
            tried,
        })
    }
}

/// Connects within the connect timeout, ejecting the endpoint when that fails.
async fn connect(inner: &Inner, endpoint: &Endpoint) -> Result<RawConn, ProxyError> {
    let connect = TcpStream::connect(endpoint.addr());
    let connected = match tokio::time::timeout(inner.opts.connect_timeout, connect).await {
        Err(_elapsed) => Err(ProxyError::ConnectTimeout),
        Ok(Err(e)) => Err(ProxyError::Connect(e)),
        Ok(Ok(stream)) => Ok(stream),
    };
    inner.connects.count(connected.is_ok());
    match connected {
        Ok(stream) => {
            endpoint.connect_succeeded();
            // Heads go out in one write; Nagle would only delay them.
            let _ = stream.set_nodelay(true);
            Ok(RawConn { stream, served: 0 })
        }
        Err(e) => {
            endpoint.connect_failed(inner.now_ms(), &inner.opts);
            debug!(cluster = %inner.name, upstream.addr = %endpoint.addr(), error = %e, "ejected endpoint after connect failure");
            Err(e)
        }
    }
}

/// The most recently used idle connection that is open, quiet and not expired at `now`.
fn checkout(endpoint: &Endpoint, opts: &StaticOptions, now: Instant) -> Option<RawConn> {
    let mut idle = endpoint.lock_raw_idle();
    while let Some(entry) = idle.pop_back() {
        if entry.idle_for(now) < opts.pool.idle_timeout && is_quiet(&entry.conn) {
            return Some(entry.conn);
        }
    }
    None
}
