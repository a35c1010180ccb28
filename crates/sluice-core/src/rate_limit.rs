//! A route's `rate_limit`: the rule of both data paths, without I/O. Each key (a client's
//! address, or a field's value) has a token bucket — GCRA, `governor`'s keyed limiter — and a
//! request that finds its bucket empty is refused with 429 and how many seconds until a token
//! is back (`Retry-After`). A route's limiter outlives reloads that leave its name and limit
//! unchanged (`router::live`), so a reload does not hand every client a fresh burst.
//!
//! Memory is bounded: at [`MAX_KEYS`] keys (looked at every few checks), buckets that have
//! refilled (indistinguishable from new ones) are forgotten, at most once a second; while the
//! limiter stays full of buckets in use, its requests share one bucket. A flood of distinct
//! keys (made-up API keys, or a /48's worth of IPv6 /64s) thus throttles the route as a whole
//! rather than growing the map or costing a walk per request.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use http::HeaderName;
use sluice_config::RateLimitKey;

use crate::error::ProxyError;
use crate::fields::Fields;
use crate::route_feature::{downcast, Asked, Hooks, Registration, RouteFeature, Verdict};
use sluice_net::addr::client_key;
use std::sync::Arc;

/// The most keys one route's limiter keeps.
pub const MAX_KEYS: usize = 100_000;

/// The longest key value kept whole; longer ones are cut (a limit key is no place for a
/// client's kilobytes, and two values that share 256 bytes share a bucket).
const MAX_KEY_BYTES: usize = 256;

/// What a bucket is kept by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Ip(IpAddr),
    Value(Box<[u8]>),
    /// Every new key while the limiter is full.
    Overflow,
}

/// How often a limiter looks at how many keys it holds (counting takes every shard's lock).
const LOOK_EVERY: u32 = 64;

/// The least time between two sweeps of a full limiter (each walks every key).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// One route's rate limit and its buckets.
pub struct RateLimit {
    config: sluice_config::RateLimit,
    buckets: RateLimiter<Key, DefaultKeyedStateStore<Key>, DefaultClock>,
    /// Checks made, so that the size is looked at every [`LOOK_EVERY`].
    checks: AtomicU32,
    /// Whether it held [`MAX_KEYS`] keys when last looked at.
    full: AtomicBool,
    /// When it may next be swept, in milliseconds since `born`.
    next_sweep: AtomicU64,
    born: Instant,
}

impl std::fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RateLimit {
    /// Empty buckets for `config`.
    pub fn new(config: &sluice_config::RateLimit) -> Self {
        let burst = NonZeroU32::new(config.burst).unwrap_or(NonZeroU32::MIN);
        // Validation refuses a zero period; a nanosecond stands in for one all the same.
        let period = config.period.max(Duration::from_nanos(1));
        let quota = Quota::with_period(period).map_or_else(
            || Quota::per_second(NonZeroU32::MAX),
            |q| q.allow_burst(burst),
        );
        Self {
            config: config.clone(),
            buckets: RateLimiter::keyed(quota),
            checks: AtomicU32::new(0),
            full: AtomicBool::new(false),
            next_sweep: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// The configuration it enforces.
    pub fn config(&self) -> &sluice_config::RateLimit {
        &self.config
    }

    /// The name of the field it keys by, if any.
    pub fn field(&self) -> Option<&HeaderName> {
        match &self.config.key {
            RateLimitKey::Client => None,
            RateLimitKey::Header(name) => Some(name),
        }
    }

    /// Takes a token for a request from `client` whose keying field (see [`field`](Self::field))
    /// is `value`; refused with the seconds until one is back.
    pub fn check(&self, client: IpAddr, value: Option<&[u8]>) -> Result<(), ProxyError> {
        let key = match value {
            Some(v) if self.field().is_some() => Key::Value(v[..v.len().min(MAX_KEY_BYTES)].into()),
            _ => Key::Ip(client_key(client)),
        };
        let key = self.room_for(key);
        self.buckets.check_key(&key).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.buckets.clock().now());
            ProxyError::RateLimited {
                retry_after: retry_after(wait),
                fields: Box::default(),
            }
        })
    }

    /// `key`, or the shared overflow key while the limiter is full of buckets still in use.
    /// The size is looked at every [`LOOK_EVERY`] checks (so it may pass [`MAX_KEYS`] by as
    /// many), and a full limiter forgets its refilled buckets at most once per
    /// [`SWEEP_EVERY`]: a flood of keys costs a walk a second, not one per request.
    fn room_for(&self, key: Key) -> Key {
        if self
            .checks
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(LOOK_EVERY)
        {
            let full = self.buckets.len() >= MAX_KEYS;
            self.full.store(full, Ordering::Relaxed);
        }
        if !self.full.load(Ordering::Relaxed) {
            return key;
        }
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let due = self.next_sweep.load(Ordering::Relaxed);
        let next = now.saturating_add(SWEEP_EVERY.as_millis() as u64);
        let sweeps = now >= due
            && self
                .next_sweep
                .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if sweeps {
            self.buckets.retain_recent();
            self.buckets.shrink_to_fit();
            if self.buckets.len() < MAX_KEYS {
                self.full.store(false, Ordering::Relaxed);
                return key;
            }
        }
        Key::Overflow
    }
}

