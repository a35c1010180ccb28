//! When a request goes out a second time: the one rule of both data paths (the hyper path's
//! `upstream::exchange`, the fast path's `proxy::fast::relay`), without I/O.
//!
//! A keep-alive connection the upstream closed while it was idle (or a session whose service
//! went away) fails the next request before any response byte: the request was not processed,
//! and may be sent again, once, on another connection or session. Anything later (a response
//! byte, a timeout, the client's own body failing) leaves the request's fate unknown, and it is
//! answered with the error instead.

use http::Method;

/// How an attempt at a response head failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failed {
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
pub(crate) enum Body {
    /// No body, or all of it in memory.
    Kept,
    /// Streamed from the client: what went out is gone.
    Streamed,
}

/// What is known of a failed attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt {
    pub(crate) failed: Failed,
    /// The connection had carried requests before (a session always may have gone stale: its
    /// service may have ended it at any time), so a failure before the response may mean it
    /// was closed while idle.
    pub(crate) reused: bool,
    /// This was already the second attempt.
    pub(crate) retried: bool,
}

impl Attempt {
    /// Whether the request goes out once more after this attempt (`replayable`: see
    /// [`replayable`]).
    pub(crate) fn again(&self, replayable: bool) -> bool {
        if self.retried || !self.reused {
            return false;
        }
        match self.failed {
            Failed::Unsent => true,
            Failed::BeforeResponse => replayable,
            Failed::Later => false,
        }
    }
}

/// Whether a request that may have reached the upstream can be sent again: idempotent
/// (see [`is_idempotent`]) with its body kept.
pub(crate) fn replayable(idempotent: bool, body: Body) -> bool {
    idempotent && body == Body::Kept
}

/// Whether a method is idempotent (RFC 9110 §9.2.2), so a request that never got a response
/// byte may be sent again.
pub(crate) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(failed: Failed) -> Attempt {
        Attempt {
            failed,
            reused: true,
            retried: false,
        }
    }

    fn kept(method: &Method) -> bool {
        replayable(is_idempotent(method), Body::Kept)
    }

    #[test]
    fn an_idempotent_request_goes_again_after_a_stale_connection() {
        let stale = attempt(Failed::BeforeResponse);
        for method in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE] {
            assert!(stale.again(kept(&method)), "{method}");
        }
        for method in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!stale.again(kept(&method)), "{method}");
        }
    }

    #[test]
    fn a_streamed_body_is_never_replayed() {
        let body = replayable(is_idempotent(&Method::PUT), Body::Streamed);
        assert!(!attempt(Failed::BeforeResponse).again(body));
    }

    #[test]
    fn an_unsent_request_goes_again_whatever_it_is() {
        assert!(attempt(Failed::Unsent).again(false));
    }

    #[test]
    fn a_request_that_got_response_bytes_or_timed_out_is_not_sent_again() {
        assert!(!attempt(Failed::Later).again(true));
    }

    #[test]
    fn only_once_and_only_after_a_reused_connection() {
        let mut second = attempt(Failed::Unsent);
        second.retried = true;
        assert!(!second.again(true));
        let mut fresh = attempt(Failed::BeforeResponse);
        fresh.reused = false;
        assert!(!fresh.again(true));
    }
}
