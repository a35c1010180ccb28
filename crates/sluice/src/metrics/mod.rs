//! [`Metrics`]: what a running Sluice counts, in Prometheus' text format or OpenMetrics as the
//! scraper asks (`GET /metrics` on the admin listener; [`Exposition`]).
//!
//! Counters and histograms are updated where things happen (a request answered, a
//! handshake decided, a wait in an admission queue); gauges of sessions and queues are read
//! from the clusters when scraped, so they cannot drift.

mod exposition;
mod relays;

pub use exposition::Exposition;

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluice_server::counters::{ByteCounters, ConnectionCounters};

use sluice_reverse::metrics::{latency, Histograms};

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
struct HandOffLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

/// The process's metrics: the registry, and the families of the HTTP proxy itself (requests,
/// client bytes). Components register their own families in [`registry`](Self::registry)
/// before the metrics are shared: the reverse engine
/// ([`ReverseMetrics`](sluice_upstream::reverse::ReverseMetrics),
/// [`SessionGauges`](sluice_upstream::reverse::SessionGauges)) and static clusters
/// ([`StaticMetrics`](sluice_upstream::StaticMetrics)). One per [`Proxy`](crate::Proxy);
/// cheap to share behind an `Arc`.
pub struct Metrics {
    registry: Registry,
    /// Series under the names every client library uses (`process_*`), without the prefix.
    standard: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Histograms<RouteLabels>,
    bytes_in: Family<ListenerLabels, Counter>,
    bytes_out: Family<ListenerLabels, Counter>,
    fast_path: Counter,
    handoffs: Family<HandOffLabels, Counter>,
    connections: Family<ListenerLabels, Gauge>,
    tls_failures: Family<ListenerLabels, Counter>,
    refused: Family<ListenerLabels, Counter>,
    quic: QuicFamilies,
}

/// The listeners' HTTP/3 families: QUIC handshakes and requests, by listener.
#[derive(Debug, Default)]
struct QuicFamilies {
    handshakes: Family<ListenerLabels, Counter>,
    requests: Family<ListenerLabels, Counter>,
}

impl QuicFamilies {
    fn register(registry: &mut Registry) -> Self {
        let families = Self::default();
        registry.register(
            "quic_handshakes",
            "QUIC handshakes completed on listeners' HTTP/3 endpoints, by listener",
            families.handshakes.clone(),
        );
        registry.register(
            "http3_requests",
            "Requests received over HTTP/3, by listener",
            families.requests.clone(),
        );
        families
    }
}

/// One route's request counters (by status) and duration histogram, as handles that share
/// the registered series: what [`Metrics::request_cached`] keeps per connection.
#[derive(Debug)]
pub(crate) struct RouteCounters {
    route: String,
    duration: Histogram,
    /// The statuses seen so far, a few at most (see [`STATUSES_KEPT`]).
    by_status: Vec<(u16, Counter)>,
}

/// How many statuses' counters a connection keeps for its route: a route answers with a few.
const STATUSES_KEPT: usize = 4;

impl RouteCounters {
    /// The counter of `status` on this route, looked up in `metrics` the first time.
    fn counter(&mut self, metrics: &Metrics, status: u16) -> &Counter {
        let at = match self.by_status.iter().position(|(s, _)| *s == status) {
            Some(at) => at,
            None => {
                if self.by_status.len() == STATUSES_KEPT {
                    self.by_status.remove(0);
                }
                let labels = RequestLabels {
                    route: self.route.clone(),
                    status,
                };
                let counter = metrics.requests.get_or_create(&labels).clone();
                self.by_status.push((status, counter));
                self.by_status.len() - 1
            }
        };
        &self.by_status[at].1
    }
}

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

