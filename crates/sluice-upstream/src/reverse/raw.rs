//! The fast path's side of a reverse slice: a session leased with its socket in hand
//! ([`SessionLease`]), given back raw when its response has been read off.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

use super::link::SessionIo;
use super::protocol::{refused, Lease, ReverseSlice, Session, SessionClient, SlicePool};
use crate::leased::Leased;
use sluice_core::error::ProxyError;
use sluice_core::retry::Policy;

/// How many sessions a lease may find ended as it takes their socket before it gives up
/// (each one ended between the slice's liveness check and the take: a rare race).
const MAX_ENDED: usize = 4;

/// A session leased for one request of the fast path, and its socket.
#[derive(Debug)]
pub struct SessionLease {
    session: Session,
    io: SessionIo,
    pool: Arc<SlicePool>,
    /// How long the request waited for it in the slice's queue.
    queued: Duration,
    /// When, if it waited.
    leased_at: Option<std::time::Instant>,
}

impl SessionLease {
    /// Leases a session of `slice` (waiting in its admission queue as the hyper path does) and
    /// takes its socket; hyper's client, if it had the session, lets go of it first.
    pub async fn lease(slice: &ReverseSlice) -> Result<Self, ProxyError> {
        Self::lease_from(slice.pool()).await
    }

    async fn lease_from(pool: &Arc<SlicePool>) -> Result<Self, ProxyError> {
        let mut queued = Duration::ZERO;
        for _ in 0..MAX_ENDED {
            let (mut session, waited) = pool.lease_waited().await.map_err(refused)?;
            queued += waited;
            let SessionClient::Http1(link) = session.client() else {
                // An HTTP/2 session registered after the route sent the request here: its
                // stream goes back, and hyper's path serves the request.
                Lease::new(Some(session), Arc::clone(pool)).finish();
                return Err(ProxyError::HandedBack);
            };
            if let Some(io) = link.take_io().await {
                let pool = Arc::clone(pool);
                return Ok(Self {
                    session,
                    io,
                    pool,
                    queued,
                    leased_at: super::send::leased_at(queued),
                });
            }
            debug!(instance = %session.instance().id(), "a leased session had ended; leasing another");
        }
        Err(ProxyError::UpstreamInvalid("session closed"))
    }
}

impl Leased for SessionLease {
    type Io = SessionIo;

    fn io(&mut self) -> &mut SessionIo {
        &mut self.io
    }

    fn response_timeout(&self) -> Duration {
        self.pool.options().response_timeout
    }

    fn may_be_stale(&self) -> bool {
        true
    }

    fn retry_policy(&self) -> Option<&Arc<Policy>> {
        self.pool.protocol_options().retry()
    }

    /// Another session of the slice (any: sessions of one slice are alike).
    fn another(&self) -> impl Future<Output = Result<Self, ProxyError>> + Send + 'static {
        let pool = Arc::clone(&self.pool);
        async move { Self::lease_from(&pool).await }
    }

    /// Another session of the slice (this one closes).
    async fn renew(&mut self) -> Result<(), ProxyError> {
        *self = Self::lease_from(&self.pool).await?;
        Ok(())
    }

    fn replays_bodies(&self, len: usize) -> bool {
        len <= self.pool.options().request_buffer
    }

    fn frees_first(&self) -> bool {
        true
    }

    fn read_ahead(&self) -> Option<usize> {
        Some(self.pool.options().response_buffer)
    }

    /// Back to the slice, raw, when `reusable` and the service is quiet on it; else closed.
    fn release(self, reusable: bool) {
        let Self {
            mut session,
            io,
            pool,
            ..
        } = self;
        let SessionClient::Http1(link) = session.client() else {
            return;
        };
        if reusable && link.put_io(io) {
            Lease::new(Some(session), pool).finish();
        }
    }

    fn served_by(&self) -> crate::served::ServedBy {
        crate::served::ServedBy {
            instance: Some(Arc::clone(self.session.instance())),
            queued: Some(self.queued),
            leased_at: self.leased_at,
            ..Default::default()
        }
    }

    /// As the hyper path logs a failed exchange over a session: at warn, with the instance.
    fn log_failure(&self, e: &ProxyError) {
        let (cluster, slice) = (self.pool.cluster(), self.pool.slice());
        let status = e.status().as_u16();
        warn!(cluster, slice, instance = %self.session.instance().id(), error = %e, status, "upstream failed");
    }
}
