//! [`RouteTable`]: configured routes, evaluated in order.

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_config::{Action, Config};

use super::matcher::Matcher;
use super::registry;
use super::route::{Direct, RequestHead, Route, Routing, Target};
use sluice_core::route_feature::RouteFeature;
use sluice_upstream::Upstream;

/// The feature a route had before a reload, by the route and the feature's key.
pub(crate) type Kept<'a> =
    dyn Fn(&sluice_config::Route, &'static str) -> Option<Arc<dyn RouteFeature>> + 'a;

/// Configured routes evaluated in order; the first whose matcher accepts the request wins.
#[derive(Debug, Default)]
pub struct RouteTable {
    routes: Vec<(Matcher, Arc<Route>)>,
}

impl RouteTable {
    /// Compiles the configured routes, in file order, against the built clusters.
    pub fn from_config(config: &Config, clusters: &BTreeMap<String, Upstream>) -> Self {
        Self::from_config_keeping(config, clusters, &|_, _| None)
    }

    /// [`from_config`](Self::from_config), each route's registered features built by their
    /// registrations ([`registry::REGISTERED`]) from what the route had before (`kept`,
    /// given the route and the feature's key): a reload keeps the state (a rate limit's
    /// buckets) of a feature it does not change.
    pub(crate) fn from_config_keeping(
        config: &Config,
        clusters: &BTreeMap<String, Upstream>,
        kept: &Kept<'_>,
    ) -> Self {
        let mut table = Self::new();
        for r in &config.routes {
            let target = match &r.action {
                // Validation guarantees the cluster exists; a missing one would be a bug upstream
                // of here, and answering 404 for that route is the least surprising outcome.
                Action::Proxy { cluster } => match clusters.get(cluster) {
                    // A reverse route is bound to its slice here, so requests need no lookup.
                    Some(Upstream::Reverse(s)) => {
                        Target::Upstream(Upstream::Reverse(s.cluster().slice(&r.slice)))
                    }
                    Some(u) => Target::Upstream(u.clone()),
                    None => continue,
                },
                Action::Direct(d) => Target::Direct(Direct {
                    status: d.status,
                    location: d.location.clone(),
                    headers: d.headers.clone(),
                    body: d.body.clone().into(),
                }),
            };
            let route = Route {
                name: r.name.clone(),
                target,
                max_request_body: r.max_request_body,
                registered: registry::build(r, |key| kept(r, key)),
                rewrite: r.rewrite.clone(),
                compression: r.compression.clone(),
                request_headers: r.request_headers.clone(),
                response_headers: r.response_headers.clone(),
            };
            table.push(Matcher::from(&r.matcher), Arc::new(route));
        }
        table
    }

    /// The first route feature `config` asks for that this build leaves out (a cargo feature
    /// of `sluice` off), which `Proxy::bind` refuses; `None` when every one is built.
    pub(crate) fn unbuilt(config: &Config) -> Option<Unbuilt> {
        let compression = (!cfg!(feature = "compression"))
            .then(|| config.routes.iter().find(|r| r.compression.is_some()))
            .flatten()
            .map(|r| Unbuilt::new(format!("route {}: compression", r.name), "compression"));
        let registered = config.routes.iter().find_map(|r| {
            let part = registry::unbuilt(r)?;
            let feature = part.cargo_feature.unwrap_or("default");
            Some(Unbuilt::new(
                format!("route {}: {}", r.name, part.key),
                feature,
            ))
        });
        compression.or(registered)
    }

    /// An empty table (every request gets 404).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a route, matched after those already added.
    pub fn push(&mut self, matcher: Matcher, route: Arc<Route>) {
        self.routes.push((matcher, route));
    }

    /// The routes in order, each with its matcher.
    pub fn into_entries(self) -> Vec<(Matcher, Arc<Route>)> {
        self.routes
    }

    /// The number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether there are no routes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

impl Routing for RouteTable {
    fn route(&self, head: &RequestHead<'_>) -> Option<Arc<Route>> {
        self.routes
            .iter()
            .find(|(m, _)| m.matches(head))
            .map(|(_, r)| Arc::clone(r))
    }

    fn reads_headers(&self) -> bool {
        self.routes.iter().any(|(m, _)| m.reads_headers())
    }
}

/// A part a configuration asks for that this build of `sluice` leaves out (a cargo feature
/// off; see the crate's `[features]`).
#[derive(Debug, thiserror::Error)]
#[error(
    "{part} needs the `{feature}` feature, which this build of sluice leaves out (build it \
     with `--features {feature}`, or take it out of the configuration)"
)]
pub struct Unbuilt {
    part: String,
    feature: &'static str,
}

impl Unbuilt {
    /// `part` (`route api: compression`, `[admin]`) needs the cargo feature `feature`.
    pub(crate) fn new(part: impl Into<String>, feature: &'static str) -> Self {
        Self {
            part: part.into(),
            feature,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 49: a route feature left out of the build (a cargo feature off) is refused by
    /// name — never served without it — and a build with every feature refuses nothing.
    #[test]
    fn a_route_feature_this_build_leaves_out_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let hash = bcrypt::hash("secret", 4).expect("a hash");
        std::fs::write(dir.path().join("users"), format!("alice:{hash}\n")).expect("written");
        let text = r#"
[[listener]]
name = "public"
listen = "127.0.0.1:0"
[cluster.a]
kind = "static"
endpoints = ["127.0.0.1:9001"]
[[route]]
name = "api"
cluster = "a"
compression = true
basic_auth = { htpasswd = "users", realm = "api" }
global_rate_limit = { service = "rls", descriptors = [[{ from = "client" }]] }
[rate_limit_service.rls]
address = "127.0.0.1:8081"
domain = "d"
"#;
        let config = sluice_config::parse_str(text, "t.toml", dir.path()).expect("parses");
        let refused = RouteTable::unbuilt(&config).map(|e| e.to_string());
        let left_out = [
            ("compression", cfg!(feature = "compression")),
            ("basic-auth", cfg!(feature = "basic-auth")),
            ("global-rate-limit", cfg!(feature = "global-rate-limit")),
        ];
        let expected = left_out.iter().find(|(_, built)| !built).map(|(f, _)| *f);
        match (refused, expected) {
            (None, None) => {}
            (Some(said), Some(feature)) => {
                assert!(said.starts_with("route api: "), "{said}");
                assert!(said.contains(&format!("`{feature}` feature")), "{said}");
            }
            other => panic!("refused and left out differ: {other:?}"),
        }
    }
}
