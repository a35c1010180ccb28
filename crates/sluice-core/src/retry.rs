//! When a request goes out again: the one rule of both data paths (the hyper path's
//! `upstream::static_cluster::send` and `upstream::reverse::send`, the fast path's
//! `proxy::fast::relay`), without I/O.
//!
//! Two reasons exist. A keep-alive connection the upstream closed while it was idle (or a
//! session whose service went away) fails the next request before any response byte: the
//! request was not processed, and goes again, once, on another connection or session, whatever
//! the cluster's configuration ([`Again::Stale`]). And a cluster's `retry = { .. }`
//! ([`Policy`]) sends a request again after a failure it lists — the connection reset before
//! the response, or an answer such as 503 — up to its `retries`, and only while its budget
//! allows ([`Again::Policy`]). Either way only a request that can go again byte for byte:
//! its body kept in memory, and its method idempotent unless the policy says otherwise.
//! Anything else (response bytes that were not a listed status, a timeout, the client's own
//! body failing) leaves the request's fate unknown, and it is answered with what happened.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_config::Retry;

/// How an attempt at a response head failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// The request never went out (hyper gave it back unsent, or the session ended as it was
    /// leased): it may go again whatever it is.
    Unsent,
    /// The connection closed or failed before any response byte.
    BeforeResponse,
    /// Response bytes came (and were invalid), the time ran out, or the client's body failed.
    Later,
}

/// Whether the request can be sent again byte for byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body, or all of it in memory.
    Kept,
    /// Streamed from the client: what went out is gone.
    Streamed,
}

/// The longest answer body a status retry reads off and keeps (see
/// [`Retries::after_status`]).
pub const KEPT_ANSWER: u64 = 64 * 1024;

/// Why a request goes out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// Its connection or session had gone stale: another of the same upstream will do.
    Stale,
    /// The cluster's policy: elsewhere if the upstream has elsewhere (another endpoint, any
    /// session).
    Policy,
}

/// What clusters' retries count, by cluster: retries by reason (`stale`, `reset`, or the status)
/// and those the budget refused.
#[derive(Debug, Clone, Default)]
pub struct RetryMetrics {
    retries: Family<RetryLabels, Counter>,
    refused: Family<ClusterLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetryLabels {
    cluster: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabel {
    cluster: String,
}

impl RetryMetrics {
    /// The counters, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "upstream_retries",
            "Requests sent to an upstream again, by cluster and reason (stale: the connection or session had closed while idle; reset; or the status that was retried)",
            metrics.retries.clone(),
        );
        registry.register(
            "upstream_retries_refused",
            "Retries a cluster's retry budget refused (the request was answered with what its last attempt got), by cluster",
            metrics.refused.clone(),
        );
        metrics
    }
}

/// A cluster's `retry = { .. }` with more than zero `retries`, and its budget.
#[derive(Debug)]
pub struct Policy {
    cluster: String,
    config: Retry,
    /// The cluster's requests that may still be retried, now.
    requests: AtomicU32,
    /// Their retries, now.
    retries: AtomicU32,
    metrics: RetryMetrics,
}

impl Policy {
    /// Whether a retry may need the request again byte for byte (its `on` lists `reset` or a
    /// status), so that a body worth keeping is read first.
    pub fn replays(&self) -> bool {
        self.config.on.reset || !self.config.on.statuses.is_empty()
    }

    /// The policy `config` describes for `cluster`; `None` when it allows no retries (only
    /// the stale rule then applies, and requests pay for nothing).
    pub fn new(cluster: &str, config: &Retry, metrics: &RetryMetrics) -> Option<Arc<Self>> {
        (config.retries > 0).then(|| {
            Arc::new(Self {
                cluster: cluster.to_owned(),
                config: config.clone(),
                requests: AtomicU32::new(0),
                retries: AtomicU32::new(0),
                metrics: metrics.clone(),
            })
        })
    }

    /// Takes one retry from the budget: retries in flight stay within `budget_percent` of the
    /// requests in flight, or `budget_min`.
    fn take(&self) -> bool {
        let requests = u64::from(self.requests.load(Ordering::Relaxed));
        let share = requests * u64::from(self.config.budget_percent) / 100;
        let allowed = share.max(u64::from(self.config.budget_min));
        let taken = self
            .retries
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (u64::from(n) < allowed).then_some(n + 1)
            });
        if taken.is_err() {
            let label = ClusterLabel {
                cluster: self.cluster.clone(),
            };
            self.metrics.refused.get_or_create(&label).inc();
        }
        taken.is_ok()
    }

    fn count(&self, reason: &str) {
        let labels = RetryLabels {
            cluster: self.cluster.clone(),
            reason: reason.to_owned(),
        };
        self.metrics.retries.get_or_create(&labels).inc();
    }
}

