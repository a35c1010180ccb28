//! [`Standalone`]: `sluice acceptor` (docs/design.md §4) as a node operators can see into.
//! The standalone acceptor (services register here; Sluice processes borrow their sessions
//! over the handoff socket) with the admin API on `[admin]`: `/status` lists the clusters and
//! each consumer's credit and loans, `/metrics` the sessions, handshakes and refusals, and
//! `/ready`, `POST /drain` and instance drains work as they do on a proxy.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use sluice_config::Config;
use sluice_net::sockets::Sockets;
use tokio::net::TcpListener;

use crate::admin::{self, AdminState};
use crate::app::{bind_admin, StartError};
use crate::metrics::Metrics;
use crate::options;
use sluice_server::Shutdown;
use sluice_upstream::reverse::{ReverseMetrics, SessionGauges, StandaloneAcceptor};
use sluice_upstream::Upstream;

/// A standalone acceptor and its admin API, bound and ready to run.
#[derive(Debug)]
pub struct Standalone {
    broker: StandaloneAcceptor,
    admin: Option<(TcpListener, sluice_config::Admin)>,
    metrics: Arc<Metrics>,
}

impl Standalone {
    /// Binds the acceptor (`[acceptor]`), the handoff socket (`[handoff]`) and the admin API
    /// (`[admin]`, when set).
    pub async fn bind(config: &Config) -> Result<Self, StartError> {
        let mut metrics = Metrics::new();
        let reverse = ReverseMetrics::register(metrics.registry());
        let opts = options::reverse::broker(config)?;
        let clusters = options::reverse::registering_here(config).map(|(name, r)| {
            // It lends sessions and proxies nothing: no proxy settings of its own.
            options::reverse::cluster(name, r, &reverse, Default::default())
        });
        let broker = StandaloneAcceptor::bind_with_metrics(&opts, clusters, &reverse).await?;
        let clusters = broker.view().clusters().values().cloned().collect();
        let gauges = SessionGauges::new(clusters);
        metrics.registry().register_collector(Box::new(gauges));
        let admin = bind_admin(config, &mut Sockets::default()).await?;
        Ok(Self {
            broker,
            admin,
            metrics: Arc::new(metrics),
        })
    }

    /// The acceptor's bound TCP address.
    pub fn acceptor_addr(&self) -> std::io::Result<SocketAddr> {
        self.broker.acceptor_addr()
    }

    /// The admin API's bound address, when `[admin]` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Serves until `trigger` completes, then stops as
    /// [`StandaloneAcceptor::run_until`] does; the admin API answers until the end.
    pub async fn run_until(self, trigger: impl Future<Output = ()>) {
        let stopped = Shutdown::new();
        if let Some((listener, admin)) = self.admin {
            let view = self.broker.view();
            let clusters = view
                .clusters()
                .iter()
                .map(|(name, c)| {
                    let slice = c.slice(sluice_config::DEFAULT_SLICE);
                    (name.clone(), Upstream::from(slice))
                })
                .collect();
            let acceptor = self.broker.acceptor_addr().ok();
            let state = AdminState::new(Vec::new(), acceptor, clusters, self.metrics, admin.token)
                .read_only(admin.read_only)
                .with_readiness(self.broker.readiness().clone())
                .with_consumers(view);
            tokio::spawn(admin::serve(listener, Arc::new(state), stopped.signal()));
        }
        self.broker.run_until(trigger).await;
        stopped.trigger();
    }
}
