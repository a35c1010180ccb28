//! A route's `global_rate_limit`: one limit shared by every node, kept by an external service
//! that speaks Envoy's rate-limit protocol (`envoy.service.ratelimit.v3.RateLimitService`,
//! gRPC; e.g. `envoyproxy/ratelimit` with its counters in Redis). The route's own
//! `rate_limit` (a bucket on this node) is asked first, so a refusal it can make never leaves
//! the node; then the service, with the descriptors the route builds from the request.
//!
//! `OVER_LIMIT` is answered 429 with the service's response fields and a `Retry-After`
//! (the service's, or the longest `duration_until_reset` of the descriptors over their
//! limit). A call that fails or takes longer than the service's `timeout` lets the request
//! through (`failure_mode = "open"`, Envoy's default) or answers it 503 (`"closed"`).
//!
//! Each route keeps its own lazily connected HTTP/2 channel to the service (built on its
//! first request, reconnected by tonic after a failure). Its counters are in the process's
//! families ([`register`]), labelled by service and route. A registered route feature
//! ([`REGISTRATION`]): its hooks refuse and wait, so every transport drives it.

#[cfg(feature = "global-rate-limit")]
mod client;
mod metrics;
#[cfg(feature = "global-rate-limit")]
mod proto;

pub(crate) use metrics::register;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderName, HeaderValue};
use sluice_config::{EntryValue, FailureMode, GlobalRateLimit};
use tracing::{debug, warn};

use sluice_core::error::ProxyError;
use sluice_core::route_feature::{Asked, Hooks, Registration, RouteFeature, Verdict as Decided};

/// The longest descriptor value sent whole (a field's value is the client's to choose).
const MAX_VALUE_BYTES: usize = 256;

/// `global_rate_limit`: asked after every other feature let the request through.
pub(crate) const REGISTRATION: Registration = Registration {
    key: "global_rate_limit",
    cargo_feature: Some("global-rate-limit"),
    built: cfg!(feature = "global-rate-limit"),
    wanted: |route| route.global_rate_limit.is_some(),
    build: |route, _| {
        let limit = route
            .global_rate_limit
            .as_ref()
            .filter(|_| cfg!(feature = "global-rate-limit"))?;
        Some(Arc::new(GlobalLimit::new(&route.name, limit)) as Arc<dyn RouteFeature>)
    },
};

/// A call to the service: refused (429, or 503 when it fails closed) or passed after it.
impl RouteFeature for GlobalLimit {
    fn name(&self) -> &'static str {
        "global_rate_limit"
    }

    fn hooks(&self) -> Hooks {
        Hooks::REFUSE.and(Hooks::WAIT)
    }

    fn admit<'a>(&'a self, asked: &Asked<'a>) -> Decided<'a> {
        let descriptors = self.descriptors(asked);
        if descriptors.is_empty() {
            return Decided::Pass;
        }
        Decided::Check(Box::pin(async move {
            self.check(descriptors).await.map(|()| None)
        }))
    }
}

/// One route's global limit: what it asks, and its channel to the service.
pub(crate) struct GlobalLimit {
    config: GlobalRateLimit,
    route: String,
    counters: metrics::Counters,
    /// Whether the last call failed: a failure after a success is logged at warn, the ones
    /// that follow at debug (a dead service would otherwise log every request).
    failing: AtomicBool,
    #[cfg(feature = "global-rate-limit")]
    client: client::Client,
}

impl std::fmt::Debug for GlobalLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalLimit")
            .field("route", &self.route)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A descriptor as sent: its entries' keys and values.
type Descriptor = Vec<(String, String)>;

/// What the service answered.
#[derive(Debug)]
#[cfg_attr(not(feature = "global-rate-limit"), allow(dead_code))]
enum Verdict {
    Ok,
    OverLimit {
        retry_after: u32,
        fields: Box<[(HeaderName, HeaderValue)]>,
    },
}

/// Why a call brought no answer.
#[derive(Debug)]
#[cfg_attr(not(feature = "global-rate-limit"), allow(dead_code))]
enum Failure {
    /// It took longer than the service's `timeout`.
    Timeout,
    /// It failed (connection refused, a gRPC error status, a malformed answer).
    Error(String),
}

impl GlobalLimit {
    /// The limit of the route named `route`; the channel connects on its first request.
    pub(crate) fn new(route: &str, config: &GlobalRateLimit) -> Self {
        Self {
            counters: metrics::Counters::new(&config.service.name, route),
            config: config.clone(),
            route: route.to_owned(),
            failing: AtomicBool::new(false),
            #[cfg(feature = "global-rate-limit")]
            client: client::Client::new(&config.service),
        }
    }

