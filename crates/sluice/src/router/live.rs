//! [`LiveRoutes`]: the configured routes, changeable while requests flow (the admin API's
//! `/routes`). Each change builds a new list and swaps it in atomically: a request sees the
//! old list or the new one, never a mix, and requests in flight keep the route they matched.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use sluice_config::HostMatch;

use super::matcher::Matcher;
use super::route::{RequestHead, Route, Routing, Target};
use super::table::RouteTable;
use sluice_upstream::Upstream;

/// A route as the admin API shows and takes it: match conditions and a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouteSpec {
    /// Unique name (logs, metrics, deletion).
    pub name: String,
    /// Any of these hosts, exact or `*.suffix` (empty: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Path prefix (absent: any path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Compare the path prefix without regard to ASCII case.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub case_insensitive: bool,
    /// Any of these methods (empty: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// The client in any of these networks (empty: any), the paper's client-class slicing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_cidr: Vec<String>,
    /// The cluster to forward to; absent for a configured direct response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The reverse cluster's slice (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<String>,
    /// Read only: the route also needs header values, edits headers, rewrites its path or has
    /// limits (set in the file).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub configured_extras: bool,
}

/// `config`'s routes, as `table` compiled them.
fn entries(config: &sluice_config::Config, table: RouteTable) -> Vec<Entry> {
    let compiled = config.routes.iter().zip(table.into_entries());
    compiled
        .map(|(r, (matcher, route))| Entry {
            spec: spec_of(r),
            matcher,
            route,
        })
        .collect()
}

/// Why a route could not be added or removed; each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RouteError {
    /// A field is malformed.
    #[error("{0}")]
    Invalid(String),
    /// No route has this name.
    #[error("no route named {0:?}")]
    NotFound(String),
    /// A route with this name exists.
    #[error("a route named {0:?} exists; delete it first or pick another name")]
    Exists(String),
}

#[derive(Debug)]
struct Entry {
    spec: RouteSpec,
    matcher: Matcher,
    route: Arc<Route>,
}

/// The routes in order (first match wins), swapped whole on every change.
#[derive(Debug)]
pub(crate) struct LiveRoutes {
    current: ArcSwap<Vec<Entry>>,
    clusters: BTreeMap<String, Upstream>,
    /// Serializes changes: each one reads the list it replaces.
    change: Mutex<()>,
}

impl Routing for LiveRoutes {
    fn route(&self, head: &RequestHead<'_>) -> Option<Arc<Route>> {
        let routes = self.current.load();
        routes
            .iter()
            .find(|e| e.matcher.matches(head))
            .map(|e| Arc::clone(&e.route))
    }

    fn reads_headers(&self) -> bool {
        self.current
            .load()
            .iter()
            .any(|e| e.matcher.reads_headers())
    }
}

impl LiveRoutes {
    /// The configured routes of `config`, forwarding to `clusters`.
    pub(crate) fn from_config(
        config: &sluice_config::Config,
        clusters: &BTreeMap<String, Upstream>,
    ) -> Self {
        let table = RouteTable::from_config(config, clusters);
        Self {
            current: ArcSwap::from_pointee(entries(config, table)),
            clusters: clusters.clone(),
            change: Mutex::new(()),
        }
    }