/// One request's retries: what it has used, and its place in its cluster's budget while it
/// lasts.
#[derive(Debug)]
pub struct Retries {
    policy: Option<Arc<Policy>>,
    idempotent: bool,
    /// The stale rule has been used.
    stale: bool,
    /// Retries the policy granted.
    granted: u32,
}

impl Retries {
    /// The retries of a request to a cluster with `policy` (counted in its budget from now
    /// on), its method `idempotent` or not ([`is_idempotent`]).
    pub fn new(policy: Option<&Arc<Policy>>, idempotent: bool) -> Self {
        if let Some(p) = policy {
            p.requests.fetch_add(1, Ordering::Relaxed);
        }
        Self {
            policy: policy.cloned(),
            idempotent,
            stale: false,
            granted: 0,
        }
    }

    /// Whether the policy may ever send this request again, so a copy of it is worth
    /// keeping.
    pub fn may_replay(&self) -> bool {
        self.policy
            .as_ref()
            .is_some_and(|p| p.replays() && self.allowed(p))
    }

    /// Whether the request goes again after an attempt that failed so, on a connection or
    /// session that had carried requests before (`reused`; a session always may have gone
    /// stale: its service may have ended it at any time), its body `body`.
    pub fn after_failure(&mut self, failed: Failed, reused: bool, body: Body) -> Option<Again> {
        let sendable = match failed {
            Failed::Unsent => true,
            Failed::BeforeResponse => body == Body::Kept,
            Failed::Later => return None,
        };
        if !sendable {
            return None;
        }
        if reused && !self.stale && (failed == Failed::Unsent || self.idempotent) {
            self.stale = true;
            if let Some(p) = &self.policy {
                p.count("stale");
            }
            return Some(Again::Stale);
        }
        let policy = self.policy.as_ref()?;
        // A connection that closed before a whole head may have carried part of one (hyper
        // does not say): only an idempotent request goes again after it; any request may after
        // an unsent one.
        let safe = failed == Failed::Unsent || self.idempotent;
        let listed = policy.config.on.reset && safe;
        self.grant(listed, "reset").then_some(Again::Policy)
    }

    /// Whether the request goes again after an answer with `status`, its body `body`, the
    /// answer's body `answer_len` long (when known). Only an answer whose whole body is small
    /// enough to read off and keep ([`KEPT_ANSWER`]) is retried: the client gets it if the next
    /// attempt cannot start, and reading it off gives its connection or session back at once.
    pub fn after_status(&mut self, status: u16, body: Body, answer_len: Option<u64>) -> bool {
        let Some(policy) = &self.policy else {
            return false;
        };
        let listed = policy.config.on.statuses.contains(&status);
        let small = answer_len.is_some_and(|len| len <= KEPT_ANSWER);
        if !listed || !small || body != Body::Kept || !self.allowed(policy) {
            return false;
        }
        self.grant(true, &status.to_string())
    }

    /// Whether `policy` retries this request's method at all.
    fn allowed(&self, policy: &Policy) -> bool {
        self.idempotent || policy.config.non_idempotent
    }

    /// Grants a retry for `reason` if it is `listed`, retries are left and the budget allows.
    fn grant(&mut self, listed: bool, reason: &str) -> bool {
        let Some(policy) = &self.policy else {
            return false;
        };
        if !listed || self.granted >= policy.config.retries || !policy.take() {
            return false;
        }
        self.granted += 1;
        policy.count(reason);
        true
    }
}

impl Drop for Retries {
    fn drop(&mut self) {
        if let Some(p) = &self.policy {
            p.requests.fetch_sub(1, Ordering::Relaxed);
            p.retries.fetch_sub(self.granted, Ordering::AcqRel);
        }
    }
}

