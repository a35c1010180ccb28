//! [`REGISTERED`]: the one list of the route features built from configuration, in the order
//! their hooks run, and what the router tables ask of it. A feature's own module has its rule,
//! its hooks and its [`Registration`]; this is the line that adds it.

use std::sync::Arc;

use sluice_core::route_feature::{Registration, RouteFeature};

/// Every route feature built from configuration, in the order their hooks run: the rate
/// limit (cheap refusals first), the CORS preflight (which carries no credentials, so it is
/// answered before they are asked for), the route's users, then the global rate limit (a
/// call to a remote service, made only for requests every other feature let through), then
/// the cache (a stored answer is handed only to a request every other feature let through;
/// it must be last, as the fetch a miss starts is taken up by its `keep` right after).
pub static REGISTERED: &[Registration] = &[
    sluice_core::rate_limit::REGISTRATION,
    sluice_core::cors::REGISTRATION,
    sluice_core::basic_auth::REGISTRATION,
    crate::global_limit::REGISTRATION,
    crate::cache::REGISTRATION,
];

/// The registered features `route` asks for, built (`kept`: the one of the same key the
/// route had before, if any).
pub(crate) fn build(
    route: &sluice_config::Route,
    kept: impl Fn(&'static str) -> Option<Arc<dyn RouteFeature>>,
) -> Vec<Arc<dyn RouteFeature>> {
    REGISTERED
        .iter()
        .filter(|r| (r.wanted)(route))
        .filter_map(|r| (r.build)(route, kept(r.key).as_ref()))
        .collect()
}

/// The first registered feature `route` asks for that this build leaves out.
pub(crate) fn unbuilt(route: &sluice_config::Route) -> Option<&'static Registration> {
    REGISTERED.iter().find(|r| !r.built && (r.wanted)(route))
}

/// Whether `route` asks for any registered feature.
pub(crate) fn any_wanted(route: &sluice_config::Route) -> bool {
    REGISTERED.iter().any(|r| (r.wanted)(route))
}
