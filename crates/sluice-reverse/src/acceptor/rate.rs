//! Handshakes per second per source address: a token bucket per address, an IPv6 /64 counted
//! as one (`sluice_net::addr::client_key`), as the listeners' limits count.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use sluice_net::addr::client_key;
use tokio::time::Instant;

/// Above this many tracked addresses, buckets idle for a second (full again) are forgotten.
const PRUNE_ABOVE: usize = 4096;

/// Allows a burst of `rate` handshakes per address, refilled at `rate` per second.
#[derive(Debug)]
pub(super) struct RateLimiter {
    rate: Option<u32>,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// `None` allows everything.
    pub(super) fn new(rate: Option<u32>) -> Self {
        Self {
            rate,
            buckets: Mutex::default(),
        }
    }

    /// Whether `ip` may make one more handshake now.
    pub(super) fn allow(&self, ip: IpAddr) -> bool {
        let Some(rate) = self.rate.map(f64::from) else {
            return true;
        };
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() > PRUNE_ABOVE {
            buckets.retain(|_, b| now - b.at < Duration::from_secs(1));
        }
        let b = buckets.entry(client_key(ip)).or_insert(Bucket {
            tokens: rate,
            at: now,
        });
        b.tokens = (b.tokens + (now - b.at).as_secs_f64() * rate).min(rate);
        b.at = now;
        if b.tokens < 1.0 {
            return false;
        }
        b.tokens -= 1.0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_a_burst_then_refills() {
        let ip: IpAddr = [127, 0, 0, 1].into();
        let limiter = RateLimiter::new(Some(2));
        assert!(limiter.allow(ip) && limiter.allow(ip));
        assert!(!limiter.allow(ip));
        assert!(limiter.allow([127, 0, 0, 2].into()));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(limiter.allow(ip));
        assert!(RateLimiter::new(None).allow(ip));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_slash_64_shares_one_bucket() {
        let limiter = RateLimiter::new(Some(5));
        let net = 0x2001_0db8_0000_0001_u128 << 64;
        let allowed = (0..300u128)
            .filter(|i| limiter.allow(IpAddr::from(std::net::Ipv6Addr::from(net | (i * 7919 + 1)))))
            .count();
        assert_eq!(allowed, 5, "300 addresses of one /64 are one client");
        let other = std::net::Ipv6Addr::from((0x2001_0db8_0000_0002_u128 << 64) | 1);
        assert!(
            limiter.allow(other.into()),
            "another /64 has its own bucket"
        );
    }
}
