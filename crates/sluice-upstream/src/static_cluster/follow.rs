//! Endpoint names that follow DNS (a static cluster's `resolve`), as NGINX's `server ...
//! resolve` and Envoy's STRICT_DNS clusters do: what each name resolved to, which of the
//! cluster's endpoints the names brought in, and when each is looked up next. The lookups
//! themselves run in `refresh`.
//!
//! An address that appears joins the cluster; one that no name has any more leaves it, unless
//! the configuration or the admin API put it there. A lookup that fails keeps the name's last
//! addresses and is asked again sooner, backing off.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::metrics::{NameMetrics, StaticMetrics};
use crate::dns::{Dns, LookupError};
use sluice_config::{HostPort, Resolve};

/// A cluster's followed names and what they resolved to.
#[derive(Debug)]
pub(super) struct Follow {
    dns: Dns,
    bounds: Resolve,
    names: Vec<Name>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct Name {
    name: HostPort,
    metrics: NameMetrics,
}

#[derive(Debug, Default)]
struct State {
    names: Vec<NameState>,
    /// Addresses a name brought into the cluster, which a name may take out again (one the
    /// configuration or the admin API added stays, whatever DNS says).
    owned: BTreeSet<SocketAddr>,
}

#[derive(Debug, Clone, Default)]
struct NameState {
    addrs: BTreeSet<SocketAddr>,
    /// A lookup found addresses at least once.
    resolved: bool,
    /// Failed lookups in a row, and the last one's error.
    failures: u32,
    last_error: Option<LookupError>,
    /// When the name is looked up next (`None`: at once).
    next_at: Option<Instant>,
}

/// A followed name as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowedName {
    /// `host:port`, as configured.
    pub name: String,
    /// Its addresses now: the last successful lookup's.
    pub addrs: Vec<SocketAddr>,
    /// Failed lookups in a row, and why the last one failed.
    pub failures: u32,
    /// Why the last lookup failed, if it did.
    pub last_error: Option<String>,
    /// How long until the next lookup.
    pub next_in: Duration,
}

impl Follow {
    pub(super) fn new(
        cluster: &str,
        names: &[HostPort],
        (dns, bounds): (Dns, Resolve),
        metrics: &StaticMetrics,
    ) -> Self {
        let names: Vec<Name> = names
            .iter()
            .map(|n| Name {
                metrics: metrics.name(cluster, &n.to_string()),
                name: n.clone(),
            })
            .collect();
        let state = State {
            names: vec![NameState::default(); names.len()],
            owned: BTreeSet::new(),
        };
        Self {
            dns,
            bounds,
            names,
            state: Mutex::new(state),
        }
    }

    /// How many names it follows.
    pub(super) fn len(&self) -> usize {
        self.names.len()
    }

    /// Name `i`.
    pub(super) fn name(&self, i: usize) -> &HostPort {
        &self.names[i].name
    }

