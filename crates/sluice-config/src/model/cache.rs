//! A route's `cache`: a shared HTTP cache (RFC 9111) in memory, bounded in bytes.

use std::time::Duration;

/// `cache = true` or `{ memory = "256MiB", max_object = "8MiB", lock_timeout = "5s" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    /// The most bytes the route's stored answers hold (bodies and fields).
    pub memory: u64,
    /// The largest answer stored: a larger one goes to the client unstored.
    pub max_object: u64,
    /// How long a request waits for the answer another request is fetching for the same
    /// key (request coalescing) before it goes upstream itself.
    pub lock_timeout: Duration,
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            memory: 256 << 20,
            max_object: 8 << 20,
            lock_timeout: Duration::from_secs(5),
        }
    }
}