impl Metrics {
    /// The proxy's own metrics registered, at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sluice");
        crate::global_limit::register(&mut registry);
        crate::cache::register(&mut registry);
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
        let fast_path = Counter::default();
        registry.register(
            "http1_fast_path_requests",
            "HTTP/1.1 requests (plain or over TLS) served by the fast path",
            fast_path.clone(),
        );
        let handoffs = Family::default();
        registry.register(
            "http1_fast_path_handoffs",
            "HTTP/1.1 connections the fast path handed to hyper, by why it left their next request",
            handoffs.clone(),
        );
        let connections = Family::default();
        registry.register(
            "client_connections",
            "Client connections open now, by listener",
            connections.clone(),
        );
        let tls_failures = Family::default();
        registry.register(
            "tls_handshake_failures",
            "Client TLS handshakes that failed or timed out, by listener",
            tls_failures.clone(),
        );
        let refused = Family::default();
        registry.register(
            "client_connections_refused",
            "Client connections closed as they were accepted, by listener: their address held max_connections_per_client already",
            refused.clone(),
        );
        let quic = QuicFamilies::register(&mut registry);
        let mut standard = Registry::default();
        standard.register_collector(Box::new(crate::process::ProcessCollector));
        Self {
            registry,
            standard,
            requests,
            duration,
            bytes_in,
            bytes_out,
            fast_path,
            handoffs,
            connections,
            tls_failures,
            refused,
            quic,
        }
    }

    /// Reports these relays' counters (`sluice_relay_*`) at each scrape.
    pub(crate) fn add_relays(&mut self, relays: Vec<sluice_relay::RelayHandle>) {
        if !relays.is_empty() {
            let collector = relays::RelayCollector(relays);
            self.registry.register_collector(Box::new(collector));
        }
    }

    /// The connection gauge and TLS failure counter of `listener`.
    pub(crate) fn connection_counters(&self, listener: &str) -> ConnectionCounters {
        let labels = ListenerLabels {
            listener: listener.to_owned(),
        };
        ConnectionCounters {
            open: self.connections.get_or_create(&labels).clone(),
            tls_failures: self.tls_failures.get_or_create(&labels).clone(),
            refused: self.refused.get_or_create(&labels).clone(),
        }
    }

    /// The HTTP/3 handshake and request counters of `listener`.
    pub(crate) fn quic_counters(&self, listener: &str) -> sluice_server::counters::QuicCounters {
        let labels = ListenerLabels {
            listener: listener.to_owned(),
        };
        sluice_server::counters::QuicCounters {
            handshakes: self.quic.handshakes.get_or_create(&labels).clone(),
            requests: self.quic.requests.get_or_create(&labels).clone(),
        }
    }

    /// Where components register their own families (before the metrics are shared).
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Counts one answered request and how long its response head took.
    pub(crate) fn request(&self, route: &str, status: u16, elapsed: Duration) {
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

    /// Counts one answered request as [`request`](Self::request) does, through `cached`: the
    /// handles of the route a connection counted last, looked up again only when its route
    /// changes. A connection's requests then build no labels and take no family lock.
    pub(crate) fn request_cached(
        &self,
        cached: &mut Option<RouteCounters>,
        route: &str,
        status: u16,
        elapsed: Duration,
    ) {
        let counters = match cached {
            Some(c) if c.route == route => c,
            _ => cached.insert(RouteCounters {
                route: route.to_owned(),
                duration: self
                    .duration
                    .get_or_create(&RouteLabels {
                        route: route.to_owned(),
                    })
                    .clone(),
                by_status: Vec::new(),
            }),
        };
        counters.counter(self, status).inc();
        counters.duration.observe(elapsed.as_secs_f64());
    }

    /// Counts a request the HTTP/1 fast path took.
    pub(crate) fn fast_path_request(&self) {
        self.fast_path.inc();
    }

    /// Counts a connection the HTTP/1 fast path handed to hyper, and why.
    pub(crate) fn fast_path_handoff(&self, reason: &'static str) {
        self.handoffs.get_or_create(&HandOffLabels { reason }).inc();
    }

    /// The byte counters a listener's connections add to.
    pub(crate) fn client_bytes(&self, listener: &str) -> ByteCounters {
        let labels = ListenerLabels {
            listener: listener.to_owned(),
        };
        (
            self.bytes_in.get_or_create(&labels).clone(),
            self.bytes_out.get_or_create(&labels).clone(),
        )
    }

    /// The exposition in `format`; gauges registered as collectors are read now.
    pub fn render_as(&self, format: Exposition) -> String {
        match format {
            Exposition::OpenMetrics => self.render(),
            Exposition::PrometheusText => exposition::to_prometheus_text(&self.render()),
        }
    }

    /// The OpenMetrics text exposition; gauges registered as collectors are read now.
    pub fn render(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry)
            .and_then(|()| encode_registry(&mut out, &self.standard))
            .and_then(|()| encode_eof(&mut out));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's cached counters count exactly what a lookup per request counts: across
    /// route changes, and with more statuses on one route than the connection keeps.
    #[test]
    fn cached_route_counters_count_as_lookups_do() {
        let (looked_up, cached) = (Metrics::new(), Metrics::new());
        let mut kept = None;
        let statuses = [200, 404, 200, 500, 503, 502, 301, 200, 404, 200];
        let requests = statuses
            .iter()
            .enumerate()
            .map(|(i, s)| (["a", "b", "a"][i % 3], *s));
        for (i, (route, status)) in requests.enumerate() {
            let elapsed = Duration::from_millis(i as u64);
            looked_up.request(route, status, elapsed);
            cached.request_cached(&mut kept, route, status, elapsed);
        }
        // The same samples; the families' hash maps may list them in another order. The
        // process's own series (its memory now) are not the requests'.
        let sorted = |m: &Metrics| {
            let text = m.render();
            let mut lines: Vec<String> = text
                .lines()
                .filter(|l| !l.contains("process_"))
                .map(str::to_owned)
                .collect();
            lines.sort();
            lines
        };
        assert_eq!(sorted(&cached), sorted(&looked_up));
        assert!(cached.render().contains("route=\"b\",status=\"404\""));
    }
}