/// The registration of a route's `rate_limit` (`sluice`'s `registry::REGISTERED`): a
/// reload that leaves the route's limit unchanged keeps its buckets.
pub const REGISTRATION: Registration = Registration {
    key: "rate_limit",
    cargo_feature: None,
    built: true,
    wanted: |route| route.rate_limit.is_some(),
    build: |route, kept| {
        let limit = route.rate_limit.as_ref()?;
        let same = kept.filter(|k| downcast::<RateLimit>(k).is_some_and(|l| l.config() == limit));
        Some(same.map_or_else(
            || Arc::new(RateLimit::new(limit)) as Arc<dyn RouteFeature>,
            Arc::clone,
        ))
    },
};

/// A limit refuses, and never waits.
impl RouteFeature for RateLimit {
    fn name(&self) -> &'static str {
        "rate_limit"
    }

    fn hooks(&self) -> Hooks {
        Hooks::REFUSE
    }

    fn admit<'a>(&'a self, asked: &Asked<'a>) -> Verdict<'a> {
        let value = self.field().and_then(|n| asked.fields.first(n.as_str()));
        match self.check(asked.client, value) {
            Ok(()) => Verdict::Pass,
            Err(refused) => Verdict::Refuse(refused),
        }
    }
}

/// Whole seconds, at least one (`Retry-After` has no fractions; zero would invite a retry
/// that is refused again).
fn retry_after(wait: Duration) -> u32 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(period_ms: u64, burst: u32, key: RateLimitKey) -> RateLimit {
        RateLimit::new(&sluice_config::RateLimit {
            period: Duration::from_millis(period_ms),
            burst,
            key,
        })
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))
    }

    #[test]
    fn a_burst_passes_then_the_bucket_is_empty_for_a_period() {
        let l = limit(10_000, 3, RateLimitKey::Client);
        for _ in 0..3 {
            assert!(l.check(ip("192.0.2.1"), None).is_ok());
        }
        match l.check(ip("192.0.2.1"), None) {
            Err(ProxyError::RateLimited { retry_after, .. }) => assert_eq!(retry_after, 10),
            other => panic!("{other:?}"),
        }
        assert!(
            l.check(ip("192.0.2.2"), None).is_ok(),
            "another client has its own bucket"
        );
    }

    #[test]
    fn ipv6_clients_share_their_64_and_mapped_v4_is_v4() {
        let l = limit(10_000, 1, RateLimitKey::Client);
        assert!(l.check(ip("2001:db8::1"), None).is_ok());
        assert!(l.check(ip("2001:db8::ffff:2"), None).is_err(), "same /64");
        assert!(l.check(ip("2001:db8:0:1::1"), None).is_ok(), "another /64");
        assert!(l.check(ip("192.0.2.9"), None).is_ok());
        assert!(l.check(ip("::ffff:192.0.2.9"), None).is_err());
    }

    #[test]
    fn a_field_keys_the_buckets_and_its_absence_falls_back_to_the_client() {
        let name = HeaderName::from_static("x-api-key");
        let l = limit(10_000, 1, RateLimitKey::Header(name));
        assert!(l.check(ip("192.0.2.1"), Some(b"alice")).is_ok());
        assert!(
            l.check(ip("192.0.2.2"), Some(b"alice")).is_err(),
            "alice's bucket"
        );
        assert!(l.check(ip("192.0.2.1"), Some(b"bob")).is_ok());
        assert!(
            l.check(ip("192.0.2.1"), None).is_ok(),
            "no key: the client's bucket"
        );
        assert!(l.check(ip("192.0.2.1"), None).is_err());
    }

    #[test]
    fn a_full_limiter_puts_new_keys_in_one_shared_bucket() {
        let name = HeaderName::from_static("x-api-key");
        let l = limit(3_600_000, 1, RateLimitKey::Header(name));
        let first = |n: usize| l.check(ip("192.0.2.1"), Some(n.to_string().as_bytes()));
        // Every key's first request passes, until the limiter has looked and found itself full.
        let own = (0..MAX_KEYS + 2 * LOOK_EVERY as usize).filter(|n| first(*n).is_ok());
        let own = own.count();
        assert!(
            (MAX_KEYS..MAX_KEYS + 2 * LOOK_EVERY as usize).contains(&own),
            "{own}"
        );
        // New keys now share one bucket (spent by the first of them above).
        assert!(l.check(ip("192.0.2.1"), Some(b"new-1")).is_err());
        assert!(l.check(ip("192.0.2.1"), Some(b"new-2")).is_err());
        assert!(l.buckets.len() <= MAX_KEYS + LOOK_EVERY as usize + 1);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after(Duration::ZERO), 1);
        assert_eq!(retry_after(Duration::from_millis(1)), 1);
        assert_eq!(retry_after(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after(Duration::from_secs(3600)), 3600);
    }
}