    /// Asks the service about a request's `descriptors`: `Ok` lets it through, `Err` is its
    /// answer (429, or 503 when the service fails and the mode is closed).
    async fn check(&self, descriptors: Vec<Descriptor>) -> Result<(), ProxyError> {
        let started = Instant::now();
        let outcome = self.ask(descriptors).await;
        self.counters
            .duration
            .observe(started.elapsed().as_secs_f64());
        let failure = match outcome {
            Ok(Verdict::Ok) => {
                self.counters.ok.inc();
                self.failing.store(false, Ordering::Relaxed);
                return Ok(());
            }
            Ok(Verdict::OverLimit {
                retry_after,
                fields,
            }) => {
                self.counters.over_limit.inc();
                self.failing.store(false, Ordering::Relaxed);
                return Err(ProxyError::RateLimited {
                    retry_after,
                    fields,
                });
            }
            Err(failure) => failure,
        };
        self.failed(&failure);
        match self.config.service.failure_mode {
            FailureMode::Open => Ok(()),
            FailureMode::Closed => Err(ProxyError::Unavailable {
                reason: "rate-limit service unavailable",
                retry_after: 1,
            }),
        }
    }

    /// Counts and logs a call that brought no answer.
    fn failed(&self, failure: &Failure) {
        let (counter, why) = match failure {
            Failure::Timeout => (&self.counters.timeout, "timed out".to_owned()),
            Failure::Error(e) => (&self.counters.error, e.clone()),
        };
        counter.inc();
        let service = &self.config.service;
        let mode = match service.failure_mode {
            FailureMode::Open => "open: requests go on",
            FailureMode::Closed => "closed: requests get 503",
        };
        if self.failing.swap(true, Ordering::Relaxed) {
            debug!(service = %service.name, route = %self.route, error = %why, "rate-limit service call failed");
        } else {
            warn!(service = %service.name, address = %service.address, route = %self.route, error = %why, failure_mode = mode, "rate-limit service call failed");
        }
    }

    /// The descriptors of `request`: each configured one whose entries all have a value.
    fn descriptors(&self, request: &Asked<'_>) -> Vec<Descriptor> {
        self.config
            .descriptors
            .iter()
            .filter_map(|d| {
                d.iter()
                    .map(|e| Some((e.key.clone(), self.value(&e.value, request)?)))
                    .collect()
            })
            .collect()
    }

    /// An entry's value for `request`; `None` when it lacks the field.
    fn value(&self, value: &EntryValue, request: &Asked<'_>) -> Option<String> {
        Some(match value {
            EntryValue::Client => sluice_net::addr::client_key(request.client).to_string(),
            EntryValue::Route => self.route.clone(),
            EntryValue::Path => cut(request.path.as_bytes()),
            EntryValue::Header(name) => cut(request.fields.first_value(name.as_str())?),
            EntryValue::Constant(v) => v.clone(),
        })
    }

    #[cfg(feature = "global-rate-limit")]
    async fn ask(&self, descriptors: Vec<Descriptor>) -> Result<Verdict, Failure> {
        self.client.ask(&self.config.service, descriptors).await
    }

    /// Built without the `global-rate-limit` feature there is no client (`Proxy::bind`
    /// refuses a configuration that asks for one): every call fails.
    #[cfg(not(feature = "global-rate-limit"))]
    async fn ask(&self, _descriptors: Vec<Descriptor>) -> Result<Verdict, Failure> {
        Err(Failure::Error(
            "built without the global-rate-limit feature".to_owned(),
        ))
    }
}

/// A value as text, at most [`MAX_VALUE_BYTES`] of it (cut on a character boundary).
fn cut(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(MAX_VALUE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http::{HeaderMap, Method};
    use sluice_config::{DescriptorEntry, RateLimitService};

    fn limit(descriptors: Vec<Vec<DescriptorEntry>>) -> GlobalLimit {
        let service = RateLimitService {
            name: "rls".into(),
            address: "127.0.0.1:8081".into(),
            domain: "d".into(),
            timeout: std::time::Duration::from_millis(20),
            failure_mode: FailureMode::Open,
        };
        GlobalLimit::new(
            "api",
            &GlobalRateLimit {
                service,
                descriptors,
            },
        )
    }

    fn asked(fields: &HeaderMap) -> Asked<'_> {
        Asked {
            method: &Method::GET,
            fields,
            client: [10, 0, 0, 7].into(),
            path: "/v1/jobs",
            query: None,
            host: None,
            tls: false,
        }
    }

    fn entry(key: &str, value: EntryValue) -> DescriptorEntry {
        DescriptorEntry {
            key: key.into(),
            value,
        }
    }

    #[test]
    fn descriptors_are_built_from_the_request_and_one_missing_a_field_is_left_out() {
        let key = HeaderName::from_static("x-api-key");
        let limit = limit(vec![
            vec![
                entry("remote_address", EntryValue::Client),
                entry("route", EntryValue::Route),
            ],
            vec![
                entry("generic_key", EntryValue::Constant("plan".into())),
                entry("api_key", EntryValue::Header(key.clone())),
            ],
            vec![entry("path", EntryValue::Path)],
        ]);
        let mut fields = HeaderMap::new();
        let pairs = |d: &[(String, String)]| {
            d.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let without: Vec<_> = limit
            .descriptors(&asked(&fields))
            .iter()
            .map(|d| pairs(d))
            .collect();
        assert_eq!(
            without,
            ["remote_address=10.0.0.7,route=api", "path=/v1/jobs"]
        );
        fields.insert(key, HeaderValue::from_str(&"k".repeat(300)).unwrap());
        let with = limit.descriptors(&asked(&fields));
        assert_eq!(with.len(), 3);
        assert_eq!(with[1][1].1.len(), MAX_VALUE_BYTES, "a long value is cut");
    }
}
