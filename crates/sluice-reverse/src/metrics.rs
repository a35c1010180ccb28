//! What the reverse-session engine counts, registered by the engine itself in the process's
//! registry: handshakes at the acceptor and waits in admission queues, as they happen. (The
//! gauges of sessions and queues are read from the clusters on every scrape: `gauges.rs`.)

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    cluster: String,
    slice: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SliceLabels {
    pub(super) cluster: String,
    pub(super) slice: String,
}

/// A family of latency histograms.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets from 0.5 ms to about 16 s.
pub fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The engine's counters. Clones count into the same families; the default counts into
/// families nobody scrapes (a cluster or acceptor built outside a proxy that registered them).
#[derive(Clone, Debug)]
pub struct ReverseMetrics {
    handshakes: Family<ResultLabels, Counter>,
    queue_wait: Histograms<SliceLabels>,
    refused: Family<RefusedLabels, Counter>,
}

impl Default for ReverseMetrics {
    fn default() -> Self {
        Self {
            handshakes: Family::default(),
            queue_wait: Family::new_with_constructor(latency),
            refused: Family::default(),
        }
    }
}

impl ReverseMetrics {
    /// The engine's counters, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "acceptor_handshakes",
            "Service handshakes at the acceptor, by result (registered, drained, or the refusal status)",
            metrics.handshakes.clone(),
        );
        registry.register(
            "admission_queue_wait_seconds",
            "Time requests waited in a reverse slice's admission queue for a session",
            metrics.queue_wait.clone(),
        );
        registry.register(
            "capacity_refusals",
            "Requests answered 503 for want of a session, by cluster, slice and reason (queue_full, wait_expired, no_sessions)",
            metrics.refused.clone(),
        );
        metrics
    }

    /// Counts one request refused for want of a session.
    pub(crate) fn refused(&self, cluster: &str, slice: &str, reason: &'static str) {
        let labels = RefusedLabels {
            cluster: cluster.to_owned(),
            slice: slice.to_owned(),
            reason,
        };
        self.refused.get_or_create(&labels).inc();
    }

    /// Counts one handshake outcome at the acceptor.
    pub(crate) fn handshake(&self, result: &str) {
        let labels = ResultLabels {
            result: result.to_owned(),
        };
        self.handshakes.get_or_create(&labels).inc();
    }

    /// Records how long a request waited in a slice's admission queue.
    pub(crate) fn queue_wait(&self, cluster: &str, slice: &str, waited: std::time::Duration) {
        let labels = SliceLabels {
            cluster: cluster.to_owned(),
            slice: slice.to_owned(),
        };
        self.queue_wait
            .get_or_create(&labels)
            .observe(waited.as_secs_f64());
    }
}
