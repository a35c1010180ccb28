//! [`Proxy`]: a whole Sluice built from a validated configuration.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_config::{Action, ClusterKind, Config, SessionSource};
use sluice_handoff::Handoff;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::access_log::AccessLog;
use crate::admin::{self, AdminState, ReloadHook};
use crate::metrics::Metrics;
use crate::options;
use crate::otel::Tracing;
use crate::proxy::ProxyService;
use crate::reload::InPlace;
use crate::restart::{self, Inherited, ListenerFds, RestartError, Stopped, UpgradeSocket};
use crate::router::{LiveRoutes, RouteTable};
use sluice_core::request_id::RequestIds;
use sluice_core::retry::RetryMetrics;
use sluice_net::sockets::{self, Sockets};
use sluice_server::{tls, Group, Server, Shutdown};
use sluice_upstream::reverse::{Acceptor, HandoffSource};
use sluice_upstream::reverse::{ReverseClusterOptions, ReverseMetrics, SessionGauges};
use sluice_upstream::{ReverseCluster, StaticCluster, StaticMetrics, Upstream};

/// Why a configuration could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration asks for a part this build of `sluice` leaves out (a cargo feature
    /// off; see the crate's `[features]`).
    #[error(transparent)]
    Unbuilt(#[from] crate::router::Unbuilt),
    /// A listener's address could not be bound.
    #[error("listener {listener}: cannot bind {addr}: {source}")]
    Bind {
        /// The listener's name.
        listener: String,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The acceptor's TCP address or UNIX socket could not be bound.
    #[error("acceptor: cannot bind {addr}: {source}")]
    Acceptor {
        /// The TCP address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The acceptor's certificate, key or client CA was rejected by rustls.
    #[error("acceptor: TLS: {source}")]
    AcceptorTls {
        /// What rustls said.
        #[source]
        source: std::io::Error,
    },
    /// A static cluster's TLS settings were refused (rustls, or no trust anchors).
    #[error("cluster {cluster}: TLS: {source}")]
    ClusterTls {
        /// The cluster's name.
        cluster: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The access log's file could not be opened.
    #[error("access log {target}: {source}")]
    AccessLog {
        /// Where it was to go.
        target: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The OTLP exporter of `[tracing]` could not be set up.
    #[error(transparent)]
    Tracing(#[from] crate::otel::TracingError),
    /// The upgrade socket (`[runtime] upgrade_socket`) could not be bound.
    #[error(transparent)]
    Upgrade(#[from] RestartError),
    /// A relay's listener (or its socket options) could not be set up.
    #[error("relay {relay}: cannot bind {addr}: {source}")]
    Relay {
        /// The relay's name.
        relay: String,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A standalone acceptor (`sluice acceptor`) could not start.
    #[error(transparent)]
    Standalone(#[from] sluice_reverse::handoff::BrokerError),
    /// A listener's certificate or key was rejected by rustls.
    #[error("listener {listener}: TLS: {source}")]
    Tls {
        /// The listener's name.
        listener: String,
        /// What rustls said.
        #[source]
        source: std::io::Error,
    },
}

/// How long a stopping node waits for its control links to say `DRAINING`.
const DRAINING_SAID: Duration = Duration::from_secs(1);

/// A proxy with its listeners bound, ready to run.
#[derive(Debug)]
pub struct Proxy {
    servers: Vec<Server>,
    /// The TLS listeners' HTTP/3 endpoints (`http3 = true`).
    quic: Vec<crate::quic::Endpoint>,
    service: ProxyService<LiveRoutes>,
    /// The routes, shared with the admin API, which changes them at runtime.
    routes: Arc<LiveRoutes>,
    /// What a reload may change without a new process.
    in_place: InPlace,
    clusters: BTreeMap<String, Upstream>,
    acceptor: Option<Acceptor>,
    grace: Duration,
    /// Where a successor may ask to take over (hot restart).
    upgrade: Option<UpgradeSocket>,
    /// Every listening socket, for that successor.
    sockets: Sockets,
    /// The predecessor's connection, on which its idle sessions arrive (hot restart).
    predecessor: Option<(Handoff, PathBuf)>,
    /// Reverse clusters fed by a standalone acceptor, by its handoff socket.
    consumers: BTreeMap<PathBuf, Vec<HandoffSource>>,
    /// Requests, handshakes, sessions and queues, for `/metrics`.
    metrics: Arc<Metrics>,
    /// The admin API's listener and token (`[admin]`).
    admin: Option<(TcpListener, sluice_config::Admin)>,
    /// What `POST /reload` runs (set by the binary).
    reload: Option<ReloadHook>,
    /// Becomes `true` once a successor has the listening sockets (hot restart).
    upgraded: watch::Sender<bool>,
    /// Split-TCP relays (`[[relay]]`), bound.
    relays: Vec<sluice_relay::Relay>,
    /// Whether the node takes traffic: `/ready`, and `DRAINING` on control links.
    readiness: sluice_net::Readiness,
    /// The TLS listeners' certificates, by listener name.
    certificates: BTreeMap<String, Arc<sluice_server::tls::Certificates>>,
}

impl Proxy {
    /// Builds clusters and routes from `config` and binds every listener (and the upgrade
    /// socket, when `[runtime] upgrade_socket` is set).
    pub async fn bind(config: &Config) -> Result<Self, StartError> {
        Self::bind_inheriting(config, None).await
    }

    /// The same as [`bind`](Self::bind), for a hot restart's successor: listeners whose name
    /// and address match a socket the predecessor handed over accept on it instead of binding,
    /// and the predecessor's idle sessions are adopted once the proxy runs.
    pub async fn bind_inheriting(
        config: &Config,
        inherited: Option<Inherited>,
    ) -> Result<Self, StartError> {
        if let Some(unbuilt) = RouteTable::unbuilt(config) {
            return Err(unbuilt.into());
        }
        if let Some(unbuilt) = crate::quic::unbuilt(config) {
            return Err(unbuilt.into());
        }
        let (mut sockets, predecessor) = match inherited.map(Inherited::into_parts) {
            Some((sockets, feed)) => (sockets, Some(feed)),
            None => (Sockets::default(), None),
        };
        let mut metrics = Metrics::new();
        let reverse_metrics = ReverseMetrics::register(metrics.registry());
        let static_metrics = StaticMetrics::register(metrics.registry());
        let retry_metrics = RetryMetrics::register(metrics.registry());
        let counted = (&reverse_metrics, &static_metrics, &retry_metrics);
        let clusters = build_clusters(config, counted)?;
        resolve_names(&clusters).await;
        let gauges = SessionGauges::new(reverse_clusters(&clusters).collect());
        metrics.registry().register_collector(Box::new(gauges));
        let routes = Arc::new(LiveRoutes::from_config(config, &clusters));
        let (servers, quic) = bind_listeners(config, &mut sockets, &metrics).await?;
        let relays = bind_relays(config, &mut sockets)?;
        let certificates: BTreeMap<_, _> = servers
            .iter()
            .filter_map(|s| Some((s.name().to_owned(), Arc::clone(s.certificates()?))))
            .collect();
        metrics.add_relays(relays.iter().map(sluice_relay::Relay::handle).collect());
        if !certificates.is_empty() {
            let expiry = sluice_server::tls::ExpiryCollector(certificates.clone());
            metrics.registry().register_collector(Box::new(expiry));
        }
        let tracing = config.tracing.as_ref();
        let tracing = tracing
            .map(|t| Tracing::start(t, metrics.registry()))
            .transpose()?;
        let metrics = Arc::new(metrics);
        let service = proxy_service(config, &routes, &metrics, tracing)?;
        let acceptor = bind_acceptor(config, &clusters, &mut sockets).await?;
        let readiness = sluice_net::Readiness::default();
        let acceptor = acceptor.map(|a| a.with_metrics(reverse_metrics).with_readiness(&readiness));
        let admin = bind_admin(config, &mut sockets).await?;
        sockets.close_unused();
        // After the listeners: a predecessor still holds the path until it has handed them.
        let upgrade = config.runtime.upgrade_socket.as_deref();
        let upgrade = upgrade.map(UpgradeSocket::bind).transpose()?;
        let consumers = handoff_sources(config, &clusters);

        let in_place = InPlace::new(config, Arc::clone(&routes), clusters.clone())
            .with_certificates(certificates.clone());
        Ok(Self {
            servers,
            quic,
            service,
            routes,
            in_place,
            clusters,
            acceptor,
            grace: config.runtime.shutdown_grace,
            upgrade,
            sockets,
            predecessor,
            consumers,
            metrics,
            admin,
            reload: None,
            upgraded: watch::channel(false).0,
            relays,
            readiness,
            certificates,
        })
    }

    /// Each listener's name and bound address.
    pub fn local_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.servers
            .iter()
            .filter_map(|s| Some((s.name().to_owned(), s.local_addr().ok()?)))
            .collect()
    }

    /// Each HTTP/3 endpoint's listener name and bound UDP address.
    pub fn http3_addrs(&self) -> Vec<(String, SocketAddr)> {
        #[cfg(feature = "http3")]
        let addrs = self
            .quic
            .iter()
            .filter_map(|e| Some((e.name().to_owned(), e.local_addr().ok()?)))
            .collect();
        #[cfg(not(feature = "http3"))]
        let addrs = Vec::new();
        addrs
    }

    /// Each relay's name, address, counters and pool control.
    pub fn relays(&self) -> Vec<sluice_relay::RelayHandle> {
        self.relays
            .iter()
            .map(sluice_relay::Relay::handle)
            .collect()
    }

    /// The cluster with this name, for runtime changes (adding or removing endpoints).
    pub fn cluster(&self, name: &str) -> Option<&Upstream> {
        self.clusters.get(name)
    }

    /// Lets the admin API's `POST /reload` run `hook` (the `sluice` binary starts a successor
    /// of itself); without one, reload is not offered.
    pub fn with_reload(mut self, hook: ReloadHook) -> Self {
        self.reload = Some(hook);
        self
    }

    /// What a reload can change inside this process (routes, static endpoints).
    pub fn in_place(&self) -> InPlace {
        self.in_place.clone()
    }

    /// Turns `true` once a successor has taken the listening sockets: a hot restart (or a
    /// reload) is under way and this process is draining.
    pub fn upgraded(&self) -> watch::Receiver<bool> {
        self.upgraded.subscribe()
    }

    /// The admin API's bound address, when `[admin]` is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref()?.0.local_addr().ok()
    }

    /// The proxy's metrics (what `GET /metrics` on the admin API renders).
    /// The fast path its listeners serve HTTP/1.1 with (unit tests drive it directly).
    #[cfg(test)]
    pub(crate) fn fast_path(&self) -> crate::proxy::fast::FastPath {
        self.service.fast_path()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The acceptor's bound TCP address, when reverse clusters are configured.
    pub fn acceptor_addr(&self) -> Option<SocketAddr> {
        self.acceptor.as_ref()?.local_addr().ok()
    }

    /// The reverse cluster with this name (sessions, idle counts, drain).
    pub fn reverse_cluster(&self, name: &str) -> Option<&ReverseCluster> {
        match self.clusters.get(name)? {
            Upstream::Reverse(slice) => Some(slice.cluster()),
            Upstream::Static(_) => None,
        }
    }

    /// Serves until `trigger` resolves, then drains gracefully within the configured grace.
    ///
    /// With an upgrade socket, a successor asking to take over (`sluice run --upgrade`) also
    /// ends the run: it gets the listening sockets, this process stops accepting, finishes
    /// its in-flight requests, hands each idle session over as it becomes idle, and returns.
    pub async fn run_until(mut self, trigger: impl Future<Output = ()>) {
        for upstream in self.clusters.values() {
            upstream.start();
        }
        let reverse = self.reverse_clusters();
        // Consumers give their sessions back once the servers have drained (not in a hot
        // restart: the successor takes the idle sessions then).
        let consumers_stop = Shutdown::new();
        let consumers: Vec<_> = std::mem::take(&mut self.consumers)
            .into_iter()
            .map(|(path, sources)| {
                let stop = consumers_stop.signal();
                tokio::spawn(sluice_reverse::handoff::consume(path, sources, stop))
            })
            .collect();
        if let Some((conn, path)) = self.predecessor.take() {
            let total = self
                .acceptor
                .as_ref()
                .map_or_else(Arc::default, Acceptor::total);
            tokio::spawn(restart::adopt_sessions(conn, path, reverse.clone(), total));
        }
        // Without an upgrade socket the duplicates go now: they would keep the listening
        // sockets open (connections queued, never accepted) while the servers drain.
        let fds = match self.upgrade.is_some() {
            true => self.listener_fds(),
            false => {
                drop(std::mem::take(&mut self.sockets));
                ListenerFds::default()
            }
        };
        let admin = self
            .admin
            .take()
            .map(|(l, admin)| (l, self.admin_state(admin)));
        let mut group = Group::new();
        if let Some((listener, state)) = admin {
            tokio::spawn(admin::serve(listener, Arc::new(state), group.signal()));
        }
        let fast: Arc<dyn sluice_server::fast::FastHttp1> = Arc::new(self.service.fast_path());
        let own_h2: Arc<dyn sluice_server::h2own::Pipeline> = Arc::new(self.service.clone());
        for server in self.servers {
            let server = server
                .with_fast_path(fast.clone())
                .with_own_http2(Arc::clone(&own_h2));
            group.add(server, self.service.clone(), self.grace);
        }
        for endpoint in std::mem::take(&mut self.quic) {
            let serving = (self.service.clone(), self.grace);
            crate::quic::add(&mut group, endpoint, serving, self.upgraded.subscribe());
        }
        let acceptor = self.acceptor.map(|a| tokio::spawn(a.run(group.signal())));
        let relays: Vec<_> = std::mem::take(&mut self.relays)
            .into_iter()
            .map(|relay| tokio::spawn(relay.run(group.signal().wait(), self.grace)))
            .collect();
        let mut stopped = Stopped::Triggered;
        self.readiness.ready();
        let readiness = self.readiness.clone();
        let links: Vec<_> = reverse.values().map(|c| Arc::clone(c.links())).collect();
        let stopping: Vec<_> = reverse.values().cloned().collect();
        // A real stop (not a hot restart, where the sessions stay) tells the services to move
        // their sessions elsewhere, and lets their links say so before anything stops. The
        // services close nothing here: the sessions answer what is queued, then close. The
        // idle ones close only once the links have said DRAINING (or could not within
        // DRAINING_SAID): a service that saw them close first would dial this node again.
        let trigger = async move {
            trigger.await;
            readiness.stop();
            sluice_reverse::links::told_draining(&links, DRAINING_SAID).await;
            for cluster in &stopping {
                cluster.stopping();
            }
        };
        let stop = async {
            stopped = restart::stop_or_upgrade(
                trigger,
                self.upgrade,
                fds,
                &reverse,
                self.grace,
                &self.upgraded,
            )
            .await;
        };
        group.run_until(stop).await;
        // Relays drain within the same grace, from the same signal.
        futures_util::future::join_all(relays).await;
        if let Some(task) = acceptor {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "the acceptor task failed");
            }
        }
        match stopped {
            Stopped::Upgraded(handover) => restart::finish_handover(&reverse, handover).await,
            Stopped::Triggered => {
                consumers_stop.trigger();
                let returned = futures_util::future::join_all(consumers);
                if tokio::time::timeout(self.grace, returned).await.is_err() {
                    tracing::warn!("sessions still lent to this process after the grace period; they close with it");
                }
            }
        }
        // Sessions would otherwise outlive the proxy in a process that goes on (an embedding
        // program, `sluice demo`): their connection tasks keep the cluster alive. Closing them
        // tells the services, which re-dial wherever Sluice runs next.
        for cluster in reverse.values() {
            cluster.close();
        }
    }

    fn admin_state(&self, admin: sluice_config::Admin) -> AdminState {
        let listeners = self
            .servers
            .iter()
            .filter_map(|s| Some((s.name().to_owned(), s.local_addr().ok()?, s.is_tls())))
            .collect();
        let acceptor = self.acceptor.as_ref().and_then(|a| a.local_addr().ok());
        let clusters = self.clusters.clone();
        AdminState::new(
            listeners,
            acceptor,
            clusters,
            Arc::clone(&self.metrics),
            admin.token,
        )
        .read_only(admin.read_only)
        .with_routes(Arc::clone(&self.routes))
        .with_reload(self.reload.clone())
        .with_relays(self.relays())
        .with_readiness(self.readiness.clone())
        .with_certificates(self.certificates.clone())
    }

    fn reverse_clusters(&self) -> BTreeMap<String, ReverseCluster> {
        self.clusters
            .iter()
            .filter_map(|(name, u)| match u {
                Upstream::Reverse(slice) => Some((name.clone(), slice.cluster().clone())),
                Upstream::Static(_) => None,
            })
            .collect()
    }

    /// Every listening socket, named for the hand-over, and the acceptor's switch to mark its
    /// sockets taken.
    fn listener_fds(&mut self) -> ListenerFds {
        ListenerFds {
            sockets: std::mem::take(&mut self.sockets).export(),
            acceptor: self.acceptor.as_ref().map(Acceptor::handed_over),
        }
    }
}

/// Looks up the endpoint names of clusters with `resolve`, all at once, so that the proxy
/// serves their addresses from its first request. A name that does not resolve does not stop
/// the start: its cluster answers 503 until it does (as NGINX's `resolve` and Envoy's DNS
/// clusters do), and the log says why.
async fn resolve_names(clusters: &BTreeMap<String, Upstream>) {
    let lookups = clusters.values().filter_map(|u| match u {
        Upstream::Static(c) => Some(c.resolve_now()),
        Upstream::Reverse(_) => None,
    });
    futures_util::future::join_all(lookups).await;
}

fn build_clusters(
    config: &Config,
    (reverse, statics, retries): (&ReverseMetrics, &StaticMetrics, &RetryMetrics),
) -> Result<BTreeMap<String, Upstream>, StartError> {
    config
        .clusters
        .iter()
        .map(|(name, c)| {
            let upstream = match &c.kind {
                ClusterKind::Static(s) => {
                    let cluster =
                        StaticCluster::from_config(name, s, (statics, retries), &config.dns);
                    Upstream::from(cluster.map_err(|source| StartError::ClusterTls {
                        cluster: name.clone(),
                        source,
                    })?)
                }
                ClusterKind::Reverse(r) => {
                    let own = ReverseClusterOptions::new(name, &r.options, retries);
                    let cluster = options::reverse::cluster(name, r, reverse, own);
                    Upstream::from(cluster.slice(sluice_config::DEFAULT_SLICE))
                }
            };
            Ok((name.clone(), upstream))
        })
        .collect()
}

/// The reverse clusters among `clusters`.
fn reverse_clusters(
    clusters: &BTreeMap<String, Upstream>,
) -> impl Iterator<Item = ReverseCluster> + '_ {
    clusters.values().filter_map(|u| match u {
        Upstream::Reverse(s) => Some(s.cluster().clone()),
        Upstream::Static(_) => None,
    })
}

/// The reverse clusters that draw on a standalone acceptor, grouped by its socket, each with
/// the slices its routes use.
fn handoff_sources(
    config: &Config,
    clusters: &BTreeMap<String, Upstream>,
) -> BTreeMap<PathBuf, Vec<HandoffSource>> {
    let mut by_path: BTreeMap<PathBuf, Vec<HandoffSource>> = BTreeMap::new();
    for (name, c) in &config.clusters {
        let ClusterKind::Reverse(r) = &c.kind else {
            continue;
        };
        let (SessionSource::Handoff { path, idle }, Some(Upstream::Reverse(slice))) =
            (&r.source, clusters.get(name))
        else {
            continue;
        };
        let mut slices: Vec<String> = config
            .routes
            .iter()
            .filter(|route| matches!(&route.action, Action::Proxy { cluster } if cluster == name))
            .map(|route| route.slice.clone())
            .collect();
        slices.sort();
        slices.dedup();
        by_path
            .entry(path.clone())
            .or_default()
            .push(HandoffSource {
                cluster: slice.cluster().clone(),
                slices,
                idle: *idle,
            });
    }
    by_path
}

/// The routing service, counting into `metrics`, with `[request_id]`, `tracing` and logging
/// to `[access_log]` if set.
fn proxy_service(
    config: &Config,
    routes: &Arc<LiveRoutes>,
    metrics: &Arc<Metrics>,
    tracing: Option<Tracing>,
) -> Result<ProxyService<LiveRoutes>, StartError> {
    let mut service = ProxyService::from_arc(Arc::clone(routes)).with_metrics(Arc::clone(metrics));
    if let Some(ids) = &config.request_id {
        service = service.with_request_ids(RequestIds::new(ids.header.clone()));
    }
    if let Some(tracing) = tracing {
        service = service.with_tracing(tracing);
    }
    let Some(log) = &config.access_log else {
        return Ok(service);
    };
    let opened = AccessLog::open(&log.target, log.format.clone()).map_err(|source| {
        StartError::AccessLog {
            target: format!("{:?}", log.target),
            source,
        }
    })?;
    Ok(service.with_access_log(opened))
}

/// Binds every `[[relay]]`, or takes over the sockets a predecessor handed over.
fn bind_relays(
    config: &Config,
    sockets: &mut Sockets,
) -> Result<Vec<sluice_relay::Relay>, StartError> {
    config
        .relays
        .iter()
        .map(|r| {
            let key = sockets::relay_key(&r.name);
            let relay = options::relay::config(r);
            let listener = sockets.tcp_or(&key, r.addr, || sluice_relay::Relay::listen(&relay));
            let relay = listener.and_then(|l| sluice_relay::Relay::from_listener(&relay, l));
            relay.map_err(|source| StartError::Relay {
                relay: r.name.clone(),
                addr: r.addr,
                source,
            })
        })
        .collect()
}

/// Binds the admin API's listener (`[admin]`), or takes over the one a predecessor handed
/// over; returns it with its settings.
pub(crate) async fn bind_admin(
    config: &Config,
    sockets: &mut Sockets,
) -> Result<Option<(TcpListener, sluice_config::Admin)>, StartError> {
    let Some(admin) = &config.admin else {
        return Ok(None);
    };
    if !cfg!(feature = "admin") {
        return Err(crate::router::Unbuilt::new("[admin]", "admin").into());
    }
    let addr = admin.addr;
    let bound = sockets.tcp(sockets::ADMIN_KEY, addr).await;
    let listener = bound.map_err(|source| StartError::Bind {
        listener: "admin".to_owned(),
        addr,
        source,
    })?;
    Ok(Some((listener, admin.clone())))
}

/// Binds every listener (its TCP socket, and its QUIC endpoint when it serves HTTP/3), each
/// counting its bytes and connections.
async fn bind_listeners(
    config: &Config,
    sockets: &mut Sockets,
    metrics: &Metrics,
) -> Result<(Vec<Server>, Vec<crate::quic::Endpoint>), StartError> {
    let mut servers = Vec::with_capacity(config.listeners.len());
    let mut quic = Vec::new();
    for l in &config.listeners {
        let server = bind_server(l, sockets).await?;
        let bound = crate::quic::bind(l, server, sockets, metrics);
        let (server, endpoint) = bound.map_err(|(addr, source)| StartError::Bind {
            listener: format!("{} (HTTP/3, UDP)", l.name),
            addr,
            source,
        })?;
        quic.extend(endpoint);
        let server = server.with_byte_counters(metrics.client_bytes(&l.name));
        servers.push(server.with_connection_counters(metrics.connection_counters(&l.name)));
    }
    Ok((servers, quic))
}

/// Binds one listener, or takes over the socket a predecessor handed over for it.
async fn bind_server(
    l: &sluice_config::Listener,
    sockets: &mut Sockets,
) -> Result<Server, StartError> {
    let key = sockets::listener_key(&l.name);
    let bound = sockets.tcp(&key, l.addr).await;
    let listener = bound.map_err(|source| StartError::Bind {
        listener: l.name.clone(),
        addr: l.addr,
        source,
    })?;
    let server = Server::from_listener(&l.name, listener, l.http.clone());
    if l.tls.is_empty() {
        return Ok(server);
    }
    let tls_error = |source| StartError::Tls {
        listener: l.name.clone(),
        source,
    };
    let certs = tls::Certificates::load(&l.tls).map_err(tls_error)?;
    server.with_certificates(Arc::new(certs)).map_err(tls_error)
}

/// Binds the acceptor for the reverse clusters, if `[acceptor]` is configured.
async fn bind_acceptor(
    config: &Config,
    clusters: &BTreeMap<String, Upstream>,
    sockets: &mut Sockets,
) -> Result<Option<Acceptor>, StartError> {
    let Some(opts) = &config.acceptor else {
        return Ok(None);
    };
    let opts =
        options::reverse::acceptor(opts).map_err(|source| StartError::AcceptorTls { source })?;
    let bind_error = |source| StartError::Acceptor {
        addr: opts.addr,
        source,
    };
    let tcp = sockets.tcp(sockets::ACCEPTOR_KEY, opts.addr).await;
    let tcp = tcp.map_err(bind_error)?;
    let unix = opts
        .unix
        .as_deref()
        .map(|path| sockets.unix(sockets::ACCEPTOR_UNIX_KEY, path));
    let unix = unix.transpose().map_err(bind_error)?;
    // Clusters fed over a handoff socket take no registrations here.
    let reverse = options::reverse::registering_here(config)
        .filter_map(|(name, _)| clusters.get(name))
        .filter_map(|u| match u {
            Upstream::Reverse(s) => Some(s.cluster().clone()),
            Upstream::Static(_) => None,
        });
    Ok(Some(Acceptor::from_listeners(&opts, reverse, tcp, unix)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 49: `[admin]` in a build without the admin API (the `admin` feature off) is
    /// refused by name, never silently left unserved; with it, its listener is bound.
    #[tokio::test]
    async fn the_admin_api_is_bound_only_where_it_is_built() {
        let text = r#"
[[listener]]
name = "public"
listen = "127.0.0.1:0"
[cluster.a]
kind = "static"
endpoints = ["127.0.0.1:9001"]
[[route]]
cluster = "a"
[admin]
listen = "127.0.0.1:0"
"#;
        let dir = std::path::Path::new(".");
        let config = sluice_config::parse_str(text, "t.toml", dir).expect("parses");
        let bound = bind_admin(&config, &mut Sockets::default()).await;
        if cfg!(feature = "admin") {
            assert!(matches!(bound, Ok(Some(_))), "{bound:?}");
        } else {
            let said = bound.expect_err("refused").to_string();
            assert!(
                said.starts_with("[admin] needs the `admin` feature"),
                "{said}"
            );
        }
    }
}
