//! A route's `cache`: a shared HTTP cache (RFC 9111) in memory, bounded in bytes, and on
//! disk when it has a `disk` tier.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// `cache = true` or `{ memory = "256MiB", max_object = "8MiB", lock_timeout = "5s",
/// valid = { "200" = "10m" }, disk = { path = "/var/cache/sluice/api", max_size = "10GiB" } }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    /// The most bytes the route's stored answers hold (bodies and fields).
    pub memory: u64,
    /// The largest answer stored: a larger one goes to the client unstored.
    pub max_object: u64,
    /// How long a request waits for the answer another request is fetching for the same
    /// key (request coalescing) before it goes upstream itself.
    pub lock_timeout: Duration,
    /// The lifetimes given to answers that state none (none by default).
    pub valid: CacheValid,
    /// The disk tier, if it has one.
    pub disk: Option<CacheDisk>,
}

/// `valid = { "200" = "10m", "302" = "10m", any = "1m" }` (NGINX's `proxy_cache_valid`): how
/// long an answer of a status is fresh when it states no lifetime of its own (no `max-age`,
/// `s-maxage` or `Expires`), in place of the RFC's heuristic; such an answer is then stored
/// whatever its status. Empty by default: only the RFC's rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheValid {
    /// By status.
    pub statuses: BTreeMap<u16, Duration>,
    /// For every status not listed (`any`).
    pub any: Option<Duration>,
}

impl CacheValid {
    /// The lifetime an answer of `status` that states none is given (`None`: the RFC's).
    pub fn lifetime(&self, status: u16) -> Option<Duration> {
        self.statuses.get(&status).copied().or(self.any)
    }
}

/// A cache's disk tier: a directory of its own, bounded in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDisk {
    /// The directory (created if missing), resolved against the configuration file's.
    pub path: PathBuf,
    /// The most bytes its files hold.
    pub max_size: u64,
}

impl CacheDisk {
    /// `max_size` when none is given.
    pub const DEFAULT_MAX_SIZE: u64 = 1 << 30;
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            memory: 256 << 20,
            max_object: 8 << 20,
            lock_timeout: Duration::from_secs(5),
            valid: CacheValid::default(),
            disk: None,
        }
    }
}
