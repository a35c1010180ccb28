//! Established (and, towards a tunnel end, authenticated) connections to the next hop, kept
//! ready for clients and refilled in the background between two watermarks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::RecvFlags;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::upstream::Connector;

/// How often idle connections are checked for a peer that closed them, so the pool refills
/// before a client finds them dead.
const SWEEP: Duration = Duration::from_secs(1);
/// The wait after a failed connect before the refill tries again.
const RETRY: Duration = Duration::from_millis(500);

/// A pool of ready connections to one next hop.
#[derive(Debug)]
pub(crate) struct Pool {
    idle: Mutex<VecDeque<TcpStream>>,
    /// The high watermark: the refill stops here. Changeable at runtime.
    size: AtomicUsize,
    wake: Notify,
    connector: Arc<Connector>,
}

impl Pool {
    /// An empty pool of `size`; [`Pool::run`] fills it.
    pub(crate) fn new(size: usize, connector: Arc<Connector>) -> Self {
        Self {
            idle: Mutex::new(VecDeque::new()),
            size: AtomicUsize::new(size),
            wake: Notify::new(),
            connector,
        }
    }

    /// Changes the pool's size; extra idle connections are closed at the next refill.
    pub(crate) fn resize(&self, size: usize) {
        self.size.store(size, Relaxed);
        self.wake.notify_one();
    }

    /// A live pooled connection, or `None` (a miss). Connections the peer closed (or sent
    /// bytes on, which a pooled connection never gets) are discarded on the way.
    pub(crate) fn take(&self) -> Option<TcpStream> {
        let stats = &self.connector.stats;
        let found = loop {
            let Some(conn) = self.lock().pop_front() else {
                break None;
            };
            if alive(&conn) {
                break Some(conn);
            }
            stats.pool_dead.fetch_add(1, Relaxed);
        };
        if found.is_none() {
            stats.pool_misses.fetch_add(1, Relaxed);
        }
        self.publish();
        self.wake.notify_one();
        found
    }

    /// Keeps the pool between its watermarks until the process ends: refills (several connects
    /// at once) when it falls below the low one, sweeps dead connections every second.
    pub(crate) async fn run(self: Arc<Self>) {
        loop {
            self.sweep();
            let (have, size) = (self.lock().len(), self.size.load(Relaxed));
            if have < low_watermark(size) || (have == 0 && size > 0) {
                self.refill(size - have).await;
                continue;
            }
            self.lock().truncate(size);
            self.publish();
            let _ = tokio::time::timeout(SWEEP, self.wake.notified()).await;
        }
    }

    /// Connects `missing` connections in parallel; on failure waits a little.
    async fn refill(&self, missing: usize) {
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..missing {
            let connector = Arc::clone(&self.connector);
            connects.spawn(async move { connector.pooled().await });
        }
        let mut failed = false;
        while let Some(done) = connects.join_next().await {
            match done {
                Ok(Ok(conn)) => self.lock().push_back(conn),
                Ok(Err(error)) => {
                    failed = true;
                    tracing::debug!(%error, to = %self.connector.to, "pool connect failed");
                }
                Err(_) => failed = true,
            }
            self.publish();
        }
        if failed {
            tokio::time::sleep(RETRY).await;
        }
    }

    fn sweep(&self) {
        let mut idle = self.lock();
        let before = idle.len();
        idle.retain(alive);
        let dead = before - idle.len();
        drop(idle);
        self.connector
            .stats
            .pool_dead
            .fetch_add(dead as u64, Relaxed);
        self.publish();
    }

    fn publish(&self) {
        let n = self.lock().len() as u64;
        self.connector.stats.pool_idle.store(n, Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<TcpStream>> {
        // A panic while holding the lock leaves a valid deque behind.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Below this many idle connections the refill starts: three quarters of the size, so a burst
/// of clients is refilled in one batch of parallel connects, but never at zero.
fn low_watermark(size: usize) -> usize {
    (size * 3).div_ceil(4)
}

/// Whether a pooled connection is still open and silent: a non-blocking peek that would block.
fn alive(conn: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    let peeked = rustix::net::recv(conn, &mut byte, RecvFlags::PEEK | RecvFlags::DONTWAIT);
    matches!(peeked, Err(rustix::io::Errno::AGAIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_low_watermark_is_three_quarters_and_never_zero_for_a_pool() {
        assert_eq!(low_watermark(0), 0);
        assert_eq!(low_watermark(1), 1);
        assert_eq!(low_watermark(4), 3);
        assert_eq!(low_watermark(16), 12);
    }
}
