//! The lookups of a static cluster's followed names (`follow`): all of them once when the
//! proxy starts ([`resolve_all`]), then each by a task of its own ([`spawn`]) whenever its
//! answer's TTL has run out, clamped to the cluster's `min_ttl`..`max_ttl`.
//!
//! An address that appears joins the balancer (after its first passing health check, when
//! the cluster has checks); one that disappears is removed as `remove_endpoint` removes one:
//! requests in flight to it finish, its idle connections close.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::{debug, info, warn};

use super::follow::{Change, Follow};
use super::{drop_endpoint, insert_endpoint, Inner};
use crate::dns::{LookupError, Resolved};

/// Looks every name up once, together: the cluster starts with the addresses they have now.
pub(super) async fn resolve_all(inner: &Arc<Inner>) {
    let Some(follow) = &inner.follow else { return };
    let lookups = (0..follow.len()).map(|i| refresh(inner, i, true));
    futures_util::future::join_all(lookups).await;
}

/// Starts each name's task, which ends when the cluster is dropped.
pub(super) fn spawn(inner: &Arc<Inner>) {
    let Some(follow) = &inner.follow else { return };
    for i in 0..follow.len() {
        tokio::spawn(follow_loop(Arc::downgrade(inner), i));
    }
}

async fn follow_loop(cluster: Weak<Inner>, i: usize) {
    loop {
        let next_at = {
            let Some(inner) = cluster.upgrade() else {
                return;
            };
            let Some(follow) = &inner.follow else { return };
            follow.next_at(i)
        };
        if let Some(at) = next_at {
            tokio::time::sleep_until(at).await;
        }
        let Some(inner) = cluster.upgrade() else {
            return;
        };
        refresh(&inner, i, false).await;
    }
}

/// Looks name `i` up and applies its answer; `initial`: the cluster has not served yet, so
/// new addresses need not wait for a health check.
async fn refresh(inner: &Arc<Inner>, i: usize, initial: bool) {
    let Some(follow) = &inner.follow else { return };
    let looked = follow.dns().lookup(&follow.name(i).host).await;
    let delay = match looked {
        Ok(resolved) => resolved_to(inner, follow, i, &resolved, initial),
        Err(error) => failed(inner, follow, i, &error),
    };
    follow.set_next(i, delay);
}

/// Applies a good answer. The next lookup is due when its TTL (within bounds) runs out.
fn resolved_to(
    inner: &Arc<Inner>,
    follow: &Follow,
    i: usize,
    resolved: &Resolved,
    initial: bool,
) -> Duration {
    let port = follow.name(i).port;
    let now: BTreeSet<SocketAddr> = resolved
        .addrs
        .iter()
        .map(|ip| SocketAddr::new(*ip, port))
        .collect();
    let pending = !initial && inner.opts.health_check.is_some();
    let add = |addr| insert_endpoint(inner, addr, pending);
    let remove = |addr| {
        drop_endpoint(inner, addr);
    };
    let change = follow.resolved(i, now, add, remove);
    report(inner, follow, i, &change);
    follow.hold(resolved.ttl)
}

/// The line an operator needs when a name's addresses changed, or it resolved again after
/// failing.
fn report(inner: &Inner, follow: &Follow, i: usize, change: &Change) {
    let name = follow.name(i);
    let (came, gone) = (&change.came, &change.gone);
    if !came.is_empty() || !gone.is_empty() {
        info!(cluster = %inner.name, %name, added = ?came, removed = ?gone, "endpoint name resolved to other addresses");
    } else if change.failures > 0 {
        info!(cluster = %inner.name, %name, failures = change.failures, "endpoint name resolves again");
    }
}

/// Keeps the name's last addresses after a failed lookup, and asks again sooner.
fn failed(inner: &Inner, follow: &Follow, i: usize, error: &LookupError) -> Duration {
    let (failures, kept) = follow.failed(i, error);
    let name = follow.name(i);
    // The first failure in a row is a warning; the rest, until it resolves again, are counted.
    match (failures, kept) {
        (1, 0) => {
            warn!(cluster = %inner.name, %name, %error, "endpoint name lookup failed; the name has no addresses yet")
        }
        (1, _) => {
            warn!(cluster = %inner.name, %name, %error, kept, "endpoint name lookup failed; keeping its last addresses")
        }
        _ => {
            debug!(cluster = %inner.name, %name, %error, failures, "endpoint name lookup failed again")
        }
    }
    follow.backoff(failures)
}
