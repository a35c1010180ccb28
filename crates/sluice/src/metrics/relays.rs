//! [`RelayCollector`]: the relays' counters, read from their handles at each scrape and encoded
//! by the registry like every other family.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RelayLabels {
    relay: String,
}

/// A family of relay counters: name (without the registry's prefix), type, help, and how to
/// read it from a snapshot.
type Family = (
    &'static str,
    MetricType,
    &'static str,
    fn(&sluice_relay::Snapshot) -> u64,
);

const FAMILIES: [Family; 18] = [
    (
        "relay_connections",
        MetricType::Counter,
        "Client connections accepted",
        |s| s.accepted,
    ),
    (
        "relay_active",
        MetricType::Gauge,
        "Connections being relayed",
        |s| s.active,
    ),
    (
        "relay_refused",
        MetricType::Counter,
        "Connections refused (preamble, allow, next hop)",
        |s| s.refused,
    ),
    (
        "relay_pool_idle",
        MetricType::Gauge,
        "Ready connections in the pool",
        |s| s.pool_idle,
    ),
    (
        "relay_pool_misses",
        MetricType::Counter,
        "Clients that found the pool empty",
        |s| s.pool_misses,
    ),
    (
        "relay_pool_dead",
        MetricType::Counter,
        "Pooled connections found closed by the peer",
        |s| s.pool_dead,
    ),
    (
        "relay_early_connects",
        MetricType::Counter,
        "Next-hop connects started on a SYN",
        |s| s.early,
    ),
    (
        "relay_bytes_up",
        MetricType::Counter,
        "Bytes from clients to the next hop",
        |s| s.bytes_up,
    ),
    (
        "relay_bytes_down",
        MetricType::Counter,
        "Bytes from the next hop to clients",
        |s| s.bytes_down,
    ),
    (
        "relay_sockmap",
        MetricType::Gauge,
        "1 while the kernel forwards the relay's bytes (sockmap), 0 when it forwards them itself",
        |s| s.sockmap,
    ),
    (
        "relay_kernel_spliced",
        MetricType::Counter,
        "Connections whose bytes the kernel forwarded (sockmap)",
        |s| s.kernel_spliced,
    ),
    (
        "relay_bytes_kernel",
        MetricType::Counter,
        "Of the bytes up and down, those the kernel forwarded without the process (sockmap)",
        |s| s.bytes_kernel,
    ),
    (
        "relay_connects",
        MetricType::Counter,
        "Connects to the next hop (or target) completed",
        |s| s.connects,
    ),
    (
        "relay_connect_microseconds",
        MetricType::Counter,
        "Total time of those connects",
        |s| s.connect_micros,
    ),
    (
        "relay_dns_lookups",
        MetricType::Counter,
        "Good lookups of the next hop's name (to by name with resolve)",
        |s| s.dns_lookups,
    ),
    (
        "relay_dns_lookup_failures",
        MetricType::Counter,
        "Failed lookups of the next hop's name (its last addresses kept)",
        |s| s.dns_failures,
    ),
    (
        "relay_dns_changes",
        MetricType::Counter,
        "Lookups that changed the next hop's addresses",
        |s| s.dns_changes,
    ),
    (
        "relay_dns_addresses",
        MetricType::Gauge,
        "The next hop name's addresses now",
        |s| s.dns_addresses,
    ),
];

/// Reads every relay's counters when scraped.
#[derive(Debug)]
pub(crate) struct RelayCollector(pub(crate) Vec<sluice_relay::RelayHandle>);

impl Collector for RelayCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snapshots: Vec<_> = self
            .0
            .iter()
            .map(|r| (&r.name, r.stats.snapshot()))
            .collect();
        for (name, kind, help, read) in FAMILIES {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for (relay, s) in &snapshots {
                let labels = RelayLabels {
                    relay: (*relay).clone(),
                };
                let metric = family.encode_family(&labels)?;
                match kind {
                    MetricType::Gauge => ConstGauge::new(read(s) as i64).encode(metric)?,
                    _ => ConstCounter::new(read(s)).encode(metric)?,
                }
            }
        }
        Ok(())
    }
}
