//! A route's `rate_limit`: requests per client (or per value of a field) over time.

use std::time::Duration;

use http::HeaderName;

/// `rate_limit = { rate = "10/s", burst = 20, key = "client" }`: a token bucket per key,
/// `burst` deep, refilled one request every `period`; a request that finds it empty is
/// answered 429 with `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// The time one request's token takes to come back (`1s / 10` for `"10/s"`).
    pub period: Duration,
    /// How many requests may come at once after a quiet spell. Default: the rate's count.
    pub burst: u32,
    /// What the buckets are kept by.
    pub key: RateLimitKey,
}

/// What a route's rate-limit buckets are kept by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitKey {
    /// The client's address (an IPv6 client's /64).
    Client,
    /// A request field's value (e.g. an API key); a request without it counts as its client's
    /// address, so leaving it out does not escape the limit.
    Header(HeaderName),
}
