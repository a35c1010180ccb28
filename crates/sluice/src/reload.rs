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

use crate::router::{LiveRoutes, RouteTable};
use sluice_server::tls::Certificates;
use sluice_upstream::Upstream;

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
        // A part this build leaves out is refused by a new process (`Proxy::bind`), which
        // says why; in place it would be served without it.
        if !same_but_in_place_parts(&running, new) || RouteTable::unbuilt(new).is_some() {
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
            // What names that follow DNS brought in is theirs to keep or take out.
            let followed = live.followed_addrs();
            let live_addrs = live.endpoints().into_iter().map(|e| e.addr());
            let have: BTreeSet<_> = live_addrs.filter(|a| !followed.contains(a)).collect();
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
    /// What `new` changes against the running configuration, section by section, for a
    /// reload that takes a new process to say why it does: `listener public changed`,
    /// `cluster api added`, `[acceptor] changed`, … Empty when nothing differs.
    pub fn differences(&self, new: &Config) -> Vec<String> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        differences(&running, new)
    }

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
        // Each route with a global limit carries its service's definition: a changed one
        // changes those routes, rebuilt in place.
        c.rate_limit_services.clear();
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

/// Each section of `b` that differs from `a`, named.
fn differences(a: &Config, b: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut section = |name: &str, differ: bool| {
        if differ {
            out.push(format!("{name} changed"));
        }
    };
    section("[runtime]", a.runtime != b.runtime);
    section("[acceptor]", a.acceptor != b.acceptor);
    section("[handoff]", a.handoff != b.handoff);
    section("[admin]", a.admin != b.admin);
    section("[access_log]", a.access_log != b.access_log);
    section("[request_id]", a.request_id != b.request_id);
    section("[tracing]", a.tracing != b.tracing);
    section("[dns]", a.dns != b.dns);
    section("routes", a.routes != b.routes);
    let listeners = |c: &Config| -> BTreeMap<String, sluice_config::Listener> {
        c.listeners
            .iter()
            .map(|l| (l.name.clone(), l.clone()))
            .collect()
    };
    let relays = |c: &Config| -> BTreeMap<String, sluice_config::Relay> {
        c.relays
            .iter()
            .map(|r| (r.name.clone(), r.clone()))
            .collect()
    };
    named("listener", &listeners(a), &listeners(b), &mut out);
    named("cluster", &a.clusters, &b.clusters, &mut out);
    named("relay", &relays(a), &relays(b), &mut out);
    out
}

/// `<kind> <name> added`, `removed` or `changed`, for every name whose entry differs.
fn named<T: PartialEq>(
    kind: &str,
    a: &BTreeMap<String, T>,
    b: &BTreeMap<String, T>,
    out: &mut Vec<String>,
) {
    for (name, new) in b {
        match a.get(name) {
            None => out.push(format!("{kind} {name} added")),
            Some(old) if old != new => out.push(format!("{kind} {name} changed")),
            Some(_) => {}
        }
    }
    out.extend(
        a.keys()
            .filter(|n| !b.contains_key(*n))
            .map(|n| format!("{kind} {n} removed")),
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn config(text: &str) -> Config {
        sluice_config::parse_str(text, "t.toml", std::path::Path::new(".")).unwrap()
    }

    /// Issue 28, item 13: a reload that needs a new process says what changed.
    #[test]
    fn differences_name_each_changed_section() {
        let base = r#"
[[listener]]
name = "public"
listen = "127.0.0.1:8080"
[[route]]
cluster = "a"
[cluster.a]
kind = "static"
endpoints = ["127.0.0.1:9001"]
"#;
        let changed = r#"
[runtime]
shutdown_grace = "5s"
[[listener]]
name = "public"
listen = "127.0.0.1:8081"
[[listener]]
name = "internal"
listen = "127.0.0.1:8082"
[[route]]
cluster = "b"
[cluster.b]
kind = "static"
endpoints = ["127.0.0.1:9001"]
"#;
        assert!(differences(&config(base), &config(base)).is_empty());
        assert_eq!(
            differences(&config(base), &config(changed)),
            [
                "[runtime] changed",
                "routes changed",
                "listener internal added",
                "listener public changed",
                "cluster b added",
                "cluster a removed",
            ]
        );
    }
}
