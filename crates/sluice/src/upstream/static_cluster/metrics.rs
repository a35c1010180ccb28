//! What static clusters count, registered by the clusters' module in the process's registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectLabels {
    cluster: String,
    result: String,
}

/// New connections to static-cluster endpoints. The default counts into a family nobody
/// scrapes (a cluster built outside a proxy that registered it).
#[derive(Clone, Debug, Default)]
pub struct StaticMetrics {
    connects: Family<ConnectLabels, Counter>,
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
        metrics
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
