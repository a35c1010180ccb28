//! Instances (one service process, many sessions), session limits and the permit a live
//! session holds.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use tokio::sync::mpsc;

use super::ClusterInner;

/// A counter with an optional ceiling: sessions in total, per cluster, per instance.
#[derive(Debug, Default)]
pub struct Limit {
    count: AtomicUsize,
    max: Option<usize>,
}

impl Limit {
    /// A counter at zero that refuses to go above `max` (`None`: no ceiling).
    pub fn new(max: Option<usize>) -> Self {
        Self {
            count: AtomicUsize::new(0),
            max,
        }
    }

    /// Counts one more, unless that would pass the ceiling.
    pub fn try_take(&self) -> bool {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| match self.max {
                Some(max) if n >= max => None,
                _ => Some(n + 1),
            })
            .is_ok()
    }

    /// Counts one fewer.
    pub fn give(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }

    /// The current count.
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

/// One registered service instance: its id, whether it drains, and its live sessions.
#[derive(Debug)]
pub struct Instance {
    id: String,
    draining: AtomicBool,
    pub(super) sessions: Limit,
    /// Sessions an upgrade (WebSocket) took over, still bridged to their clients.
    pub(super) upgraded: AtomicUsize,
    /// The cluster that lists it (weak: the cluster owns its instances).
    pub(super) cluster: Weak<ClusterInner>,
}

impl Instance {
    pub(super) fn new(
        id: String,
        max_sessions: Option<usize>,
        cluster: Weak<ClusterInner>,
    ) -> Self {
        Self {
            id,
            draining: AtomicBool::new(false),
            sessions: Limit::new(max_sessions),
            upgraded: AtomicUsize::new(0),
            cluster,
        }
    }

    /// The instance id (`Sluice-Instance`, or the peer's IP address).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the instance is draining: its sessions are never leased again.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub(super) fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// The sessions of this instance that are still connected.
    pub fn sessions(&self) -> usize {
        self.sessions.current()
    }

    /// Former sessions of this instance that an upgrade (WebSocket) took over and that are
    /// still open. They no longer count as sessions (the service re-dials a replacement), but
    /// the instance is listed while any is open.
    pub fn upgraded(&self) -> usize {
        self.upgraded.load(Ordering::Acquire)
    }
}

/// Held by a session's connection task: gives back the session's place in every limit when
/// the connection ends, and forgets an instance whose last session is gone.
#[derive(Debug)]
pub(crate) struct SessionPermit {
    pub(super) global: Arc<Limit>,
    pub(super) cluster: Arc<ClusterInner>,
    pub(super) instance: Arc<Instance>,
    /// A session a standalone acceptor lent this process: its id is reported `GONE` when the
    /// session ends here (not when it is returned).
    pub(super) lent: Option<Lent>,
}

/// Where to report that a lent session is gone.
#[derive(Debug)]
pub(crate) struct Lent {
    pub(crate) id: u64,
    pub(crate) gone: mpsc::UnboundedSender<u64>,
}

impl SessionPermit {
    /// What a lent session owes its lender; it is no longer reported gone when this permit
    /// drops (the session goes back instead).
    pub(crate) fn take_lent(&mut self) -> Option<Lent> {
        self.lent.take()
    }

    /// Puts back what [`take_lent`](Self::take_lent) took, when the session stays after all.
    pub(crate) fn restore_lent(&mut self, lent: Option<Lent>) {
        self.lent = lent;
    }
}

impl Drop for SessionPermit {
    fn drop(&mut self) {
        if let Some(lent) = self.lent.take() {
            let _ = lent.gone.send(lent.id);
        }
        self.global.give();
        self.cluster.release(&self.instance);
    }
}
