//! [`SessionHttp`]: how the proxy's end of a session starts on a registered stream — HTTP/1.1,
//! or HTTP/2 when the service registered it so — and the engine's types as the proxy uses
//! them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use sluice_reverse::{LeaseError, ParkedIo};

use super::h2::{H2Connection, H2Stream};
use super::link::{Link, Watch};
use sluice_core::body::Release;
use sluice_core::error::ProxyError;
use sluice_core::retry::{Policy, RetryMetrics};

/// A reverse cluster, whose sessions the proxy speaks HTTP/1.1 or HTTP/2 on.
pub type ReverseCluster = sluice_reverse::ReverseCluster<SessionHttp>;
/// One slice of a [`ReverseCluster`]: what a route forwards to.
pub type ReverseSlice = sluice_reverse::ReverseSlice<SessionHttp>;
/// One slice's idle sessions and admission queue.
pub(crate) type SlicePool = sluice_reverse::SlicePool<SessionHttp>;
/// A leased session.
pub(crate) type Session = sluice_reverse::Session<SessionHttp>;
/// Gives a session back when the response it carries has been read to the end.
pub(crate) type Lease = sluice_reverse::Lease<SessionHttp>;
/// The service-facing listener.
pub type Acceptor = sluice_reverse::acceptor::Acceptor<SessionHttp>;
/// The standalone acceptor (`sluice acceptor`): the acceptor plus the handoff socket.
pub type StandaloneAcceptor = sluice_reverse::handoff::StandaloneAcceptor<SessionHttp>;
/// What the admin API reads of a running standalone acceptor.
pub type BrokerView = sluice_reverse::handoff::BrokerView<SessionHttp>;
/// A reverse cluster fed by a standalone acceptor.
pub type HandoffSource = sluice_reverse::handoff::Source<SessionHttp>;

/// What the proxy speaks over sessions: HTTP/1.1 on a [`Link`], over which the fast path
/// exchanges requests itself and hyper's HTTP/1.1 client serves the rest (with upgrades: a
/// `101` hands the socket to the proxy's WebSocket bridge); or HTTP/2, one [`H2Stream`] per
/// stream the service declared, which hyper's HTTP/2 client serves.
#[derive(Debug, Clone, Copy)]
pub struct SessionHttp;

/// The proxy's end of a session, as a lease holds it.
#[derive(Debug)]
pub enum SessionClient {
    /// An HTTP/1.1 session.
    Http1(Link),
    /// One stream of an HTTP/2 session.
    H2(H2Stream),
}

/// A session's task: resolves when its connection ends.
pub enum SessionConnection {
    /// An HTTP/1.1 session's watch.
    Http1(Watch),
    /// An HTTP/2 session's hyper connection.
    H2(H2Connection),
}

impl std::fmt::Debug for SessionConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Http1(watch) => watch.fmt(f),
            Self::H2(_) => f.write_str("H2Connection"),
        }
    }
}

impl Future for SessionConnection {
    type Output = std::io::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::Http1(watch) => Pin::new(watch).poll(cx),
            Self::H2(conn) => conn.as_mut().poll(cx),
        }
    }
}

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

impl sluice_reverse::Protocol for SessionHttp {
    type Client = SessionClient;
    type Connection = SessionConnection;
    type Error = std::io::Error;
    type Options = ReverseClusterOptions;

    async fn handshake(
        io: ParkedIo,
        streams: Option<u32>,
    ) -> Result<(SessionClient, SessionConnection), std::io::Error> {
        match streams {
            None => {
                let (link, watch) = Link::new(io);
                Ok((SessionClient::Http1(link), SessionConnection::Http1(watch)))
            }
            Some(n) => {
                let (stream, conn) = H2Stream::start(io, n).await?;
                Ok((SessionClient::H2(stream), SessionConnection::H2(conn)))
            }
        }
    }

    fn share(client: &SessionClient) -> Option<SessionClient> {
        match client {
            SessionClient::Http1(_) => None,
            SessionClient::H2(stream) => Some(SessionClient::H2(stream.share())),
        }
    }

    fn is_shared(client: &SessionClient) -> bool {
        matches!(client, SessionClient::H2(_))
    }

    fn end(client: &SessionClient) -> bool {
        match client {
            SessionClient::Http1(_) => true,
            SessionClient::H2(stream) => stream.end(),
        }
    }

    fn is_closed(client: &SessionClient) -> bool {
        match client {
            SessionClient::Http1(link) => link.is_closed(),
            SessionClient::H2(stream) => stream.is_closed(),
        }
    }

    fn poll_ready(client: &mut SessionClient, cx: &mut Context<'_>) -> Poll<bool> {
        match client {
            SessionClient::Http1(link) => link.poll_ready(cx),
            SessionClient::H2(stream) => stream.poll_ready(cx),
        }
    }
}

/// A leased session held by the body streamed off it (`sluice_core::body::Release`).
#[derive(Debug)]
pub(crate) struct HeldLease(pub(crate) Lease);

impl Release for HeldLease {
    /// The response has ended cleanly: the session may carry another request.
    fn finish(&mut self) {
        self.0.finish();
    }
}

/// The answer to a request the slice could not lease a session for.
pub(crate) fn refused(e: LeaseError) -> ProxyError {
    match e {
        LeaseError::NoSessions { cluster, slice } => ProxyError::NoSessions { cluster, slice },
        LeaseError::Unavailable {
            reason,
            retry_after,
        } => ProxyError::Unavailable {
            reason,
            retry_after,
        },
    }
}
