//! Why a lease or a hand-over failed.

use sluice_session::Rejection;

/// Seconds a client is told to wait when a slice has no capacity.
pub const RETRY_AFTER_SECS: u32 = 1;

/// Why no session could be leased: the proxy answers 503 for each.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseError {
    /// No session is registered for the slice, nor expected.
    #[error("no sessions registered for cluster {cluster} (slice {slice})")]
    NoSessions {
        /// The cluster.
        cluster: String,
        /// The slice.
        slice: String,
    },
    /// No capacity: the queue is full, the wait expired, or the slice closed.
    #[error("{reason}")]
    Unavailable {
        /// Why, for the response and the log.
        reason: &'static str,
        /// Seconds the client is told to wait (`Retry-After`).
        retry_after: u32,
    },
}

impl LeaseError {
    pub(crate) fn unavailable(reason: &'static str) -> Self {
        Self::Unavailable {
            reason,
            retry_after: RETRY_AFTER_SECS,
        }
    }
}

/// Why a handed-over session could not be taken in.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// A session limit, or the instance drains.
    #[error("refused: {0}")]
    Refused(Rejection),
    /// The descriptor is not a usable stream socket.
    #[error("not a stream socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The protocol's client could not start on it.
    #[error("HTTP/1.1 client: {0}")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
}
