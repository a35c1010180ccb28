//! A next hop by name that follows DNS (`to = "host:port"` with `resolve`): the relay looks it up
//! before it accepts, then again whenever the answer's TTL (within bounds) runs out, in a task
//! of its own. New connections (and pool refills) go to the addresses it has then; connections
//! already relayed finish where they are; pooled ones to an address that went are closed; a
//! failed lookup keeps the last addresses. Each lookup is logged as an operator needs it and
//! counted in the relay's [`Stats`].

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use sluice_net::dns::{Followed, Looked};

use crate::stats::Stats;

/// Looks `followed` up once, now: the relay starts with the addresses it has (none, if it
/// failed: connections are refused until a later lookup finds some).
pub(crate) async fn first(relay: &str, followed: &Followed, stats: &Stats) {
    let looked = followed.refresh().await;
    seen(relay, followed, stats, &looked);
}

/// Follows the name until the task is dropped (the relay stops).
pub(crate) async fn follow(relay: String, followed: Arc<Followed>, stats: Arc<Stats>) {
    followed
        .run(|looked| seen(&relay, &followed, &stats, looked))
        .await;
}

/// Logs a lookup and updates the relay's counters.
fn seen(relay: &str, followed: &Followed, stats: &Stats, looked: &Looked) {
    let status = followed.status();
    stats.dns_lookups.store(status.lookups, Relaxed);
    stats.dns_failures.store(status.lookup_failures, Relaxed);
    stats.dns_changes.store(status.changes, Relaxed);
    stats
        .dns_addresses
        .store(status.addrs.len() as u64, Relaxed);
    let name = followed.name();
    match looked {
        Looked::Resolved { came, .. } if status.lookups == 1 => {
            tracing::info!(%relay, %name, addrs = ?came, "next hop resolved");
        }
        Looked::Resolved { came, gone, .. } if !came.is_empty() || !gone.is_empty() => {
            tracing::info!(%relay, %name, added = ?came, removed = ?gone, "next hop resolved to other addresses; new connections go there");
        }
        Looked::Resolved { failures, .. } if *failures > 0 => {
            tracing::info!(%relay, %name, failures, "next hop resolves again");
        }
        Looked::Resolved { .. } => {}
        // The first failure in a row is a warning; the rest, until it resolves again, debug.
        Looked::Failed {
            error,
            failures: 1,
            kept: 0,
        } => {
            tracing::warn!(%relay, %name, %error, "next hop lookup failed; it has no addresses yet, so clients are refused until it resolves");
        }
        Looked::Failed {
            error,
            failures: 1,
            kept,
        } => {
            tracing::warn!(%relay, %name, %error, kept, "next hop lookup failed; keeping its last addresses");
        }
        Looked::Failed {
            error, failures, ..
        } => {
            tracing::debug!(%relay, %name, %error, failures, "next hop lookup failed again");
        }
    }
}
