//! [`AdminState`], what the admin API reads and changes, as the app builds it; and
//! [`ReloadHook`], how `POST /reload` reaches the binary.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use sluice_config::admin::ListenerStatus;
use sluice_config::Token;

use crate::metrics::Metrics;
use crate::router::LiveRoutes;
use sluice_upstream::reverse::BrokerView;
use sluice_upstream::Upstream;

/// What the admin API reads and changes.
#[derive(Debug)]
pub(crate) struct AdminState {
    pub(super) started: Instant,
    pub(super) listeners: Vec<ListenerStatus>,
    pub(super) acceptor: Option<SocketAddr>,
    pub(super) clusters: BTreeMap<String, Upstream>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) token: Option<Token>,
    /// Every change is refused (`[admin] read_only`).
    pub(super) read_only: bool,
    pub(super) routes: Option<Arc<LiveRoutes>>,
    /// Whether the node takes traffic (`/ready`, `POST /drain`).
    pub(super) readiness: sluice_net::Readiness,
    /// The TLS listeners' certificates, by listener name (swapped in place by renewals).
    pub(super) certificates: BTreeMap<String, Arc<sluice_server::tls::Certificates>>,
    pub(super) reload: Option<ReloadHook>,
    pub(super) relays: Vec<sluice_relay::RelayHandle>,
    /// A standalone acceptor's consumers (`sluice acceptor`).
    pub(super) consumers: Option<BrokerView>,
}

/// What `POST /reload` runs: `Ok` with what happened, or `Err` with why the configuration
/// was not loaded (the running one goes on).
#[derive(Clone)]
pub struct ReloadHook(Arc<dyn Fn() -> ReloadFuture + Send + Sync>);

/// The future a [`ReloadHook`] returns.
pub type ReloadFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>;

impl ReloadHook {
    /// A hook that runs `f` on every `POST /reload`.
    pub fn new(f: impl Fn() -> ReloadFuture + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Runs the reload.
    pub fn run(&self) -> ReloadFuture {
        (self.0)()
    }
}

impl std::fmt::Debug for ReloadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadHook")
    }
}

impl AdminState {
    /// The state of a proxy with these listeners (name, address, TLS), acceptor and
    /// clusters; requests need `token` when one is given.
    pub(crate) fn new(
        listeners: Vec<(String, SocketAddr, bool)>,
        acceptor: Option<SocketAddr>,
        clusters: BTreeMap<String, Upstream>,
        metrics: Arc<Metrics>,
        token: Option<Token>,
    ) -> Self {
        let listeners = listeners
            .into_iter()
            .map(|(name, addr, tls)| ListenerStatus {
                name,
                addr: addr.to_string(),
                tls,
                certificates: Vec::new(),
            })
            .collect();
        Self {
            started: Instant::now(),
            listeners,
            acceptor,
            clusters,
            metrics,
            token,
            read_only: false,
            routes: None,
            readiness: sluice_net::Readiness::default(),
            certificates: BTreeMap::new(),
            reload: None,
            relays: Vec::new(),
            consumers: None,
        }
    }

    /// Shows a standalone acceptor's consumers, their credit and loans, in `/status`.
    pub(crate) fn with_consumers(mut self, broker: BrokerView) -> Self {
        self.consumers = Some(broker);
        self
    }

    /// Shows these relays in `/status` and `/metrics`.
    pub(crate) fn with_relays(mut self, relays: Vec<sluice_relay::RelayHandle>) -> Self {
        self.relays = relays;
        self
    }

    /// Shows these listeners' certificates (names, expiry) in `/status`.
    pub(crate) fn with_certificates(
        mut self,
        certificates: BTreeMap<String, Arc<sluice_server::tls::Certificates>>,
    ) -> Self {
        self.certificates = certificates;
        self
    }

    /// Answers `/ready` by `readiness`, and lets `POST /drain` drain the node.
    pub(crate) fn with_readiness(mut self, readiness: sluice_net::Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// Lets `POST /reload` run `hook`; without it, `/reload` answers 409.
    pub(crate) fn with_reload(mut self, hook: Option<ReloadHook>) -> Self {
        self.reload = hook;
        self
    }

    /// Refuses every change (any method but GET and HEAD) with 403 when `on`.
    pub(crate) fn read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }

    /// Lets `/routes` list and change these routes; without it, `/routes` answers 404.
    pub(crate) fn with_routes(mut self, routes: Arc<LiveRoutes>) -> Self {
        self.routes = Some(routes);
        self
    }
}
