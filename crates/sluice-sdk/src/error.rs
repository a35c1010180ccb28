//! [`Error`]: what went wrong, where, and whether retrying can help.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use sluice_session::Rejection;

/// An SDK failure. Cloneable so that [`Status`](crate::Status) can hold the last one.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The options can never work (local; not retried).
    #[error("invalid options: {0}")]
    Config(String),
    /// `serve` was called outside a Tokio runtime (local; not retried).
    #[error("serve must be called from within a Tokio runtime")]
    NoRuntime,
    /// The acceptor could not be reached (network; retried).
    #[error("cannot connect to the acceptor {acceptor}: {source}")]
    Connect {
        /// The acceptor as configured.
        acceptor: String,
        /// The socket error.
        #[source]
        source: Arc<io::Error>,
    },
    /// A many-node acceptor's name did not resolve (DNS; retried every `resolve_interval`;
    /// the nodes it had stay).
    #[error("cannot resolve the acceptor's name {name}: {source}")]
    Resolve {
        /// The name as configured.
        name: String,
        /// The resolver's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The TLS handshake with the acceptor failed (network or certificates; retried).
    #[error("TLS handshake with the acceptor failed: {0}")]
    Tls(#[source] Arc<io::Error>),
    /// Connecting plus the acceptor's answer took longer than `handshake_timeout` (retried).
    #[error("the acceptor did not answer within {0:?}")]
    Timeout(Duration),
    /// The acceptor answered with a refusal: 400, 401 and 404 are configuration errors and
    /// 410 says an operator drained the instance (until `sluice ctl resume`); none of them is
    /// retried. 429, 503 and anything else are.
    #[error("the acceptor refused with status {status}: {reason}")]
    Refused {
        /// The HTTP status of the refusal.
        status: u16,
        /// The acceptor's reason, as it sent it (its body; printable text only, at most a
        /// line), e.g. `unknown service "nosuch"`; `"(no reason given)"` when it sent none.
        reason: String,
    },
    /// An HTTP/2 registration ([`Options::streams`](crate::Options)) was answered with a
    /// `101` that does not name `h2`: the acceptor does not take HTTP/2 sessions (an older
    /// one). The deployment must change, so this is not retried.
    #[error(
        "the acceptor does not take HTTP/2 sessions: its 101 names no Sluice-Protocol: h2 \
         (upgrade it, or serve HTTP/1.1 sessions without Options::streams)"
    )]
    Http2Unsupported,
    /// The acceptor's answer is not the session protocol (upstream; retried).
    #[error("the acceptor's answer is not the session protocol: {0}")]
    Protocol(#[source] Rejection),
    /// Reading or writing the handshake failed (network; retried).
    #[error("I/O error on the acceptor connection: {0}")]
    Io(#[source] Arc<io::Error>),
}

impl Error {
    /// Whether dialing again may succeed. `false` for bad options, for 400, 401, 404 and
    /// 410, and for an acceptor without HTTP/2 sessions.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Config(_) | Error::NoRuntime | Error::Http2Unsupported => false,
            Error::Refused { status, .. } => !matches!(status, 400 | 401 | 404 | 410),
            _ => true,
        }
    }

    /// Whether the connect itself was refused (`ECONNREFUSED`): nothing listens there.
    pub(crate) fn is_connection_refused(&self) -> bool {
        matches!(self, Error::Connect { source, .. } if source.kind() == io::ErrorKind::ConnectionRefused)
    }

    /// Whether an operator drained this instance (`410 Gone`): the sessions stop re-dialing,
    /// and one registration probes every [`Options::drained_probe`](crate::Options) until
    /// `sluice ctl resume` lets it through (or the capacity is set again).
    pub fn is_drained(&self) -> bool {
        matches!(self, Error::Refused { status: 410, .. })
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(Arc::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_refusals_are_permanent_and_load_refusals_are_not() {
        let refused = |status| Error::Refused {
            status,
            reason: String::new(),
        };
        for status in [400, 401, 404, 410] {
            assert!(!refused(status).is_retryable());
        }
        for status in [429, 503, 502] {
            assert!(refused(status).is_retryable());
        }
        assert!(Error::Timeout(Duration::from_secs(1)).is_retryable());
        assert!(!Error::Config("x".into()).is_retryable());
        assert!(!Error::Http2Unsupported.is_retryable());
    }
}
