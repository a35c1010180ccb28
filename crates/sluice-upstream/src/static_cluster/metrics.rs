//! What static clusters count, registered by the clusters' module in the process's registry.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use sluice_reverse::metrics::{latency, Histograms};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    cluster: String,
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResponseLabels {
    cluster: String,
    endpoint: String,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectLabels {
    cluster: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabels {
    cluster: String,
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResolutionLabels {
    cluster: String,
    name: String,
    result: &'static str,
}

/// New connections to static-cluster endpoints. The default counts into a family nobody
/// scrapes (a cluster built outside a proxy that registered it).
#[derive(Clone, Debug)]
pub struct StaticMetrics {
    connects: Family<ConnectLabels, Counter>,
    responses: Family<ResponseLabels, Counter>,
    response_time: Histograms<EndpointLabels>,
    resolutions: Family<ResolutionLabels, Counter>,
    changes: Family<NameLabels, Counter>,
    addresses: Family<NameLabels, Gauge>,
}

impl Default for StaticMetrics {
    fn default() -> Self {
        Self {
            connects: Family::default(),
            responses: Family::default(),
            response_time: Family::new_with_constructor(latency),
            resolutions: Family::default(),
            changes: Family::default(),
            addresses: Family::default(),
        }
    }
}

impl StaticMetrics {
    /// The counters, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "upstream_connects",
            "New connections to static-cluster endpoints, by cluster and result (ok, error)",
            metrics.connects.clone(),
        );
        registry.register(
            "upstream_responses",
            "Static-cluster responses, by cluster, endpoint and status class (2xx, 3xx, 4xx, 5xx, 1xx)",
            metrics.responses.clone(),
        );
        registry.register(
            "upstream_response_seconds",
            "Time from sending a request to a static endpoint to its response head",
            metrics.response_time.clone(),
        );
        registry.register(
            "upstream_dns_resolutions",
            "Lookups of endpoint names that follow DNS (`resolve`), by cluster, name and result (ok, nxdomain, no_records, timeout, error)",
            metrics.resolutions.clone(),
        );
        registry.register(
            "upstream_dns_changes",
            "Lookups of endpoint names whose addresses differed from the name's last ones",
            metrics.changes.clone(),
        );
        registry.register(
            "upstream_dns_addresses",
            "The addresses an endpoint name has now (its last successful lookup's)",
            metrics.addresses.clone(),
        );
        metrics
    }

    /// One followed name's series.
    pub(super) fn name(&self, cluster: &str, name: &str) -> NameMetrics {
        let labels = NameLabels {
            cluster: cluster.to_owned(),
            name: name.to_owned(),
        };
        let ok = ResolutionLabels {
            cluster: cluster.to_owned(),
            name: name.to_owned(),
            result: "ok",
        };
        NameMetrics {
            ok: self.resolutions.get_or_create(&ok).clone(),
            failed: self.resolutions.clone(),
            changes: self.changes.get_or_create(&labels).clone(),
            addresses: self.addresses.get_or_create(&labels).clone(),
            labels,
        }
    }

    /// One endpoint's response counters and latency histogram, created once (a response then
    /// costs an increment and an observation, no label built).
    pub(super) fn endpoint(
        &self,
        cluster: &str,
        endpoint: std::net::SocketAddr,
    ) -> EndpointMetrics {
        let endpoint = endpoint.to_string();
        let class = |class: &'static str| {
            let labels = ResponseLabels {
                cluster: cluster.to_owned(),
                endpoint: endpoint.clone(),
                class,
            };
            self.responses.get_or_create(&labels).clone()
        };
        let labels = EndpointLabels {
            cluster: cluster.to_owned(),
            endpoint: endpoint.clone(),
        };
        EndpointMetrics {
            by_class: ["1xx", "2xx", "3xx", "4xx", "5xx"].map(class),
            latency: self.response_time.get_or_create(&labels).clone(),
        }
    }

    /// One cluster's counters, looked up once so that a connect only adds one.
    pub(super) fn cluster(&self, cluster: &str) -> ConnectCounters {
        let counter = |result: &str| {
            let labels = ConnectLabels {
                cluster: cluster.to_owned(),
                result: result.to_owned(),
            };
            self.connects.get_or_create(&labels).clone()
        };
        ConnectCounters {
            ok: counter("ok"),
            error: counter("error"),
        }
    }
}

/// A cluster's new connections: made, and failed.
#[derive(Debug)]
pub(super) struct ConnectCounters {
    ok: Counter,
    error: Counter,
}

impl ConnectCounters {
    pub(super) fn count(&self, ok: bool) {
        if ok { &self.ok } else { &self.error }.inc();
    }
}

/// One endpoint's responses by status class, and their latency. The default counts into
/// series nobody scrapes.
#[derive(Debug, Clone)]
pub(crate) struct EndpointMetrics {
    by_class: [Counter; 5],
    latency: Histogram,
}

impl Default for EndpointMetrics {
    fn default() -> Self {
        Self {
            by_class: Default::default(),
            latency: latency(),
        }
    }
}

impl EndpointMetrics {
    /// Counts a response head with `status`, `elapsed` after the request went out.
    pub(crate) fn observe(&self, status: u16, elapsed: Duration) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.by_class[class].inc();
        self.latency.observe(elapsed.as_secs_f64());
    }
}

/// What one followed name counts: its lookups by result, its changes and its addresses.
#[derive(Debug)]
pub(super) struct NameMetrics {
    labels: NameLabels,
    ok: Counter,
    failed: Family<ResolutionLabels, Counter>,
    changes: Counter,
    addresses: Gauge,
}

impl NameMetrics {
    /// A lookup that found `addresses` addresses; `changed`: others than the last time.
    pub(super) fn resolved(&self, addresses: usize, changed: bool) {
        self.ok.inc();
        if changed {
            self.changes.inc();
        }
        self.addresses
            .set(i64::try_from(addresses).unwrap_or(i64::MAX));
    }

    /// A lookup that failed, by its `result` label.
    pub(super) fn failed(&self, result: &'static str) {
        let labels = ResolutionLabels {
            cluster: self.labels.cluster.clone(),
            name: self.labels.name.clone(),
            result,
        };
        self.failed.get_or_create(&labels).inc();
    }
}
