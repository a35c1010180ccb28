//! What static clusters count, registered by the clusters' module in the process's registry.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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

/// New connections to static-cluster endpoints. The default counts into a family nobody
/// scrapes (a cluster built outside a proxy that registered it).
#[derive(Clone, Debug)]
pub struct StaticMetrics {
    connects: Family<ConnectLabels, Counter>,
    responses: Family<ResponseLabels, Counter>,
    response_time: Histograms<EndpointLabels>,
}

impl Default for StaticMetrics {
    fn default() -> Self {
        Self {
            connects: Family::default(),
            responses: Family::default(),
            response_time: Family::new_with_constructor(latency),
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
        metrics
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
