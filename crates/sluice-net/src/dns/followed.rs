//! [`Followed`]: one `host:port` whose addresses are looked up when the caller starts and again
//! whenever the answer's TTL (within [`Resolve`]'s bounds) runs out, as NGINX's `resolve` and
//! Envoy's LOGICAL_DNS clusters do. A failed lookup keeps the last addresses and is asked again
//! sooner, backing off. Whoever connects reads [`Followed::addrs`] for each new connection;
//! connections made before a change are theirs to finish.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::lookup::{Dns, HostPort, LookupError, Resolve};

/// A name followed, and what it resolved to.
#[derive(Debug)]
pub struct Followed {
    name: HostPort,
    dns: Dns,
    bounds: Resolve,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The last good answer's addresses, in its order (IPv4 first).
    addrs: Arc<[SocketAddr]>,
    /// A lookup found addresses at least once.
    resolved: bool,
    /// Failed lookups in a row, and the last one's error.
    failures: u32,
    last_error: Option<LookupError>,
    /// When the name is looked up next (`None`: at once).
    next_at: Option<Instant>,
    /// Good answers, failed lookups, and good answers that changed the addresses, all told.
    lookups: u64,
    lookup_failures: u64,
    changes: u64,
}

/// What one lookup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Looked {
    /// A good answer: the addresses that came and those that went since the last good one (on
    /// the first, every address came), after `failures` failed lookups in a row.
    Resolved {
        came: Vec<SocketAddr>,
        gone: Vec<SocketAddr>,
        failures: u32,
    },
    /// No answer: the name keeps its `kept` addresses. `failures` in a row, this one included.
    Failed {
        error: LookupError,
        failures: u32,
        kept: usize,
    },
}

/// A followed name as `/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowedStatus {
    /// `host:port`, as configured.
    pub name: String,
    /// Its addresses now: the last good answer's.
    pub addrs: Vec<SocketAddr>,
    /// Failed lookups in a row.
    pub failures: u32,
    /// Why the last lookup failed, if it did.
    pub last_error: Option<String>,
    /// How long until the next lookup.
    pub next_in: Duration,
    /// Good answers, all told.
    pub lookups: u64,
    /// Failed lookups, all told.
    pub lookup_failures: u64,
    /// Good answers that changed the addresses.
    pub changes: u64,
}

impl Followed {
    /// `name`, looked up with `dns`; nothing is asked until [`refresh`](Self::refresh) or
    /// [`run`](Self::run).
    pub fn new(name: HostPort, dns: Dns, bounds: Resolve) -> Self {
        Self {
            name,
            dns,
            bounds,
            state: Mutex::new(State::default()),
        }
    }

    /// The name.
    pub fn name(&self) -> &HostPort {
        &self.name
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Each update finishes under the lock without panicking paths: a poisoned one is whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its addresses now: empty until a lookup found some.
    pub fn addrs(&self) -> Arc<[SocketAddr]> {
        Arc::clone(&self.lock().addrs)
    }

    /// Whether `addr` is among its addresses now.
    pub fn has(&self, addr: SocketAddr) -> bool {
        self.lock().addrs.contains(&addr)
    }

    /// Looks the name up now and applies the answer; the next lookup is due when the answer's
    /// TTL (within the bounds) runs out, or sooner after a failure.
    pub async fn refresh(&self) -> Looked {
        let looked = self.dns.lookup(&self.name.host).await;
        let mut state = self.lock();
        let (looked, next) = match looked {
            Ok(resolved) => {
                let port = self.name.port;
                let now: Vec<SocketAddr> = resolved
                    .addrs
                    .iter()
                    .map(|ip| SocketAddr::new(*ip, port))
                    .collect();
                let looked = apply(&mut state, now);
                (looked, self.bounds.hold(resolved.ttl))
            }
            Err(error) => {
                state.failures = state.failures.saturating_add(1);
                state.lookup_failures += 1;
                state.last_error = Some(error.clone());
                let failures = state.failures;
                let kept = state.addrs.len();
                let next = self.bounds.backoff(failures);
                let looked = Looked::Failed {
                    error,
                    failures,
                    kept,
                };
                (looked, next)
            }
        };
        state.next_at = Some(Instant::now() + next);
        looked
    }

    /// Looks the name up whenever it is due (at once if it never was), until dropped; `seen`
    /// hears of each lookup (to log and count it).
    pub async fn run(&self, mut seen: impl FnMut(&Looked)) {
        loop {
            let next_at = self.lock().next_at;
            if let Some(at) = next_at {
                tokio::time::sleep_until(at).await;
            }
            seen(&self.refresh().await);
        }
    }

    /// The name, its addresses and its lookups' state.
    pub fn status(&self) -> FollowedStatus {
        let s = self.lock();
        let now = Instant::now();
        FollowedStatus {
            name: self.name.to_string(),
            addrs: s.addrs.to_vec(),
            failures: s.failures,
            last_error: s.last_error.as_ref().map(ToString::to_string),
            next_in: s.next_at.map_or(Duration::ZERO, |at| at - now.min(at)),
            lookups: s.lookups,
            lookup_failures: s.lookup_failures,
            changes: s.changes,
        }
    }
}

/// Puts a good answer's addresses `now` in place; what came and went.
fn apply(state: &mut State, now: Vec<SocketAddr>) -> Looked {
    let before: BTreeSet<SocketAddr> = state.addrs.iter().copied().collect();
    let after: BTreeSet<SocketAddr> = now.iter().copied().collect();
    let came: Vec<SocketAddr> = after.difference(&before).copied().collect();
    let gone: Vec<SocketAddr> = before.difference(&after).copied().collect();
    let changed = !came.is_empty() || !gone.is_empty();
    if state.resolved && changed {
        state.changes += 1;
    }
    let failures = std::mem::take(&mut state.failures);
    state.addrs = now.into();
    state.resolved = true;
    state.last_error = None;
    state.lookups += 1;
    Looked::Resolved {
        came,
        gone,
        failures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().expect("addr")).collect()
    }

    #[test]
    fn an_answer_says_what_came_and_went_and_only_a_change_after_the_first_counts() {
        let mut state = State::default();
        let first = apply(&mut state, addrs(&["10.0.0.1:80", "10.0.0.2:80"]));
        let Looked::Resolved { came, gone, .. } = first else {
            panic!("resolved");
        };
        assert_eq!((came.len(), gone.len(), state.changes), (2, 0, 0));
        state.failures = 2;
        let second = apply(&mut state, addrs(&["10.0.0.2:80", "10.0.0.3:80"]));
        let expected = Looked::Resolved {
            came: addrs(&["10.0.0.3:80"]),
            gone: addrs(&["10.0.0.1:80"]),
            failures: 2,
        };
        assert_eq!(second, expected);
        assert_eq!((state.changes, state.failures, state.lookups), (1, 0, 2));
        apply(&mut state, addrs(&["10.0.0.3:80", "10.0.0.2:80"]));
        assert_eq!(
            state.changes, 1,
            "the same set in another order is no change"
        );
    }
}
