//! The one retry driver: the loop of attempts every data path runs around a request's
//! [`Retries`] — hyper's path to a static cluster and to a reverse slice, and the fast path's
//! relay to either. What differs between them is what a lease is (a pooled connection, an
//! HTTP/2 stream, a session, a raw socket), what an attempt sends, and how another lease is
//! had; those are an [`Attempts`] implementation's. The order of decisions is written once,
//! here, without I/O:
//!
//! 1. an answer whose status the policy retries is replaced only once the next attempt has a
//!    lease ([`Attempts::replace`]: a static connection's answer is held until then, and is
//!    the client's if none can be had; a session's is read off first, as it is capacity);
//! 2. a failure the rules let go again goes to a fresh lease of the same upstream after a
//!    stale one ([`Again::Stale`]), elsewhere after one the policy lists ([`Again::Policy`]);
//! 3. an HTTP/2 connection that refused the request unprocessed (REFUSED_STREAM, or a GOAWAY
//!    not yet acted on) sends it to another lease without using a retry, a bounded number of
//!    times ([`MAX_REFUSED`]), since several connections may be going away at once;
//! 4. anything else ends the request with what happened ([`Attempts::failed`] logs it).

use std::future::Future;

use crate::error::ProxyError;
use crate::retry::{self, Again, Retries};

/// How many times a request may be refused unprocessed by shared connections before such a
/// refusal counts as any other failure: each refusal ends its connection, so more means they go
/// away faster than the request finds one.
pub const MAX_REFUSED: usize = 4;

/// What one attempt came to.
#[derive(Debug)]
pub enum Tried<A, B> {
    /// An answer's head: its status, its body's length when known, and whether the request's
    /// body could go again byte for byte.
    Answer {
        answer: A,
        status: u16,
        len: Option<u64>,
        body: retry::Body,
    },
    /// The attempt failed: how, the error the client gets if it goes no further, whether the
    /// lease may have gone stale (it carried requests before), the request's body, whether a
    /// shared connection refused it unprocessed, and what is left for another attempt.
    Failed(Failure<B>),
    /// The client hung up.
    Gone,
}

/// A failed attempt (see [`Tried::Failed`]).
#[derive(Debug)]
pub struct Failure<B> {
    pub failed: retry::Failed,
    pub error: ProxyError,
    pub stale: bool,
    pub body: retry::Body,
    /// An HTTP/2 connection refused the request unprocessed.
    pub refused: bool,
    /// What the attempt leaves: the request hyper gave back, the lease, or nothing.
    pub back: B,
}

/// What a request goes on with after an attempt that did not end it.
#[derive(Debug)]
pub enum Next<L, A> {
    /// The next attempt, on this lease.
    Lease(L),
    /// No other lease could be had: the client gets this answer after all.
    Answer(A),
    /// No other lease could be had: the client gets this error.
    Failed(ProxyError),
    /// The client hung up while the request waited.
    Gone,
}

/// How a request's attempts ended.
#[derive(Debug)]
pub enum Ended<A> {
    Answered(A),
    Failed(ProxyError),
    Gone,
}

/// One request's attempts on one upstream: what [`drive`] needs of a data path.
pub trait Attempts {
    /// What an attempt goes out on.
    type Lease;
    /// An answer's head and what the path needs of it (the lease it came on, for the fast path).
    type Answer;
    /// What a failed attempt leaves for the next one.
    type Back;

    /// Sends the request on `lease` and waits for its answer's head.
    fn attempt(
        &mut self,
        lease: Self::Lease,
    ) -> impl Future<Output = Tried<Self::Answer, Self::Back>>;

    /// A fresh lease of the same upstream, after a stale one failed with `error`.
    fn renew(
        &mut self,
        back: Self::Back,
        error: ProxyError,
    ) -> impl Future<Output = Next<Self::Lease, Self::Answer>>;

    /// A lease elsewhere (another endpoint, any session), after a failure with `error` the
    /// policy lists or a refusal.
    fn elsewhere(
        &mut self,
        back: Self::Back,
        error: ProxyError,
    ) -> impl Future<Output = Next<Self::Lease, Self::Answer>>;