    /// Replaces every route with those of `config` at once (a reload); the clusters must be
    /// the ones this table was built with.
    pub(crate) fn replace_all(&self, config: &sluice_config::Config) {
        let _change = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.current.load_full();
        // A route that keeps its name and match keeps the state of the features whose
        // configuration it keeps (a limit's buckets; an unnamed route's name is its place,
        // which another may take).
        let kept = |r: &sluice_config::Route, key: &'static str| {
            let spec = spec_of(r);
            let route = &old.iter().find(|e| e.spec == spec)?.route;
            let kept = route.registered().iter().find(|f| f.name() == key)?;
            Some(Arc::clone(kept))
        };
        let table = RouteTable::from_config_keeping(config, &self.clusters, &kept);
        self.current.store(Arc::new(entries(config, table)));
    }

    /// The route named `name`, as requests get it now.
    pub(crate) fn named(&self, name: &str) -> Option<Arc<Route>> {
        let routes = self.current.load();
        let entry = routes.iter().find(|e| e.spec.name == name)?;
        Some(Arc::clone(&entry.route))
    }

    /// The routes in match order.
    pub(crate) fn list(&self) -> Vec<RouteSpec> {
        self.current.load().iter().map(|e| e.spec.clone()).collect()
    }

    /// Inserts a route at `position` (0: matched first; past the end: last).
    pub(crate) fn add(&self, spec: RouteSpec, position: usize) -> Result<(), RouteError> {
        let entry = self.compile(spec)?;
        let _change = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.current.load();
        if old.iter().any(|e| e.spec.name == entry.spec.name) {
            return Err(RouteError::Exists(entry.spec.name));
        }
        let mut new: Vec<Entry> = old.iter().map(Entry::cloned).collect();
        new.insert(position.min(new.len()), entry);
        self.current.store(Arc::new(new));
        Ok(())
    }

    /// Removes the route named `name`.
    pub(crate) fn remove(&self, name: &str) -> Result<RouteSpec, RouteError> {
        let _change = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.current.load();
        let index = old
            .iter()
            .position(|e| e.spec.name == name)
            .ok_or_else(|| RouteError::NotFound(name.to_owned()))?;
        let mut new: Vec<Entry> = old.iter().map(Entry::cloned).collect();
        let removed = new.remove(index);
        self.current.store(Arc::new(new));
        Ok(removed.spec)
    }

    fn compile(&self, spec: RouteSpec) -> Result<Entry, RouteError> {
        let invalid = |msg: String| RouteError::Invalid(msg);
        if spec.name.is_empty() || spec.name.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(invalid(
                "name must be non-empty, without spaces or '/'".into(),
            ));
        }
        if spec.configured_extras {
            return Err(invalid("configured_extras is read-only".into()));
        }
        let cluster = spec
            .cluster
            .as_deref()
            .ok_or_else(|| invalid("cluster is required".into()))?;
        let upstream = self
            .clusters
            .get(cluster)
            .ok_or_else(|| invalid(format!("no cluster {cluster:?}")))?;
        let target = match (upstream, spec.slice.as_deref()) {
            (Upstream::Reverse(s), slice) => Upstream::Reverse(
                s.cluster()
                    .slice(slice.unwrap_or(sluice_config::DEFAULT_SLICE)),
            ),
            (Upstream::Static(_), Some(_)) => {
                return Err(invalid(format!(
                    "slice needs a reverse cluster; {cluster:?} is static"
                )))
            }
            (u, None) => u.clone(),
        };
        let matcher = Matcher::from(&sluice_config::Match {
            hosts: parse_all(&spec.hosts, HostMatch::parse)?,
            path_prefix: path(spec.path_prefix.as_deref())?,
            case_insensitive: spec.case_insensitive,
            methods: parse_all(&spec.methods, sluice_config::parse_method)?,
            headers: Vec::new(),
            client_cidrs: parse_all(&spec.client_cidr, sluice_config::parse_cidr)?,
        });
        let route = Arc::new(Route::new(spec.name.clone(), Target::Upstream(target)));
        Ok(Entry {
            spec,
            matcher,
            route,
        })
    }
}

impl Entry {
    fn cloned(&self) -> Self {
        Self {
            spec: self.spec.clone(),
            matcher: self.matcher.clone(),
            route: Arc::clone(&self.route),
        }
    }
}

/// Parses every value with the configuration file's own rules (one source of truth).
fn parse_all<T>(
    values: &[String],
    parse: fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, RouteError> {
    values
        .iter()
        .map(|v| parse(v).map_err(RouteError::Invalid))
        .collect()
}

fn path(p: Option<&str>) -> Result<Option<String>, RouteError> {
    match p {
        Some(p) if !p.starts_with('/') => Err(RouteError::Invalid(format!(
            "path_prefix {p:?} must start with '/'"
        ))),
        other => Ok(other.map(str::to_owned)),
    }
}

/// How a configured route shows in the admin API.
fn spec_of(r: &sluice_config::Route) -> RouteSpec {
    let m = &r.matcher;
    let hosts = m
        .hosts
        .iter()
        .map(|h| match h {
            HostMatch::Exact(h) => h.clone(),
            HostMatch::Suffix(s) => format!("*{s}"),
        })
        .collect();
    let cluster = match &r.action {
        sluice_config::Action::Proxy { cluster } => Some(cluster.clone()),
        sluice_config::Action::Direct(_) => None,
    };
    let extras = !m.headers.is_empty()
        || r.rewrite.is_some()
        || r.request_headers != Default::default()
        || r.response_headers != Default::default()
        || r.max_request_body.is_some()
        || super::registry::any_wanted(r);
    RouteSpec {
        name: r.name.clone(),
        hosts,
        path_prefix: m.path_prefix.clone(),
        case_insensitive: m.case_insensitive,
        methods: m.methods.iter().map(ToString::to_string).collect(),
        client_cidr: m.client_cidrs.iter().map(ToString::to_string).collect(),
        slice: (r.slice != sluice_config::DEFAULT_SLICE).then(|| r.slice.clone()),
        cluster,
        configured_extras: extras,
    }
}
