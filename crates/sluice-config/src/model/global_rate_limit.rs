//! Fleet-wide rate limits: `[rate_limit_service.NAME]`, an external service speaking Envoy's
//! rate-limit protocol (`envoy.service.ratelimit.v3.RateLimitService`, gRPC), and a route's
//! `global_rate_limit`, the descriptors it asks that service about.

use std::time::Duration;

use http::HeaderName;

/// `[rate_limit_service.NAME]`: where the service is and what to do when it does not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitService {
    /// Its name in the file (metrics, logs).
    pub name: String,
    /// `host:port` of its gRPC listener (plain-text HTTP/2).
    pub address: String,
    /// The domain every request names (the service's configuration is per domain).
    pub domain: String,
    /// The longest one call may take (Envoy's default: 20 ms); a call that takes longer
    /// counts as a failure.
    pub timeout: Duration,
    /// What a request gets when the service fails or is slow.
    pub failure_mode: FailureMode,
}

/// What a request gets when the rate-limit service fails, refuses the call or is slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// It goes on, as if the service had said OK (Envoy's `failure_mode_deny = false`).
    Open,
    /// It is answered 503 with `Retry-After`.
    Closed,
}

/// A route's `global_rate_limit = { service, descriptors }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalRateLimit {
    /// The service asked (its definition, copied from `[rate_limit_service.NAME]`).
    pub service: RateLimitService,
    /// The descriptors sent with each request, each a list of entries. A descriptor with an
    /// entry the request lacks (a field it does not carry) is left out; a request left with
    /// no descriptor is not asked about.
    pub descriptors: Vec<Vec<DescriptorEntry>>,
}

/// One `{ key, from }` or `{ key, value }` entry of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorEntry {
    /// The entry's key, as the service's configuration names it.
    pub key: String,
    /// Where its value comes from.
    pub value: EntryValue,
}

/// Where a descriptor entry's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryValue {
    /// The client's address (`from = "client"`; default key `remote_address`, Envoy's).
    Client,
    /// The route's name (`from = "route"`; default key `route`).
    Route,
    /// The request's path, without its query (`from = "path"`; default key `path`).
    Path,
    /// A request field's first value (`from = "header:NAME"`; default key: the field's
    /// name); a request without it leaves the descriptor out.
    Header(HeaderName),
    /// A constant (`value = "…"`; default key `generic_key`, Envoy's).
    Constant(String),
}
