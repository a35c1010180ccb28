//! What a route's cache counts: lookups by result, stale answers served, coalesced waits,
//! evictions, and the bytes it holds. The families are the process's (a route's cache is
//! built with the routes, which do not see a proxy's registry); every proxy's registry shows
//! them ([`register`]), labelled by route.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    route: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Default)]
struct Families {
    lookups: Family<LookupLabels, Counter>,
    stale: Family<RouteLabels, Counter>,
    coalesced: Family<RouteLabels, Counter>,
    evictions: Family<RouteLabels, Counter>,
    bytes: Family<RouteLabels, Gauge>,
    disk_evictions: Family<RouteLabels, Counter>,
    disk_bytes: Family<RouteLabels, Gauge>,
}

fn families() -> &'static Families {
    static FAMILIES: OnceLock<Families> = OnceLock::new();
    FAMILIES.get_or_init(Families::default)
}

/// Shows the caches' families in `registry`.
pub(crate) fn register(registry: &mut Registry) {
    let f = families();
    registry.register(
        "cache_lookups",
        "Requests a route's cache looked up, by route and result (hit: answered from the store, also after a coalesced wait; miss: went upstream, nothing fresh stored)",
        f.lookups.clone(),
    );
    registry.register(
        "cache_stale_served",
        "Stale stored answers served in place of an upstream error or failure (stale-if-error) or at once while refreshed in the background (stale-while-revalidate), by route",
        f.stale.clone(),
    );
    registry.register(
        "cache_coalesced_waits",
        "Requests that waited for another request's fetch of the same key, by route",
        f.coalesced.clone(),
    );
    registry.register(
        "cache_evictions",
        "Keys removed, or not admitted, to keep a route's cache within its memory, by route",
        f.evictions.clone(),
    );
    registry.register(
        "cache_stored_bytes",
        "Bytes a route's cache holds (its answers as weighed against memory), by route",
        f.bytes.clone(),
    );
    registry.register(
        "cache_disk_evictions",
        "Keys whose files were removed, or not admitted, to keep a route's disk tier within its max_size, by route",
        f.disk_evictions.clone(),
    );
    registry.register(
        "cache_disk_stored_bytes",
        "Bytes of the files a route's disk tier holds, by route",
        f.disk_bytes.clone(),
    );
}

/// One route's handles on the families (counting costs an increment, no label built).
#[derive(Debug, Clone)]
pub(super) struct Counters {
    pub(super) hits: Counter,
    pub(super) misses: Counter,
    pub(super) stale: Counter,
    pub(super) coalesced: Counter,
    pub(super) evictions: Counter,
    pub(super) bytes: Gauge,
    pub(super) disk_evictions: Counter,
    pub(super) disk_bytes: Gauge,
}

impl Counters {
    pub(super) fn new(route: &str) -> Self {
        let f = families();
        let lookups = |result| {
            let labels = LookupLabels {
                route: route.to_owned(),
                result,
            };
            f.lookups.get_or_create(&labels).clone()
        };
        let labels = RouteLabels {
            route: route.to_owned(),
        };
        Self {
            hits: lookups("hit"),
            misses: lookups("miss"),
            stale: f.stale.get_or_create(&labels).clone(),
            coalesced: f.coalesced.get_or_create(&labels).clone(),
            evictions: f.evictions.get_or_create(&labels).clone(),
            bytes: f.bytes.get_or_create(&labels).clone(),
            disk_evictions: f.disk_evictions.get_or_create(&labels).clone(),
            disk_bytes: f.disk_bytes.get_or_create(&labels).clone(),
        }
    }
}