    /// Where the names are looked up.
    pub(super) fn dns(&self) -> &Dns {
        &self.dns
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Each update finishes under the lock without panicking paths: a poisoned one is whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `addr` was added or removed by hand (or by a reload): DNS leaves it alone from now on.
    pub(super) fn disown(&self, addr: SocketAddr) {
        self.lock().owned.remove(&addr);
    }

    /// When name `i` is looked up next (`None`: at once).
    pub(super) fn next_at(&self, i: usize) -> Option<Instant> {
        self.lock().names[i].next_at
    }

    /// Name `i` is looked up again `after` this.
    pub(super) fn set_next(&self, i: usize, after: Duration) {
        self.lock().names[i].next_at = Some(Instant::now() + after);
    }

    /// Name `i` resolved to `now`: the addresses that appeared are offered to `add` (which
    /// says whether it added one: an address the cluster had already is not the names' to take
    /// out), and those that no name has any more and the names brought in are given to
    /// `remove`; all under the lock, so two names' answers apply one after the other. Counts
    /// the lookup, and says what changed.
    pub(super) fn resolved(
        &self,
        i: usize,
        now: BTreeSet<SocketAddr>,
        mut add: impl FnMut(SocketAddr) -> bool,
        mut remove: impl FnMut(SocketAddr),
    ) -> Change {
        let mut state = self.lock();
        let before = std::mem::take(&mut state.names[i]);
        let change = Change {
            came: diff(&now, &before.addrs),
            gone: diff(&before.addrs, &now),
            failures: before.failures,
        };
        let count = now.len();
        state.names[i] = NameState {
            addrs: now,
            resolved: true,
            next_at: before.next_at,
            ..NameState::default()
        };
        for addr in &change.came {
            if add(*addr) {
                state.owned.insert(*addr);
            }
        }
        for addr in &change.gone {
            let elsewhere = state.names.iter().any(|s| s.addrs.contains(addr));
            if !elsewhere && state.owned.remove(addr) {
                remove(*addr);
            }
        }
        drop(state);
        let changed = before.resolved && change.changed();
        self.names[i].metrics.resolved(count, changed);
        change
    }

    /// Name `i`'s lookup failed: its addresses stay. Counts it; failures in a row, and the
    /// addresses kept.
    pub(super) fn failed(&self, i: usize, error: &LookupError) -> (u32, usize) {
        self.names[i].metrics.failed(error.label());
        let mut state = self.lock();
        let s = &mut state.names[i];
        s.failures += 1;
        s.last_error = Some(error.clone());
        (s.failures, s.addrs.len())
    }

    /// The addresses the names brought in.
    pub(super) fn owned(&self) -> BTreeSet<SocketAddr> {
        self.lock().owned.clone()
    }

    /// The first name that never resolved, and why its last lookup failed (`None`: not looked
    /// up yet).
    pub(super) fn unresolved(&self) -> Option<(String, Option<LookupError>)> {
        let state = self.lock();
        let (i, s) = state.names.iter().enumerate().find(|(_, s)| !s.resolved)?;
        Some((self.names[i].name.to_string(), s.last_error.clone()))
    }

    /// Each name, its addresses and its lookups' state.
    pub(super) fn status(&self) -> Vec<FollowedName> {
        let state = self.lock();
        let now = Instant::now();
        let line = |(n, s): (&Name, &NameState)| FollowedName {
            name: n.name.to_string(),
            addrs: s.addrs.iter().copied().collect(),
            failures: s.failures,
            last_error: s.last_error.as_ref().map(ToString::to_string),
            next_in: s.next_at.map_or(Duration::ZERO, |at| at - now.min(at)),
        };
        self.names.iter().zip(&state.names).map(line).collect()
    }

    /// How long a good answer holds: its TTL within the cluster's bounds.
    pub(super) fn hold(&self, ttl: Duration) -> Duration {
        self.bounds.hold(ttl)
    }

    /// How long until the lookup after `failures` failed ones in a row.
    pub(super) fn backoff(&self, failures: u32) -> Duration {
        self.bounds.backoff(failures)
    }
}

/// What a good answer changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Change {
    /// Addresses the name has now and had not.
    pub(super) came: Vec<SocketAddr>,
    /// Addresses it had and has not now.
    pub(super) gone: Vec<SocketAddr>,
    /// Failed lookups in a row before this one.
    pub(super) failures: u32,
}

impl Change {
    fn changed(&self) -> bool {
        !self.came.is_empty() || !self.gone.is_empty()
    }
}

