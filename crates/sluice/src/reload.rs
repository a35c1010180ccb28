//! Reload in place: when a re-read configuration differs from the running one only in its
//! routes and its static clusters' endpoints, the change is applied inside the running
//! process (the route table swapped at once, endpoints added and removed), so client
//! connections, sessions and everything else carry on. Anything else (listeners, the
//! acceptor, cluster settings, …) needs a new process: a hot restart (`docs/handoff.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use sluice_config::{ClusterKind, Config};

use crate::router::LiveRoutes;
use crate::upstream::Upstream;

/// What a reload changed in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Whether the routes changed.
    pub routes: bool,
    /// Endpoints added and removed, as `cluster addr`.
    pub added: Vec<String>,
    /// Endpoints removed.
    pub removed: Vec<String>,
}

/// The running configuration and the parts a reload may change in place.
#[derive(Debug, Clone)]
pub struct InPlace {
    running: Arc<Mutex<Config>>,
    routes: Arc<LiveRoutes>,
    clusters: BTreeMap<String, Upstream>,
}

impl InPlace {
    pub(crate) fn new(
        config: &Config,
        routes: Arc<LiveRoutes>,
        clusters: BTreeMap<String, Upstream>,
    ) -> Self {
        Self {
            running: Arc::new(Mutex::new(config.clone())),
            routes,
            clusters,
        }
    }

    /// Applies `new` in place when only routes and static endpoints differ; `None` (and no
    /// change) when something else differs and a new process must take over.
    pub fn apply(&self, new: &Config) -> Option<Applied> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if !same_but_routes_and_endpoints(&running, new) {
            return None;
        }
        let routes = running.routes != new.routes;
        if routes {
            self.routes.replace_all(new);
        }
        let mut applied = Applied {
            routes,
            added: Vec::new(),
            removed: Vec::new(),
        };
        for (name, cluster) in &new.clusters {
            let (ClusterKind::Static(s), Some(Upstream::Static(live))) =
                (&cluster.kind, self.clusters.get(name))
            else {
                continue;
            };
            let want: BTreeSet<_> = s.endpoints.iter().copied().collect();
            let have: BTreeSet<_> = live.endpoints().iter().map(|e| e.addr()).collect();
            for addr in want.difference(&have) {
                live.add_endpoint(*addr);
                applied.added.push(format!("{name} {addr}"));
            }
            for addr in have.difference(&want) {
                live.remove_endpoint(*addr);
                applied.removed.push(format!("{name} {addr}"));
            }
        }
        *running = new.clone();
        Some(applied)
    }
}

/// Whether `a` and `b` differ in nothing but routes and static clusters' endpoints.
fn same_but_routes_and_endpoints(a: &Config, b: &Config) -> bool {
    let without = |c: &Config| {
        let mut c = c.clone();
        c.routes.clear();
        c.source.clear();
        for cluster in c.clusters.values_mut() {
            if let ClusterKind::Static(s) = &mut cluster.kind {
                s.endpoints.clear();
            }
        }
        c
    };
    without(a) == without(b)
}
