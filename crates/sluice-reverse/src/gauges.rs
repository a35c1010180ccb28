//! The gauges of sessions and queues, read from the clusters on every scrape (a Prometheus
//! collector), so they cannot drift.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::cluster::ReverseCluster;
use crate::metrics::SliceLabels;
use crate::protocol::Protocol;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    cluster: String,
    instance: String,
    state: String,
}

/// The gauges of idle sessions, queued requests and connected sessions of `clusters`, read
/// from them on every scrape (register with
/// [`Registry::register_collector`](prometheus_client::registry::Registry::register_collector)).
#[derive(Debug)]
pub struct SessionGauges<P: Protocol> {
    clusters: Vec<ReverseCluster<P>>,
}

impl<P: Protocol> SessionGauges<P> {
    /// Gauges over these clusters, reported in name order.
    pub fn new(mut clusters: Vec<ReverseCluster<P>>) -> Self {
        clusters.sort_by(|a, b| a.name().cmp(b.name()));
        Self { clusters }
    }
}

impl<P: Protocol> Collector for SessionGauges<P> {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let idle = Family::<SliceLabels, Gauge>::default();
        let queued = Family::<SliceLabels, Gauge>::default();
        let sessions = Family::<InstanceLabels, Gauge>::default();
        for cluster in &self.clusters {
            read(cluster, &idle, &queued, &sessions);
        }
        let families = [
            (
                "idle_sessions",
                "Idle sessions (an HTTP/2 session once per idle stream), by reverse cluster and slice",
                &idle,
            ),
            (
                "admission_queue_depth",
                "Requests waiting for a session, by reverse cluster and slice",
                &queued,
            ),
        ];
        for (name, help, family) in families {
            family.encode(encoder.encode_descriptor(name, help, None, family.metric_type())?)?;
        }
        let help = "Connected sessions, by reverse cluster, instance and state (active, draining, or upgraded: taken over by a WebSocket and no longer leasable)";
        sessions.encode(encoder.encode_descriptor(
            "sessions",
            help,
            None,
            sessions.metric_type(),
        )?)
    }
}

/// One cluster's slices and instances, as gauges.
fn read<P: Protocol>(
    cluster: &ReverseCluster<P>,
    idle: &Family<SliceLabels, Gauge>,
    queued: &Family<SliceLabels, Gauge>,
    sessions: &Family<InstanceLabels, Gauge>,
) {
    let name = cluster.name();
    for slice in cluster.slice_names() {
        let labels = SliceLabels {
            cluster: name.to_owned(),
            slice: slice.clone(),
        };
        idle.get_or_create(&labels)
            .set(gauge(cluster.idle_sessions(&slice)));
        queued
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
            cluster: name.to_owned(),
            instance: inst.id().to_owned(),
            state: state.to_owned(),
        };
        sessions.get_or_create(&labels).set(gauge(inst.sessions()));
        if inst.upgraded() > 0 {
            let upgraded = InstanceLabels {
                state: "upgraded".to_owned(),
                ..labels
            };
            sessions
                .get_or_create(&upgraded)
                .set(gauge(inst.upgraded()));
        }
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
