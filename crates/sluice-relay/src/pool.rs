//! Established (and, towards a tunnel end, authenticated) connections to the next hop, kept
//! ready for clients and refilled in the background between two watermarks.
//!
//! A next hop that closes pooled connections right after they are made (a tunnel end that
//! refuses this relay's token) or that cannot be reached is dialled less and less often: each
//! refill after one that failed waits twice as long, up to [`MAX_BACKOFF`], until one works.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::RecvFlags;
use sluice_net::log_limit::{Tally, REPORT_INTERVAL};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::options::{Forward, RelayOptions, TunnelEnd};
use crate::stats::Stats;
use crate::upstream::Connector;

/// How often idle connections are checked for a peer that closed them, so the pool refills
/// before a client finds them dead.
const SWEEP: Duration = Duration::from_secs(1);
/// The wait before a refill after one that failed; it doubles with each failed one in a row.
const RETRY: Duration = Duration::from_millis(500);
/// The longest wait between refills while they fail.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A pooled connection the peer closed younger than this was refused (a tunnel end closes a
/// wrong token at once), not closed for being idle. Above [`SWEEP`], so the sweep after the
/// one that first saw it alive still counts it young.
const YOUNG: Duration = Duration::from_secs(3);

/// A pool of ready connections to one next hop.
#[derive(Debug)]
pub(crate) struct Pool {
    idle: Mutex<VecDeque<Idle>>,
    /// The high watermark: the refill stops here. Changeable at runtime.
    size: AtomicUsize,
    wake: Notify,
    connector: Arc<Connector>,
    /// Connections found closed younger than [`YOUNG`] since the last refill.
    refused: AtomicU64,
    /// When to warn about them next.
    warned: Mutex<Tally>,
    /// Its part of the relay's `pool_idle` (a tunnel end has a pool per target).
    published: AtomicU64,
}

/// A pooled connection and when it was ready.
#[derive(Debug)]
struct Idle {
    conn: TcpStream,
    since: Instant,
}

impl Pool {
    /// An empty pool of `size`; [`Pool::run`] fills it.
    pub(crate) fn new(size: usize, connector: Arc<Connector>) -> Self {
        Self {
            idle: Mutex::new(VecDeque::new()),
            size: AtomicUsize::new(size),
            wake: Notify::new(),
            connector,
            refused: AtomicU64::new(0),
            warned: Mutex::new(Tally::new(REPORT_INTERVAL)),
            published: AtomicU64::new(0),
        }
    }

    /// Changes the pool's size; extra idle connections are closed at the next refill.
    pub(crate) fn resize(&self, size: usize) {
        self.size.store(size, Relaxed);
        self.wake.notify_one();
    }

    /// A live pooled connection, or `None` (a miss). Connections the peer closed (or sent
    /// bytes on, which a pooled connection never gets) are discarded on the way, and so are
    /// those to an address the next hop's name no longer has.
    pub(crate) fn take(&self) -> Option<TcpStream> {
        let mut dead = Vec::new();
        let found = loop {
            let Some(idle) = self.lock().pop_front() else {
                break None;
            };
            if !self.connector.is_current(&idle.conn) {
                continue;
            }
            if alive(&idle.conn) {
                break Some(idle.conn);
            }
            dead.push(idle);
        };
        self.discard(&dead);
        if found.is_none() {
            self.connector.stats.pool_misses.fetch_add(1, Relaxed);
        }
        self.publish();
        self.wake.notify_one();
        found
    }

    /// Keeps the pool between its watermarks until the process ends: refills (several connects
    /// at once) when it falls below the low one, sweeps dead connections every second.
    pub(crate) async fn run(self: Arc<Self>) {
        let mut backoff = Backoff::default();
        let mut connects_failed = false;
        loop {
            self.sweep();
            let (have, size) = (self.lock().len(), self.size.load(Relaxed));
            if have < low_watermark(size) || (have == 0 && size > 0) {
                // The last refill failed if a connect failed or its connections were refused.
                let refused = self.refused.swap(0, Relaxed) > 0;
                let wait = backoff.next(connects_failed || refused);
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                let missing = self.size.load(Relaxed).saturating_sub(self.lock().len());
                connects_failed = self.refill(missing).await;
                continue;
            }
            self.lock().truncate(size);
            self.publish();
            let _ = tokio::time::timeout(SWEEP, self.wake.notified()).await;
        }
    }

