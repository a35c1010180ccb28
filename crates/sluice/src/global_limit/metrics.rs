//! What global limits count: calls by result, and their duration. The families are the
//! process's (a route's limit is built with the routes, which do not see a proxy's
//! registry); every proxy's registry shows them ([`register`]), labelled by service and route.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    service: String,
    route: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    service: String,
    route: String,
}

struct Families {
    calls: Family<CallLabels, Counter>,
    duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
}

/// From 100 µs (a service on the same host) to about 3 s.
fn buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

fn families() -> &'static Families {
    static FAMILIES: OnceLock<Families> = OnceLock::new();
    FAMILIES.get_or_init(|| Families {
        calls: Family::default(),
        duration: Family::new_with_constructor(buckets),
    })
}

/// Shows the global limits' families in `registry`.
pub(crate) fn register(registry: &mut Registry) {
    let f = families();
    registry.register(
        "global_rate_limit_calls",
        "Calls to rate-limit services, by service, route and result (ok, over_limit: answered 429; error, timeout: the service's failure_mode decided)",
        f.calls.clone(),
    );
    registry.register(
        "global_rate_limit_call_seconds",
        "Time a call to a rate-limit service took, by service and route",
        f.duration.clone(),
    );
}

/// One route's handles on the families (a call costs an increment, no label built).
pub(super) struct Counters {
    pub(super) ok: Counter,
    pub(super) over_limit: Counter,
    pub(super) error: Counter,
    pub(super) timeout: Counter,
    pub(super) duration: Histogram,
}

impl Counters {
    pub(super) fn new(service: &str, route: &str) -> Self {
        let f = families();
        let calls = |result| {
            let labels = CallLabels {
                service: service.to_owned(),
                route: route.to_owned(),
                result,
            };
            f.calls.get_or_create(&labels).clone()
        };
        let labels = RouteLabels {
            service: service.to_owned(),
            route: route.to_owned(),
        };
        Self {
            ok: calls("ok"),
            over_limit: calls("over_limit"),
            error: calls("error"),
            timeout: calls("timeout"),
            duration: f.duration.get_or_create(&labels).clone(),
        }
    }
}
