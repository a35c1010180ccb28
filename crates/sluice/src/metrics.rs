//! [`Metrics`]: what a running Sluice counts, in Prometheus' text format (`GET /metrics` on
//! the admin listener).
//!
//! Counters and histograms are updated where things happen (a request answered, a
//! handshake decided, a wait in an admission queue); gauges of sessions and queues are read
//! from the clusters when scraped, so they cannot drift.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::upstream::ReverseCluster;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SliceLabels {
    cluster: String,
    slice: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectLabels {
    cluster: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    cluster: String,
    instance: String,
    state: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The process's metrics. One per [`Proxy`](crate::Proxy); cheap to share behind an `Arc`.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Histograms<RouteLabels>,
    handshakes: Family<ResultLabels, Counter>,
    queue_wait: Histograms<SliceLabels>,
    idle: Family<SliceLabels, Gauge>,
    queued: Family<SliceLabels, Gauge>,
    sessions: Family<InstanceLabels, Gauge>,
    connects: Family<ConnectLabels, Counter>,
    bytes_in: Family<ListenerLabels, Counter>,
    bytes_out: Family<ListenerLabels, Counter>,
}

/// The byte counters of one listener's client connections: (received, sent).
pub type ByteCounters = (Counter, Counter);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Latency buckets from 0.5 ms to about 16 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    /// Every metric registered, at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let requests = Family::default();
        registry.register(
            "requests",
            "Requests answered, by route and status (route \"-\": no route matched)",
            requests.clone(),
        );
        let duration: Histograms<RouteLabels> = Family::new_with_constructor(latency);
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its response head, by route",
            duration.clone(),
        );
        let handshakes = Family::default();
        registry.register(
            "acceptor_handshakes",
            "Service handshakes at the acceptor, by result (registered, drained, or the refusal status)",
            handshakes.clone(),
        );
        let queue_wait: Histograms<SliceLabels> = Family::new_with_constructor(latency);
        registry.register(
            "admission_queue_wait_seconds",
            "Time requests waited in a reverse slice's admission queue for a session",
            queue_wait.clone(),
        );
        let idle = Family::default();
        registry.register(
            "idle_sessions",
            "Idle sessions, by reverse cluster and slice",
            idle.clone(),
        );
        let queued = Family::default();
        registry.register(
            "admission_queue_depth",
            "Requests waiting for a session, by reverse cluster and slice",
            queued.clone(),
        );
        let sessions = Family::default();
        registry.register(
            "sessions",
            "Connected sessions, by reverse cluster, instance and state (active, draining, or upgraded: taken over by a WebSocket and no longer leasable)",
            sessions.clone(),
        );
        let connects = Family::default();
        registry.register(
            "upstream_connects",
            "New connections to static-cluster endpoints, by cluster and result (ok, error)",
            connects.clone(),
        );
        let bytes_in = Family::default();
        registry.register(
            "client_received_bytes",
            "Bytes read from clients, by listener (TLS records included)",
            bytes_in.clone(),
        );
        let bytes_out = Family::default();
        registry.register(
            "client_sent_bytes",
            "Bytes written to clients, by listener (TLS records included)",
            bytes_out.clone(),
        );
        Self {
            connects,
            bytes_in,
            bytes_out,
            registry,
            requests,
            duration,
            handshakes,
            queue_wait,
            idle,
            queued,
            sessions,
        }
    }

    /// Counts one answered request and how long its response head took.
    pub fn request(&self, route: &str, status: u16, elapsed: Duration) {
        // On every request: one allocation, shared by both lookups.
        let labels = RequestLabels {
            route: route.to_owned(),
            status,
        };
        self.requests.get_or_create(&labels).inc();
        let route = RouteLabels {
            route: labels.route,
        };
        self.duration
            .get_or_create(&route)
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one handshake outcome at the acceptor.
    pub fn handshake(&self, result: &str) {
        let labels = ResultLabels {
            result: result.to_owned(),
        };
        self.handshakes.get_or_create(&labels).inc();
    }

    /// Counts one new upstream connection of a static cluster; `ok` whether it was made.
    pub fn upstream_connect(&self, cluster: &str, ok: bool) {
        let labels = ConnectLabels {
            cluster: cluster.to_owned(),
            result: if ok { "ok" } else { "error" }.to_owned(),
        };
        self.connects.get_or_create(&labels).inc();
    }

    /// The byte counters a listener's connections add to.
    pub fn client_bytes(&self, listener: &str) -> ByteCounters {
        let labels = ListenerLabels {
            listener: listener.to_owned(),
        };
        (
            self.bytes_in.get_or_create(&labels).clone(),
            self.bytes_out.get_or_create(&labels).clone(),
        )
    }

    /// Records how long a request waited in a slice's admission queue.
    pub fn queue_wait(&self, cluster: &str, slice: &str, waited: Duration) {
        let labels = SliceLabels {
            cluster: cluster.to_owned(),
            slice: slice.to_owned(),
        };
        self.queue_wait
            .get_or_create(&labels)
            .observe(waited.as_secs_f64());
    }

    /// The text exposition, with session and queue gauges read from `clusters` now.
    pub fn render(&self, clusters: &BTreeMap<String, ReverseCluster>) -> String {
        self.refresh(clusters);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    fn refresh(&self, clusters: &BTreeMap<String, ReverseCluster>) {
        self.idle.clear();
        self.queued.clear();
        self.sessions.clear();
        for (name, cluster) in clusters {
            for slice in cluster.slice_names() {
                let labels = SliceLabels {
                    cluster: name.clone(),
                    slice: slice.clone(),
                };
                self.idle
                    .get_or_create(&labels)
                    .set(gauge(cluster.idle_sessions(&slice)));
                self.queued
                    .get_or_create(&labels)
                    .set(gauge(cluster.queued(&slice)));
            }
            for inst in cluster.instances() {
                let state = if inst.is_draining() {
                    "draining"
                } else {
                    "active"
                };
                let labels = InstanceLabels {
                    cluster: name.clone(),
                    instance: inst.id().to_owned(),
                    state: state.to_owned(),
                };
                self.sessions
                    .get_or_create(&labels)
                    .set(gauge(inst.sessions()));
                if inst.upgraded() > 0 {
                    let upgraded = InstanceLabels {
                        state: "upgraded".to_owned(),
                        ..labels
                    };
                    self.sessions
                        .get_or_create(&upgraded)
                        .set(gauge(inst.upgraded()));
                }
            }
        }
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
