//! [`Leased`]: what the fast path (`proxy::fast`) exchanges a request on — a static cluster's
//! pooled connection or a reverse slice's session — and how each is given back.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use sluice_core::error::ProxyError;
use sluice_core::retry::Policy;

/// A connection or session leased for one request.
pub trait Leased: Send + Sized {
    /// The byte stream the request goes out on.
    type Io: AsyncRead + AsyncWrite + Unpin + Send;

    /// The stream.
    fn io(&mut self) -> &mut Self::Io;

    /// How long the upstream has from the request's first byte to its response head.
    fn response_timeout(&self) -> Duration;

    /// Whether it carried requests before, so that a failure before any response byte may
    /// mean it had gone stale (closed by the upstream while idle).
    fn may_be_stale(&self) -> bool;

    /// Whether a request with a body of `len` bytes may go out again: the upstream's hyper
    /// path has such bodies in memory (a session's request body up to `request_buffer` is read
    /// ahead; a static cluster with a retry policy reads up to 64 KiB), so it replays them.
    fn replays_bodies(&self, len: usize) -> bool;

    /// Whether a retry gives this lease up before it leases another: a session is capacity,
    /// and may be the one the next attempt needs; a static connection is held until the next
    /// attempt has its own, so that its answer is the client's if none can be had.
    fn frees_first(&self) -> bool;

    /// Replaces a stale connection or session with another of the same upstream.
    fn renew(&mut self) -> impl Future<Output = Result<(), ProxyError>> + Send;

    /// The cluster's retry policy, when it has one (`sluice_core::retry`).
    fn retry_policy(&self) -> Option<&Arc<Policy>>;

    /// Another lease of the same upstream for a retry the policy granted: elsewhere when the
    /// upstream has elsewhere (another endpoint; any session). It holds nothing of this one,
    /// which may be given up before it resolves.
    fn another(&self) -> impl Future<Output = Result<Self, ProxyError>> + Send + 'static;

    /// How many bytes of a response to read before the client gets any: a session is freed as
    /// soon as its response has been read off it, so a slow client does not hold it (its
    /// cluster's `response_buffer`); a static connection's response streams as it comes
    /// (`None`).
    fn read_ahead(&self) -> Option<usize>;

    /// Ends the lease after the response has been read off: back to its pool when `reusable`.
    fn release(self, reusable: bool);

    /// Logs a failure of the exchange, naming where it went.
    fn log_failure(&self, e: &ProxyError);

    /// Who serves the request, for the access log.
    fn served_by(&self) -> crate::served::ServedBy;

    /// Counts the response head it answered with, `elapsed` after the request went out (a
    /// static endpoint's metrics; sessions count nothing here).
    fn observe_response(&self, _status: u16, _elapsed: Duration) {}
}
