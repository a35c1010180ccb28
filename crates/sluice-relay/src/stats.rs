//! Per-relay counters, read by the admin API's `/status` and `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What one relay has done since it started. Every field only grows, except the gauges
/// `active`, `pool_idle`, `sockmap` and `dns_addresses`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Client connections accepted.
    pub accepted: AtomicU64,
    /// Connections being relayed now.
    pub active: AtomicU64,
    /// Connections refused: a tunnel preamble malformed, unauthenticated or naming a target
    /// not allowed, or the next hop unreachable.
    pub refused: AtomicU64,
    /// Established connections to the next hop waiting in the pool now.
    pub pool_idle: AtomicU64,
    /// Clients that found the pool empty and waited for a connect.
    pub pool_misses: AtomicU64,
    /// Pooled connections found closed by the peer (and discarded) before use.
    pub pool_dead: AtomicU64,
    /// Connections started on a client's SYN (early connect).
    pub early: AtomicU64,
    /// Bytes from clients towards the next hop.
    pub bytes_up: AtomicU64,
    /// Bytes from the next hop back to clients.
    pub bytes_down: AtomicU64,
    /// 1 while the kernel forwards the relay's bytes (`sockmap` on and its program loaded), 0
    /// otherwise: a gauge.
    pub sockmap: AtomicU64,
    /// Connections whose bytes the kernel forwarded (`sockmap`).
    pub kernel_spliced: AtomicU64,
    /// Of `bytes_up` and `bytes_down`, those the kernel forwarded without user space (`sockmap`),
    /// as its program counted them.
    pub bytes_kernel: AtomicU64,
    /// Connects to the next hop (or target) completed, and their total time in microseconds.
    pub connects: AtomicU64,
    /// The sum of connect times, microseconds.
    pub connect_micros: AtomicU64,
    /// A next hop by name with `resolve`: its good lookups, failed lookups, and lookups that
    /// changed its addresses; all 0 for a next hop by address.
    pub dns_lookups: AtomicU64,
    /// Failed lookups of the next hop's name (its last addresses stay).
    pub dns_failures: AtomicU64,
    /// Lookups that changed the next hop's addresses.
    pub dns_changes: AtomicU64,
    /// The next hop's addresses now (a name's: its last good answer's): a gauge.
    pub dns_addresses: AtomicU64,
}

impl Stats {
    /// Counts one completed connect that took `took`.
    pub(crate) fn connected(&self, took: Duration) {
        self.connects.fetch_add(1, Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.connect_micros.fetch_add(micros, Relaxed);
    }

    /// A snapshot of every counter, for rendering.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            accepted: self.accepted.load(Relaxed),
            active: self.active.load(Relaxed),
            refused: self.refused.load(Relaxed),
            pool_idle: self.pool_idle.load(Relaxed),
            pool_misses: self.pool_misses.load(Relaxed),
            pool_dead: self.pool_dead.load(Relaxed),
            early: self.early.load(Relaxed),
            bytes_up: self.bytes_up.load(Relaxed),
            bytes_down: self.bytes_down.load(Relaxed),
            sockmap: self.sockmap.load(Relaxed),
            kernel_spliced: self.kernel_spliced.load(Relaxed),
            bytes_kernel: self.bytes_kernel.load(Relaxed),
            connects: self.connects.load(Relaxed),
            connect_micros: self.connect_micros.load(Relaxed),
            dns_lookups: self.dns_lookups.load(Relaxed),
            dns_failures: self.dns_failures.load(Relaxed),
            dns_changes: self.dns_changes.load(Relaxed),
            dns_addresses: self.dns_addresses.load(Relaxed),
        }
    }
}

/// The counters of [`Stats`] at one moment.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub accepted: u64,
    pub active: u64,
    pub refused: u64,
    pub pool_idle: u64,
    pub pool_misses: u64,
    pub pool_dead: u64,
    pub early: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub sockmap: u64,
    pub kernel_spliced: u64,
    pub bytes_kernel: u64,
    pub connects: u64,
    pub connect_micros: u64,
    pub dns_lookups: u64,
    pub dns_failures: u64,
    pub dns_changes: u64,
    pub dns_addresses: u64,
}
