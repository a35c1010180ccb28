//! [`Http1`]: how the proxy's end of a session starts on a registered stream, and the
//! engine's types as the proxy uses them.

use std::sync::Arc;
use std::task::{Context, Poll};

use sluice_reverse::{LeaseError, ParkedIo};

use super::link::{Link, Watch};
use crate::body::Release;
use crate::error::ProxyError;
use crate::http::retry::{Policy, RetryMetrics};

/// A reverse cluster whose sessions the proxy speaks HTTP/1.1 on.
pub type ReverseCluster = sluice_reverse::ReverseCluster<Http1>;
/// One slice of a [`ReverseCluster`]: what a route forwards to.
pub type ReverseSlice = sluice_reverse::ReverseSlice<Http1>;
/// One slice's idle sessions and admission queue.
pub(crate) type SlicePool = sluice_reverse::SlicePool<Http1>;
/// A leased session.
pub(crate) type Session = sluice_reverse::Session<Http1>;
/// Gives a session back when the response it carries has been read to the end.
pub(crate) type Lease = sluice_reverse::Lease<Http1>;
/// The service-facing listener.
pub type Acceptor = sluice_reverse::acceptor::Acceptor<Http1>;
/// The standalone acceptor (`sluice acceptor`): the acceptor plus the handoff socket.
pub type StandaloneAcceptor = sluice_reverse::handoff::StandaloneAcceptor<Http1>;
/// What the admin API reads of a running standalone acceptor.
pub(crate) type BrokerView = sluice_reverse::handoff::BrokerView<Http1>;
/// A reverse cluster fed by a standalone acceptor.
pub(crate) type HandoffSource = sluice_reverse::handoff::Source<Http1>;

/// The proxy's side of a session: a [`Link`], over which the fast path exchanges requests
/// itself and hyper's HTTP/1.1 client serves the rest (with upgrades: a `101` hands the
/// socket to the proxy's WebSocket bridge).
#[derive(Debug, Clone, Copy)]
pub struct Http1;

/// The proxy's own settings of a reverse cluster, kept by the engine for it.
#[derive(Debug, Default)]
pub struct ReverseClusterOptions {
    /// Its `retry = { .. }`, when it allows retries.
    retry: Option<Arc<Policy>>,
}

impl ReverseClusterOptions {
    /// The settings of cluster `name` as `cfg` has them, counting retries in `metrics`.
    pub fn new(name: &str, cfg: &sluice_config::ReverseOptions, metrics: &RetryMetrics) -> Self {
        Self {
            retry: Policy::new(name, &cfg.retry, metrics),
        }
    }

    /// The cluster's retry policy, when it has one.
    pub(crate) fn retry(&self) -> Option<&Arc<Policy>> {
        self.retry.as_ref()
    }
}

impl sluice_reverse::Protocol for Http1 {
    type Client = Link;
    type Connection = Watch;
    type Error = std::io::Error;
    type Options = ReverseClusterOptions;

    async fn handshake(io: ParkedIo) -> Result<(Link, Watch), std::io::Error> {
        Ok(Link::new(io))
    }

    fn is_closed(client: &Link) -> bool {
        client.is_closed()
    }

    fn poll_ready(client: &mut Link, cx: &mut Context<'_>) -> Poll<bool> {
        client.poll_ready(cx)
    }
}

impl Release for Lease {
    /// The response has ended cleanly: the session may carry another request.
    fn finish(&mut self) {
        sluice_reverse::Lease::finish(self);
    }
}

impl From<LeaseError> for ProxyError {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::NoSessions { cluster, slice } => Self::NoSessions { cluster, slice },
            LeaseError::Unavailable {
                reason,
                retry_after,
            } => Self::Unavailable {
                reason,
                retry_after,
            },
        }
    }
}