    /// Connects `missing` connections in parallel; whether any failed.
    async fn refill(&self, missing: usize) -> bool {
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..missing {
            let connector = Arc::clone(&self.connector);
            connects.spawn(async move { connector.pooled().await });
        }
        let mut failed = false;
        while let Some(done) = connects.join_next().await {
            match done {
                Ok(Ok(conn)) => self.lock().push_back(Idle {
                    conn,
                    since: Instant::now(),
                }),
                Ok(Err(error)) => {
                    failed = true;
                    tracing::debug!(%error, to = %self.connector.to, "pool connect failed");
                }
                Err(_) => failed = true,
            }
            self.publish();
        }
        failed
    }

    /// Discards the idle connections the peer closed, and closes those to an address the next
    /// hop's name no longer has.
    fn sweep(&self) {
        let mut idle = self.lock();
        let (live, dead): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut *idle)
            .into_iter()
            .filter(|i| self.connector.is_current(&i.conn))
            .partition(|i| alive(&i.conn));
        *idle = live;
        drop(idle);
        self.discard(&Vec::from(dead));
        self.publish();
    }

    /// Counts connections found closed by the peer; those closed young were refused: counted
    /// for the refill's backoff, and reported once in a while.
    fn discard(&self, dead: &[Idle]) {
        let stats = &self.connector.stats;
        stats.pool_dead.fetch_add(dead.len() as u64, Relaxed);
        let young = dead.iter().filter(|i| i.since.elapsed() < YOUNG).count() as u64;
        if young == 0 {
            return;
        }
        self.refused.fetch_add(young, Relaxed);
        let now = std::time::Instant::now();
        let report = self
            .warned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(young, now);
        if let Some(closed) = report {
            self.warn_refused(closed);
        }
    }

    /// Says that `closed` pooled connections were refused since the last such line: without
    /// it, clients of a relay with a wrong token get empty replies and nothing says why.
    fn warn_refused(&self, closed: u64) {
        let to = &self.connector.to;
        match self.connector.names_target() {
            true => {
                tracing::warn!(%to, closed, "pooled connections to the tunnel end closed right after the preamble: wrong token? (the tunnel end logs why it refuses); refilling less often")
            }
            false => {
                tracing::warn!(%to, closed, "pooled connections closed by the next hop right after connecting; refilling less often")
            }
        }
    }

    /// Moves the relay's `pool_idle` by this pool's change since it last said.
    fn publish(&self) {
        let n = self.lock().len() as u64;
        let before = self.published.swap(n, Relaxed);
        let idle = &self.connector.stats.pool_idle;
        idle.fetch_add(n.wrapping_sub(before), Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        // A panic while holding the lock leaves a valid deque behind.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A tunnel end's ready connections, by target (few: a list).
pub(crate) type Pools = Vec<(SocketAddr, Arc<Pool>)>;

/// The pools `end` keeps: `end.pool` connections to each of its `pool_targets`, made as a
/// plain forwarder makes them (no preamble: the target is the last hop).
pub(crate) fn pools(end: &TunnelEnd, opts: &RelayOptions, stats: &Arc<Stats>) -> Pools {
    if end.pool == 0 {
        return Vec::new();
    }
    let pool = |&target: &SocketAddr| {
        let forward = Forward {
            to: target.into(),
            tunnel: None,
            pool: end.pool,
            early_connect: false,
        };
        let connector = Arc::new(Connector::new(&forward, opts, Arc::clone(stats)));
        (target, Arc::new(Pool::new(end.pool, connector)))
    };
    end.pool_targets.iter().map(pool).collect()
}

/// A ready connection to `target` from the pool `pools` keeps for it, if any.
pub(crate) fn take_for(pools: &Pools, target: SocketAddr) -> Option<TcpStream> {
    pools
        .iter()
        .find(|(t, _)| *t == target)
        .and_then(|(_, pool)| pool.take())
}

/// The wait before a refill: none after one that worked, else [`RETRY`] doubled for each
/// failed one in a row, at most [`MAX_BACKOFF`].
#[derive(Debug, Default)]
struct Backoff {
    failed: u32,
}

impl Backoff {
    /// The wait before the next refill, given whether the last one failed.
    fn next(&mut self, failed: bool) -> Duration {
        if !failed {
            self.failed = 0;
            return Duration::ZERO;
        }
        let doublings = self.failed.min(16);
        self.failed = self.failed.saturating_add(1);
        RETRY.saturating_mul(1 << doublings).min(MAX_BACKOFF)
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

    #[test]
    fn failed_refills_back_off_exponentially_to_a_cap_and_a_good_one_resets() {
        let mut backoff = Backoff::default();
        let waits: Vec<u64> = (0..9)
            .map(|_| backoff.next(true).as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(backoff.next(false), Duration::ZERO);
        assert_eq!(backoff.next(true), RETRY);
    }
}
