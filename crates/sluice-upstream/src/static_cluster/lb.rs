//! Load-balancing policies over a cluster's usable endpoints.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sluice_config::LbPolicy;

use super::endpoint::Endpoint;

/// Picks endpoints by a policy. Allocation-free: it scans the endpoint slice in place.
#[derive(Debug)]
pub(crate) struct Balancer {
    policy: LbPolicy,
    next: AtomicUsize,
}

impl Balancer {
    pub(crate) fn new(policy: LbPolicy) -> Self {
        Self {
            policy,
            next: AtomicUsize::new(0),
        }
    }

    /// Picks a usable endpoint that is not in `avoid` (endpoints already tried for this request).
    pub(crate) fn pick(
        &self,
        endpoints: &[Arc<Endpoint>],
        now_ms: u64,
        avoid: &[usize],
    ) -> Option<usize> {
        let n = endpoints.len();
        if n == 0 {
            return None;
        }
        let ok = |i: usize| endpoints[i].is_usable(now_ms) && !avoid.contains(&i);
        match self.policy {
            LbPolicy::RoundRobin => {
                first_from(self.next.fetch_add(1, Ordering::Relaxed) % n, n, ok)
            }
            LbPolicy::Random => first_from(fastrand::usize(..n), n, ok),
            LbPolicy::LeastRequest => {
                let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
                least_loaded(endpoints, start, ok)
            }
            LbPolicy::P2c => p2c(endpoints, ok),
        }
    }
}

/// The first index at or after `start` (wrapping) that satisfies `ok`.
fn first_from(start: usize, n: usize, ok: impl Fn(usize) -> bool) -> Option<usize> {
    (0..n).map(|k| (start + k) % n).find(|&i| ok(i))
}

/// The usable endpoint with the fewest in-flight requests; ties go to the first from `start`,
/// which rotates so that equal endpoints share the load.
fn least_loaded(
    endpoints: &[Arc<Endpoint>],
    start: usize,
    ok: impl Fn(usize) -> bool,
) -> Option<usize> {
    let n = endpoints.len();
    (0..n)
        .map(|k| (start + k) % n)
        .filter(|&i| ok(i))
        .min_by_key(|&i| endpoints[i].in_flight())
}

/// Power of two choices: two distinct random usable endpoints, the less loaded one wins.
fn p2c(endpoints: &[Arc<Endpoint>], ok: impl Fn(usize) -> bool) -> Option<usize> {
    let n = endpoints.len();
    let a = first_from(fastrand::usize(..n), n, &ok)?;
    let offset = if n > 1 { fastrand::usize(1..n) } else { 0 };
    let b = first_from((a + offset) % n, n, |i| i != a && ok(i)).unwrap_or(a);
    let (la, lb) = (endpoints[a].in_flight(), endpoints[b].in_flight());
    Some(if lb < la { b } else { a })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn endpoints(n: usize) -> Vec<Arc<Endpoint>> {
        (0..n)
            .map(|i| {
                Arc::new(Endpoint::new(
                    format!("127.0.0.1:{}", 9000 + i).parse().unwrap(),
                ))
            })
            .collect()
    }

    #[test]
    fn round_robin_visits_each_in_turn() {
        let eps = endpoints(3);
        let b = Balancer::new(LbPolicy::RoundRobin);
        let picks: Vec<_> = (0..6).map(|_| b.pick(&eps, 0, &[]).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn every_policy_skips_removed_and_avoided_endpoints() {
        let eps = endpoints(3);
        eps[0].remove();
        for policy in [
            LbPolicy::P2c,
            LbPolicy::RoundRobin,
            LbPolicy::Random,
            LbPolicy::LeastRequest,
        ] {
            let b = Balancer::new(policy);
            for _ in 0..50 {
                assert_eq!(b.pick(&eps, 0, &[1]), Some(2), "{policy:?}");
            }
        }
    }

    #[test]
    fn least_request_and_p2c_prefer_the_idle_endpoint() {
        let eps = endpoints(2);
        let _busy: Vec<_> = (0..5).map(|_| eps[0].begin_request()).collect();
        for policy in [LbPolicy::P2c, LbPolicy::LeastRequest] {
            let b = Balancer::new(policy);
            for _ in 0..20 {
                assert_eq!(b.pick(&eps, 0, &[]), Some(1), "{policy:?}");
            }
        }
    }

    #[test]
    fn nothing_usable_is_none() {
        let eps = endpoints(2);
        eps.iter().for_each(|e| e.set_healthy(false));
        assert_eq!(Balancer::new(LbPolicy::P2c).pick(&eps, 0, &[]), None);
        assert_eq!(Balancer::new(LbPolicy::P2c).pick(&[], 0, &[]), None);
    }
}
