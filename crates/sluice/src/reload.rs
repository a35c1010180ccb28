//! Reload in place: when a re-read configuration differs from the running one only in its
//! routes, its static clusters' endpoints and the contents of listeners' certificate files
//! (the same paths: a renewal), the change is applied inside the running process (the route
//! table swapped at once, endpoints added and removed, certificates swapped for new
//! handshakes), so client connections, sessions and everything else carry on. Anything else
//! (listeners, the acceptor, cluster settings, …) needs a new process: a hot restart
//! (`docs/handoff.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use sluice_config::{ClusterKind, Config};

use tracing::warn;

use crate::router::LiveRoutes;
use crate::server::tls::Certificates;
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
    /// Listeners whose certificates were replaced.
    pub certificates: Vec<String>,
}

/// The running configuration and the parts a reload may change in place.
#[derive(Debug, Clone)]
pub struct InPlace {
    running: Arc<Mutex<Config>>,
    routes: Arc<LiveRoutes>,
    clusters: BTreeMap<String, Upstream>,
    certificates: BTreeMap<String, Arc<Certificates>>,
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
            certificates: BTreeMap::new(),
        }
    }

    /// Lets reloads replace these listeners' certificates (by listener name).
    pub(crate) fn with_certificates(
        mut self,
        certificates: BTreeMap<String, Arc<Certificates>>,
    ) -> Self {
        self.certificates = certificates;
        self
    }

    /// Applies `new` in place when only routes, static endpoints and certificate contents
    /// differ; `None` (and no change) when something else differs, or new certificates cannot
    /// be loaded here, and a new process must take over.
    pub fn apply(&self, new: &Config) -> Option<Applied> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if !same_but_in_place_parts(&running, new) {
            return None;
        }
        let certificates = self.replace_certificates(&running, new)?;
        let routes = running.routes != new.routes;
        if routes {
            self.routes.replace_all(new);
        }
        let mut applied = Applied {
            routes,
            added: Vec::new(),
            removed: Vec::new(),
            certificates,
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

impl InPlace {
    /// Swaps in the certificates of every listener whose files changed (the names of those
    /// listeners); `None` if one cannot be loaded here (or has no live certificates to
    /// replace), and then nothing changed.
    fn replace_certificates(&self, running: &Config, new: &Config) -> Option<Vec<String>> {
        let changed = new.listeners.iter().filter(|l| {
            let old = running.listeners.iter().find(|o| o.name == l.name);
            old.is_some_and(|o| o.tls != l.tls)
        });
        let mut loaded = Vec::new();
        for listener in changed {
            let live = self.certificates.get(&listener.name)?;
            match Certificates::load(&listener.tls) {
                Ok(next) => loaded.push((listener.name.clone(), live, next)),
                Err(error) => {
                    warn!(listener = %listener.name, %error, "cannot load the new certificates in place");
                    return None;
                }
            }
        }
        let names = loaded.iter().map(|(name, ..)| name.clone()).collect();
        for (_, live, next) in loaded {
            live.swap(next);
        }
        Some(names)
    }
}

/// Whether `a` and `b` differ in nothing but routes, static clusters' endpoints and the
/// contents of listeners' certificate files.
fn same_but_in_place_parts(a: &Config, b: &Config) -> bool {
    let without = |c: &Config| {
        let mut c = c.clone();
        c.routes.clear();
        c.source.clear();
        for cluster in c.clusters.values_mut() {
            if let ClusterKind::Static(s) = &mut cluster.kind {
                s.endpoints.clear();
            }
        }
        for tls in c.listeners.iter_mut().flat_map(|l| l.tls.iter_mut()) {
            tls.cert_pem.clear();
            tls.key_pem.clear();
        }
        c
    };
    without(a) == without(b)
}