    /// A lease elsewhere for a retry the policy granted after `answer`; `answer` is given up
    /// once there is one (read off, so that its connection or session goes back), or is the
    /// client's if there is none.
    fn replace(
        &mut self,
        answer: Self::Answer,
    ) -> impl Future<Output = Next<Self::Lease, Self::Answer>>;

    /// The request ends with `error` after an attempt that left `back`: log where it went.
    fn failed(&mut self, back: Self::Back, error: &ProxyError);
}

/// Runs `up`'s attempts from `lease` until an answer is the client's, a failure ends the
/// request, or the client leaves; `retries` decides what goes again.
pub async fn drive<A: Attempts>(
    up: &mut A,
    mut lease: A::Lease,
    retries: &mut Retries,
) -> Ended<A::Answer> {
    let mut refused = 0;
    loop {
        let next = match up.attempt(lease).await {
            Tried::Answer {
                answer,
                status,
                len,
                body,
            } => {
                if !retries.after_status(status, body, len) {
                    return Ended::Answered(answer);
                }
                up.replace(answer).await
            }
            Tried::Failed(f) if f.refused && refused < MAX_REFUSED => {
                refused += 1;
                up.elsewhere(f.back, f.error).await
            }
            Tried::Failed(f) => match retries.after_failure(f.failed, f.stale, f.body) {
                None => {
                    up.failed(f.back, &f.error);
                    return Ended::Failed(f.error);
                }
                Some(Again::Stale) => up.renew(f.back, f.error).await,
                Some(Again::Policy) => up.elsewhere(f.back, f.error).await,
            },
            Tried::Gone => return Ended::Gone,
        };
        lease = match next {
            Next::Lease(next) => next,
            Next::Answer(answer) => return Ended::Answered(answer),
            Next::Failed(e) => return Ended::Failed(e),
            Next::Gone => return Ended::Gone,
        };
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::VecDeque;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::retry::{Body, Failed, Policy, RetryMetrics};
    use sluice_config::{Retry, RetryOn};

    /// A scripted upstream: each attempt takes the next scripted outcome; leases are numbers,
    /// and what the driver asked is written down.
    #[derive(Default)]
    struct Script {
        outcomes: VecDeque<Tried<u16, u32>>,
        /// Whether another lease can be had.
        spare: bool,
        asked: Vec<String>,
        next_lease: u32,
    }

    impl Script {
        fn lease(&mut self) -> Next<u32, u16> {
            self.next_lease += 1;
            match self.spare {
                true => Next::Lease(self.next_lease),
                false => Next::Failed(ProxyError::ConnectTimeout),
            }
        }
    }

    impl Attempts for Script {
        type Lease = u32;
        type Answer = u16;
        type Back = u32;

        async fn attempt(&mut self, lease: u32) -> Tried<u16, u32> {
            self.asked.push(format!("attempt {lease}"));
            self.outcomes.pop_front().unwrap()
        }

        async fn renew(&mut self, back: u32, _: ProxyError) -> Next<u32, u16> {
            self.asked.push(format!("renew {back}"));
            self.lease()
        }

        async fn elsewhere(&mut self, back: u32, _: ProxyError) -> Next<u32, u16> {
            self.asked.push(format!("elsewhere {back}"));
            self.lease()
        }

        async fn replace(&mut self, answer: u16) -> Next<u32, u16> {
            self.asked.push(format!("replace {answer}"));
            match self.lease() {
                Next::Failed(_) => Next::Answer(answer),
                next => next,
            }
        }

        fn failed(&mut self, back: u32, _: &ProxyError) {
            self.asked.push(format!("failed {back}"));
        }
    }

    fn answer(status: u16) -> Tried<u16, u32> {
        Tried::Answer {
            answer: status,
            status,
            len: Some(0),
            body: Body::Kept,
        }
    }

    fn failure(failed: Failed, stale: bool, refused: bool, back: u32) -> Tried<u16, u32> {
        Tried::Failed(Failure {
            failed,
            error: ProxyError::UpstreamInvalid("connection failed"),
            stale,
            body: Body::Kept,
            refused,
            back,
        })
    }

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
        Policy::new("c", &config, &RetryMetrics::default()).unwrap()
    }

    /// Runs a future that never waits (the script's do not) to its end.
    fn run<F: Future>(f: F) -> F::Output {
        let mut f = pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("the script never waits"),
        }
    }

    fn drive_script(
        script: &mut Script,
        policy: Option<&Arc<Policy>>,
        idempotent: bool,
    ) -> Ended<u16> {
        let mut retries = Retries::new(policy, idempotent);
        run(drive(script, 0, &mut retries))
    }

    #[test]
    fn a_stale_lease_is_renewed_once_then_the_failure_ends_the_request() {
        let mut s = Script {
            outcomes: [
                failure(Failed::BeforeResponse, true, false, 0),
                failure(Failed::BeforeResponse, true, false, 1),
            ]
            .into(),
            spare: true,
            ..Script::default()
        };
        let ended = drive_script(&mut s, None, true);
        assert!(matches!(
            ended,
            Ended::Failed(ProxyError::UpstreamInvalid(_))
        ));
        assert_eq!(s.asked, ["attempt 0", "renew 0", "attempt 1", "failed 1"]);
    }

    #[test]
    fn a_listed_status_is_replaced_elsewhere_and_kept_when_there_is_no_elsewhere() {
        let p = policy(2, &[503]);
        let mut s = Script {
            outcomes: [answer(503), answer(200)].into(),
            spare: true,
            ..Script::default()
        };
        assert!(matches!(
            drive_script(&mut s, Some(&p), true),
            Ended::Answered(200)
        ));
        assert_eq!(s.asked, ["attempt 0", "replace 503", "attempt 1"]);

        let mut s = Script {
            outcomes: [answer(503)].into(),
            spare: false,
            ..Script::default()
        };
        assert!(matches!(
            drive_script(&mut s, Some(&p), true),
            Ended::Answered(503)
        ));
    }

    #[test]
    fn the_policy_sends_a_reset_elsewhere_up_to_its_retries() {
        let p = policy(1, &[]);
        let mut s = Script {
            outcomes: [
                failure(Failed::BeforeResponse, false, false, 0),
                failure(Failed::BeforeResponse, false, false, 1),
            ]
            .into(),
            spare: true,
            ..Script::default()
        };
        assert!(matches!(
            drive_script(&mut s, Some(&p), true),
            Ended::Failed(_)
        ));
        assert_eq!(
            s.asked,
            ["attempt 0", "elsewhere 0", "attempt 1", "failed 1"]
        );
    }

    #[test]
    fn refusals_go_elsewhere_without_a_retry_but_only_so_many_times() {
        // Without any policy, and for a POST: refusals alone move the request.
        let mut outcomes: VecDeque<_> = (0..MAX_REFUSED as u32)
            .map(|i| failure(Failed::Unsent, false, true, i))
            .collect();
        outcomes.push_back(answer(200));
        let mut s = Script {
            outcomes,
            spare: true,
            ..Script::default()
        };
        assert!(matches!(
            drive_script(&mut s, None, false),
            Ended::Answered(200)
        ));

        // One more refusal than that counts as a failure: unsent and not stale, so with no
        // policy it ends the request.
        let outcomes = (0..=MAX_REFUSED as u32)
            .map(|i| failure(Failed::Unsent, false, true, i))
            .collect();
        let mut s = Script {
            outcomes,
            spare: true,
            ..Script::default()
        };
        assert!(matches!(
            drive_script(&mut s, None, false),
            Ended::Failed(_)
        ));
        assert_eq!(s.asked.last().unwrap(), &format!("failed {MAX_REFUSED}"));
    }

    #[test]
    fn a_lease_that_cannot_be_had_ends_the_request_with_its_error() {
        let mut s = Script {
            outcomes: [failure(Failed::BeforeResponse, true, false, 0)].into(),
            spare: false,
            ..Script::default()
        };
        assert!(matches!(
            drive_script(&mut s, None, true),
            Ended::Failed(ProxyError::ConnectTimeout)
        ));
    }

    #[test]
    fn a_client_that_left_ends_the_attempts() {
        let mut s = Script {
            outcomes: [Tried::Gone].into(),
            spare: true,
            ..Script::default()
        };
        assert!(matches!(drive_script(&mut s, None, true), Ended::Gone));
        assert_eq!(s.asked, ["attempt 0"]);
    }
}
