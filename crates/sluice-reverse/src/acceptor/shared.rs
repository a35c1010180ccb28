//! What every handshake consults ([`Shared`]: options, clusters, limits, TLS, counters) and
//! who it comes from ([`Peer`]), with the checks common to registering and draining.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use sluice_session::Rejection;

use super::rate::RateLimiter;
use super::tls;
use crate::cluster::ReverseCluster;
use crate::instance::Limit;
use crate::metrics::ReverseMetrics;
use crate::options::AcceptorOptions;
use crate::protocol::Protocol;
use sluice_net::log_limit::TallyByKind;
use sluice_net::ShutdownSignal;

/// Who is at the other end of a service connection.
#[derive(Debug, Default)]
pub(super) struct Peer {
    /// The source address; `None` over a UNIX socket.
    pub(super) ip: Option<IpAddr>,
    /// The names of the client certificate under mTLS; `None` without one.
    pub(super) cert_names: Option<Vec<String>>,
    /// Whether this connection exceeded its address's handshakes per second (429).
    pub(super) rate_limited: bool,
}

/// What every handshake consults.
#[derive(Debug)]
pub(super) struct Shared<P: Protocol> {
    pub(super) opts: AcceptorOptions,
    pub(super) clusters: HashMap<String, ReverseCluster<P>>,
    /// Sessions across every cluster.
    pub(super) total: Arc<Limit>,
    pub(super) rate: RateLimiter,
    /// Control links open at once.
    pub(super) links: Arc<super::link_limit::LinkLimits>,
    pub(super) shutdown: Option<ShutdownSignal>,
    /// Where handshake outcomes are counted; `None`: nowhere.
    pub(super) metrics: ReverseMetrics,
    /// Refused handshakes by status, logged once per interval each.
    pub(super) refusals: TallyByKind<u16>,
    /// The node's state, which control links report (`DRAINING`); `None`: never draining.
    pub(super) node: Option<tokio::sync::watch::Receiver<sluice_net::NodeState>>,
    /// Every session goes to other processes (a standalone acceptor): HTTP/2 ones cannot.
    pub(super) lends: bool,
}

impl<P: Protocol> Shared<P> {
    /// Counts one handshake outcome: `registered`, `drained`, `closed` or a refusal status.
    pub(super) fn count(&self, result: &str) {
        self.metrics.handshake(result);
    }

    /// The checks common to registering and draining: shutdown (503), handshake rate (429),
    /// service (404), client certificate (401), token (401).
    pub(super) fn admit(
        &self,
        service: &str,
        token: Option<&str>,
        peer: &Peer,
    ) -> Result<ReverseCluster<P>, Rejection> {
        if self.shutdown.as_ref().is_some_and(|s| s.is_triggered()) {
            return Err(Rejection::unavailable("shutting down"));
        }
        if peer.rate_limited {
            return Err(Rejection::limited(
                "handshakes per second from this address",
            ));
        }
        let cluster = self
            .clusters
            .get(service)
            .ok_or_else(|| Rejection::unknown_service(service))?;
        if self.opts.tls.is_some() {
            tls::authorize(&self.opts.clients, peer.cert_names.as_deref(), service)?;
        }
        if !cluster.authorize(token) {
            return Err(Rejection::unauthorized());
        }
        Ok(cluster.clone())
    }
}