fn diff(a: &BTreeSet<SocketAddr>, b: &BTreeSet<SocketAddr>) -> Vec<SocketAddr> {
    a.difference(b).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(min: u64, max: u64) -> Follow {
        let bounds = Resolve {
            min_ttl: Duration::from_millis(min),
            max_ttl: Duration::from_millis(max),
        };
        Follow::new(
            "c",
            &[],
            (Dns::default(), bounds),
            &StaticMetrics::default(),
        )
    }

    fn addrs(list: &[&str]) -> BTreeSet<SocketAddr> {
        list.iter().map(|a| a.parse().expect("addr")).collect()
    }

    fn name(text: &str) -> HostPort {
        let (host, port) = text.split_once(':').expect("host:port");
        let port = port.parse().expect("port");
        HostPort {
            host: host.to_owned(),
            port,
        }
    }

    /// The cluster's endpoints as a set the callbacks of `resolved` change.
    #[derive(Default)]
    struct Cluster(std::cell::RefCell<BTreeSet<SocketAddr>>);

    impl Cluster {
        fn apply(&self, f: &Follow, i: usize, now: &[&str]) -> Change {
            let add = |a| self.0.borrow_mut().insert(a);
            let remove = |a| {
                self.0.borrow_mut().remove(&a);
            };
            f.resolved(i, addrs(now), add, remove)
        }
    }

    #[test]
    fn an_address_leaves_when_no_name_has_it_and_only_if_a_name_brought_it() {
        let names = [name("a.test:80"), name("b.test:80")];
        let metrics = StaticMetrics::default();
        let f = Follow::new("c", &names, (Dns::default(), Resolve::default()), &metrics);
        let cluster = Cluster::default();
        // Configured: 10.0.0.9 was in the cluster before any name gave it.
        cluster
            .0
            .borrow_mut()
            .insert("10.0.0.9:80".parse().expect("addr"));
        cluster.apply(&f, 0, &["10.0.0.1:80", "10.0.0.2:80", "10.0.0.9:80"]);
        cluster.apply(&f, 1, &["10.0.0.2:80"]);
        assert_eq!(f.unresolved(), None);
        // a.test moves on: .2 stays (b.test has it), .9 stays (configured), .1 leaves.
        let change = cluster.apply(&f, 0, &["10.0.0.3:80"]);
        assert_eq!(change.came, ["10.0.0.3:80".parse().expect("addr")]);
        let left = ["10.0.0.2:80", "10.0.0.3:80", "10.0.0.9:80"];
        assert_eq!(*cluster.0.borrow(), addrs(&left));
        // b.test drops .2, which no name has any more.
        cluster.apply(&f, 1, &[]);
        assert_eq!(*cluster.0.borrow(), addrs(&["10.0.0.3:80", "10.0.0.9:80"]));
        assert_eq!(f.owned(), addrs(&["10.0.0.3:80"]));
    }

    #[test]
    fn an_address_removed_by_hand_stays_out_until_the_name_drops_and_gives_it_again() {
        let metrics = StaticMetrics::default();
        let bounds = (Dns::default(), Resolve::default());
        let f = Follow::new("c", &[name("a.test:80")], bounds, &metrics);
        let cluster = Cluster::default();
        cluster.apply(&f, 0, &["10.0.0.1:80", "10.0.0.2:80"]);
        // `remove_endpoint` by hand: disowned, and out of the cluster.
        let by_hand: SocketAddr = "10.0.0.2:80".parse().expect("addr");
        f.disown(by_hand);
        cluster.0.borrow_mut().remove(&by_hand);
        cluster.apply(&f, 0, &["10.0.0.1:80", "10.0.0.2:80"]);
        assert_eq!(*cluster.0.borrow(), addrs(&["10.0.0.1:80"]), "no change");
        cluster.apply(&f, 0, &["10.0.0.1:80"]);
        cluster.apply(&f, 0, &["10.0.0.1:80", "10.0.0.2:80"]);
        assert_eq!(*cluster.0.borrow(), addrs(&["10.0.0.1:80", "10.0.0.2:80"]));
    }

    #[test]
    fn a_failed_lookup_keeps_the_addresses_and_a_name_never_resolved_is_named() {
        let metrics = StaticMetrics::default();
        let bounds = (Dns::default(), Resolve::default());
        let f = Follow::new("c", &[name("a.test:80")], bounds, &metrics);
        assert_eq!(f.unresolved(), Some(("a.test:80".to_owned(), None)));
        assert_eq!(f.failed(0, &LookupError::Timeout), (1, 0));
        let why = Some(LookupError::Timeout);
        assert_eq!(f.unresolved(), Some(("a.test:80".to_owned(), why)));
        Cluster::default().apply(&f, 0, &["10.0.0.1:80"]);
        assert_eq!(f.failed(0, &LookupError::NoSuchName), (1, 1));
        let kept: Vec<SocketAddr> = addrs(&["10.0.0.1:80"]).into_iter().collect();
        assert_eq!(f.status()[0].addrs, kept);
        assert_eq!(f.unresolved(), None, "it resolved once");
    }

    #[test]
    fn an_answer_holds_for_its_ttl_within_the_bounds() {
        let f = follow(1_000, 60_000);
        assert_eq!(f.hold(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(f.hold(Duration::from_secs(20)), Duration::from_secs(20));
        assert_eq!(f.hold(Duration::from_secs(86_400)), Duration::from_secs(60));
    }

    #[test]
    fn failed_lookups_back_off_from_the_floor_to_a_cap() {
        let f = follow(1_000, 300_000);
        let secs: Vec<u64> = (1..=7).map(|n| f.backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
        let short = follow(100, 500);
        assert_eq!(
            short.backoff(40),
            Duration::from_millis(500),
            "max_ttl caps it"
        );
    }
}