/// Whether a method is idempotent (RFC 9110 §9.2.2), so a request that never got a response
/// byte may be sent again.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::RetryOn;

    fn policy(retries: u32, statuses: &[u16]) -> Arc<Policy> {
        let config = Retry {
            retries,
            on: RetryOn {
                connect_failure: true,
                reset: true,
                statuses: statuses.to_vec(),
            },
            ..Retry::default()
        };
        Policy::new("c", &config, &RetryMetrics::default()).expect("retries > 0")
    }

    #[test]
    fn an_idempotent_request_goes_again_after_a_stale_connection() {
        for method in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE] {
            let mut r = Retries::new(None, is_idempotent(&method));
            let again = r.after_failure(Failed::BeforeResponse, true, Body::Kept);
            assert_eq!(again, Some(Again::Stale), "{method}");
        }
        for method in [Method::POST, Method::PATCH, Method::CONNECT] {
            let mut r = Retries::new(None, is_idempotent(&method));
            let again = r.after_failure(Failed::BeforeResponse, true, Body::Kept);
            assert_eq!(again, None, "{method}");
        }
    }

    #[test]
    fn a_streamed_body_is_never_replayed() {
        let mut r = Retries::new(Some(&policy(3, &[503])), true);
        assert_eq!(
            r.after_failure(Failed::BeforeResponse, true, Body::Streamed),
            None
        );
        assert!(!r.after_status(503, Body::Streamed, Some(0)));
    }

    #[test]
    fn an_unsent_request_goes_again_whatever_it_is() {
        let mut r = Retries::new(None, false);
        let again = r.after_failure(Failed::Unsent, true, Body::Streamed);
        assert_eq!(again, Some(Again::Stale));
    }

    #[test]
    fn a_request_that_got_response_bytes_or_timed_out_is_not_sent_again() {
        let mut r = Retries::new(Some(&policy(3, &[])), true);
        assert_eq!(r.after_failure(Failed::Later, true, Body::Kept), None);
    }

    #[test]
    fn the_stale_rule_holds_once_and_only_after_a_reused_connection() {
        let mut r = Retries::new(None, true);
        assert_eq!(
            r.after_failure(Failed::Unsent, true, Body::Kept),
            Some(Again::Stale)
        );
        assert_eq!(r.after_failure(Failed::Unsent, true, Body::Kept), None);
        let mut fresh = Retries::new(None, true);
        assert_eq!(
            fresh.after_failure(Failed::BeforeResponse, false, Body::Kept),
            None
        );
    }

    #[test]
    fn the_policy_retries_listed_failures_up_to_its_count() {
        let p = policy(2, &[503]);
        let mut r = Retries::new(Some(&p), true);
        assert!(r.may_replay());
        assert_eq!(
            r.after_failure(Failed::BeforeResponse, false, Body::Kept),
            Some(Again::Policy)
        );
        assert!(
            !r.after_status(502, Body::Kept, Some(0)),
            "502 is not listed"
        );
        assert!(r.after_status(503, Body::Kept, Some(0)));
        assert!(
            !r.after_status(503, Body::Kept, Some(0)),
            "two retries used"
        );
    }

    #[test]
    fn the_policy_leaves_non_idempotent_requests_alone_unless_told() {
        let p = policy(2, &[503]);
        let mut r = Retries::new(Some(&p), false);
        assert!(!r.may_replay());
        assert!(!r.after_status(503, Body::Kept, Some(0)));
        assert_eq!(
            r.after_failure(Failed::BeforeResponse, false, Body::Kept),
            None
        );
        let config = Retry {
            retries: 2,
            non_idempotent: true,
            on: RetryOn {
                statuses: vec![503],
                ..Retry::default().on
            },
            ..Retry::default()
        };
        let told = Policy::new("c", &config, &RetryMetrics::default());
        let mut r = Retries::new(told.as_ref(), false);
        assert!(r.after_status(503, Body::Kept, Some(0)));
    }

    #[test]
    fn the_budget_bounds_retries_in_flight_by_requests_in_flight() {
        // 20 % of 20 requests is 4 retries in flight; the minimum (3) is below that.
        let p = policy(1, &[503]);
        let mut requests: Vec<Retries> = (0..20).map(|_| Retries::new(Some(&p), true)).collect();
        let granted = requests
            .iter_mut()
            .filter_map(|r| r.after_status(503, Body::Kept, Some(0)).then_some(()))
            .count();
        assert_eq!(granted, 4);
        // Those requests end: their retries leave the budget with them.
        requests.truncate(0);
        assert_eq!(p.retries.load(Ordering::Relaxed), 0);
        assert_eq!(p.requests.load(Ordering::Relaxed), 0);
        // With few requests in flight, the minimum holds.
        let mut few: Vec<Retries> = (0..5).map(|_| Retries::new(Some(&p), true)).collect();
        let granted = few
            .iter_mut()
            .filter_map(|r| r.after_status(503, Body::Kept, Some(0)).then_some(()))
            .count();
        assert_eq!(granted, 3);
    }

    #[test]
    fn no_policy_without_retries() {
        assert!(Policy::new("c", &Retry::default(), &RetryMetrics::default()).is_none());
    }

    #[test]
    fn only_a_small_answer_of_known_length_is_retried() {
        let p = policy(3, &[503]);
        let mut r = Retries::new(Some(&p), true);
        assert!(!r.after_status(503, Body::Kept, None), "unknown length");
        assert!(
            !r.after_status(503, Body::Kept, Some(KEPT_ANSWER + 1)),
            "too long"
        );
        assert!(r.after_status(503, Body::Kept, Some(KEPT_ANSWER)));
    }

    #[test]
    fn a_non_idempotent_request_goes_again_only_unsent() {
        let config = Retry {
            retries: 2,
            non_idempotent: true,
            ..Retry::default()
        };
        let told = Policy::new("c", &config, &RetryMetrics::default());
        let mut r = Retries::new(told.as_ref(), false);
        // The connection may have carried part of an answer: the POST may have been processed.
        assert_eq!(
            r.after_failure(Failed::BeforeResponse, false, Body::Kept),
            None
        );
        assert_eq!(
            r.after_failure(Failed::Unsent, false, Body::Kept),
            Some(Again::Policy)
        );
    }
}
