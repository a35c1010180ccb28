//! [`Proxy`]: a whole Sluice built from a validated configuration.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_config::{Action, ClusterKind, Config, SessionSource, Token};
use sluice_handoff::{Handoff, ListenAddr};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::acceptor::{Acceptor, BindError};
use crate::access_log::AccessLog;
use crate::admin::{self, AdminState, ReloadHook};
use crate::handoff;
use crate::metrics::Metrics;
use crate::proxy::ProxyService;
use crate::reload::InPlace;
use crate::restart::{self, Inherited, RestartError, UpgradeSocket};
use crate::router::{Direct, LiveRoutes, Matcher, Route, RouteTable, Target};
use crate::server::{tls, Group, Server};
use crate::upstream::{ReverseCluster, StaticCluster, Upstream};

/// Why a configuration could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
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

/// A proxy with its listeners bound, ready to run.
#[derive(Debug)]
pub struct Proxy {
    servers: Vec<Server>,
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
    /// The predecessor's connection, on which its idle sessions arrive (hot restart).
    predecessor: Option<(Handoff, PathBuf)>,
    /// Reverse clusters fed by a standalone acceptor, by its handoff socket.
    consumers: BTreeMap<PathBuf, Vec<handoff::Source>>,
    /// Requests, handshakes, sessions and queues, for `/metrics`.
    metrics: Arc<Metrics>,
    /// The admin API's listener and token (`[admin]`).
    admin: Option<(TcpListener, Option<Token>)>,
    /// What `POST /reload` runs (set by the binary).
    reload: Option<ReloadHook>,
    /// Becomes `true` once a successor has the listening sockets (hot restart).
    upgraded: watch::Sender<bool>,
    /// Split-TCP relays (`[[relay]]`), bound.
    relays: Vec<sluice_relay::Relay>,
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
        mut inherited: Option<Inherited>,
    ) -> Result<Self, StartError> {
        let clusters = build_clusters(config)?;
        let routes = Arc::new(LiveRoutes::from_config(config, &clusters));
        let metrics = Arc::new(Metrics::new());
        let mut servers = Vec::with_capacity(config.listeners.len());
        for l in &config.listeners {
            let handed = inherited
                .as_mut()
                .and_then(|i| i.tcp(&restart::listener_key(&l.name), l.addr));
            let server = bind_server(l, handed).await?;
            servers.push(server.with_byte_counters(metrics.client_bytes(&l.name)));
        }
        let relays = bind_relays(config, inherited.as_mut())?;
        let service = proxy_service(config, &routes, &metrics)?;
        let acceptor = bind_acceptor(config, &clusters, inherited.as_mut()).await?;
        let acceptor = acceptor.map(|a| a.with_metrics(Arc::clone(&metrics)));
        for upstream in clusters.values() {
            match upstream {
                Upstream::Reverse(s) => s.cluster().set_metrics(Arc::clone(&metrics)),
                Upstream::Static(c) => c.set_metrics(Arc::clone(&metrics)),
            }
        }
        let admin = bind_admin(config, inherited.as_mut()).await?;
        // After the listeners: a predecessor still holds the path until it has handed them.
        let upgrade = config.runtime.upgrade_socket.as_deref();
        let upgrade = upgrade.map(UpgradeSocket::bind).transpose()?;
        let consumers = handoff_sources(config, &clusters);
        let certificates = servers
            .iter()
            .filter_map(|s| Some((s.name().to_owned(), Arc::clone(s.certificates()?))))
            .collect();
        let in_place = InPlace::new(config, Arc::clone(&routes), clusters.clone())
            .with_certificates(certificates);
        Ok(Self {
            servers,
            service,
            routes,
            in_place,
            clusters,
            acceptor,
            grace: config.runtime.shutdown_grace,
            upgrade,
            predecessor: inherited.as_mut().and_then(Inherited::session_feed),
            consumers,
            metrics,
            admin,
            reload: None,
            upgraded: watch::channel(false).0,
            relays,
        })
    }

    /// Each listener's name and bound address.
    pub fn local_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.servers
            .iter()
            .filter_map(|s| Some((s.name().to_owned(), s.local_addr().ok()?)))
            .collect()
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
        for (path, sources) in std::mem::take(&mut self.consumers) {
            tokio::spawn(handoff::consume(path, sources));
        }
        if let Some((conn, path)) = self.predecessor.take() {
            let total = self
                .acceptor
                .as_ref()
                .map_or_else(Arc::default, Acceptor::total);
            tokio::spawn(restart::adopt_sessions(conn, path, reverse.clone(), total));
        }
        let fds = match self.upgrade.is_some() {
            true => self.listener_fds(),
            false => (Vec::new(), None),
        };
        let admin = self
            .admin
            .take()
            .map(|(l, token)| (l, self.admin_state(token)));
        let mut group = Group::new();
        if let Some((listener, state)) = admin {
            tokio::spawn(admin::serve(listener, Arc::new(state), group.signal()));
        }
        for server in self.servers {
            group.add(server, self.service.clone(), self.grace);
        }
        let acceptor = self.acceptor.map(|a| tokio::spawn(a.run(group.signal())));
        for relay in std::mem::take(&mut self.relays) {
            tokio::spawn(relay.run(group.signal().wait()));
        }
        let mut handover = None;
        group
            .run_until(restart::stop_or_upgrade(
                trigger,
                self.upgrade,
                fds,
                &reverse,
                self.grace,
                (&mut handover, &self.upgraded),
            ))
            .await;
        if let Some(task) = acceptor {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "the acceptor task failed");
            }
        }
        if let Some(forwarder) = handover {
            restart::finish_handover(&reverse, forwarder).await;
        }
        // Sessions would otherwise outlive the proxy in a process that goes on (an embedding
        // program, `sluice demo`): their connection tasks keep the cluster alive. Closing them
        // tells the services, which re-dial wherever Sluice runs next.
        for cluster in reverse.values() {
            cluster.close();
        }
    }

    fn admin_state(&self, token: Option<Token>) -> AdminState {
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
            token,
        )
        .with_routes(Arc::clone(&self.routes))
        .with_reload(self.reload.clone())
        .with_relays(self.relays())
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

    /// Duplicates of every listening socket, named for the hand-over; one that cannot be
    /// duplicated is left out (the successor binds it afresh) with a warning.
    fn listener_fds(&self) -> restart::ListenerFds {
        let mut fds = Vec::new();
        for server in &self.servers {
            let fd = server
                .local_addr()
                .and_then(|addr| Ok((addr, server.listener_fd()?)));
            match fd {
                Ok((addr, fd)) => fds.push((
                    restart::listener_key(server.name()),
                    ListenAddr::Inet(addr),
                    fd,
                )),
                Err(error) => {
                    tracing::warn!(listener = %server.name(), %error, "cannot duplicate the listening socket")
                }
            }
        }
        for relay in &self.relays {
            let fd = socket2::SockRef::from(relay.listener()).try_clone();
            match (relay.local_addr(), fd) {
                (Ok(addr), Ok(fd)) => {
                    let key = restart::relay_key(&relay.handle().name);
                    fds.push((key, ListenAddr::Inet(addr), fd.into()));
                }
                (Err(error), _) | (_, Err(error)) => {
                    tracing::warn!(%error, "cannot duplicate a relay's socket")
                }
            }
        }
        if let Some((listener, _)) = &self.admin {
            let fd = socket2::SockRef::from(listener).try_clone();
            match (listener.local_addr(), fd) {
                (Ok(addr), Ok(fd)) => fds.push((
                    restart::ADMIN_KEY.to_owned(),
                    ListenAddr::Inet(addr),
                    fd.into(),
                )),
                (Err(error), _) | (_, Err(error)) => {
                    tracing::warn!(%error, "cannot duplicate the admin socket")
                }
            }
        }
        let mut handed = None;
        match self.acceptor.as_ref().map(Acceptor::listener_fds) {
            Some(Ok((acceptor, flag))) => {
                fds.extend(acceptor);
                handed = Some(flag);
            }
            Some(Err(error)) => tracing::warn!(%error, "cannot duplicate the acceptor's sockets"),
            None => {}
        }
        (fds, handed)
    }
}

fn build_clusters(config: &Config) -> Result<BTreeMap<String, Upstream>, StartError> {
    config
        .clusters
        .iter()
        .map(|(name, c)| {
            let upstream = match &c.kind {
                ClusterKind::Static(s) => {
                    Upstream::from(StaticCluster::from_config(name, s).map_err(|source| {
                        StartError::ClusterTls {
                            cluster: name.clone(),
                            source,
                        }
                    })?)
                }
                ClusterKind::Reverse(r) => Upstream::from(
                    ReverseCluster::from_config(name, r).slice(sluice_config::DEFAULT_SLICE),
                ),
            };
            Ok((name.clone(), upstream))
        })
        .collect()
}

/// Compiles the configured routes, in file order, against the built clusters.
pub fn build_routes(config: &Config, clusters: &BTreeMap<String, Upstream>) -> RouteTable {
    let mut table = RouteTable::new();
    for r in &config.routes {
        let target = match &r.action {
            // Validation guarantees the cluster exists; a missing one would be a bug upstream
            // of here, and answering 404 for that route is the least surprising outcome.
            Action::Proxy { cluster } => match clusters.get(cluster) {
                // A reverse route is bound to its slice here, so requests need no lookup.
                Some(Upstream::Reverse(s)) => {
                    Target::Upstream(Upstream::Reverse(s.cluster().slice(&r.slice)))
                }
                Some(u) => Target::Upstream(u.clone()),
                None => continue,
            },
            Action::Direct(d) => Target::Direct(Direct {
                status: d.status,
                headers: d.headers.clone(),
                body: d.body.clone().into(),
            }),
        };
        let route = Route {
            name: r.name.clone(),
            target,
            request_headers: r.request_headers.clone(),
            response_headers: r.response_headers.clone(),
        };
        table.push(Matcher::from(&r.matcher), Arc::new(route));
    }
    table
}

/// The reverse clusters that draw on a standalone acceptor, grouped by its socket, each with
/// the slices its routes use.
fn handoff_sources(
    config: &Config,
    clusters: &BTreeMap<String, Upstream>,
) -> BTreeMap<PathBuf, Vec<handoff::Source>> {
    let mut by_path: BTreeMap<PathBuf, Vec<handoff::Source>> = BTreeMap::new();
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
            .push(handoff::Source {
                cluster: slice.cluster().clone(),
                slices,
                idle: *idle,
            });
    }
    by_path
}

/// The routing service, counting into `metrics` and logging to `[access_log]` if set.
fn proxy_service(
    config: &Config,
    routes: &Arc<LiveRoutes>,
    metrics: &Arc<Metrics>,
) -> Result<ProxyService<LiveRoutes>, StartError> {
    let service = ProxyService::from_arc(Arc::clone(routes)).with_metrics(Arc::clone(metrics));
    let Some(log) = &config.access_log else {
        return Ok(service);
    };
    let opened =
        AccessLog::open(&log.target, log.format).map_err(|source| StartError::AccessLog {
            target: format!("{:?}", log.target),
            source,
        })?;
    Ok(service.with_access_log(opened))
}

/// Binds every `[[relay]]`, or takes over the sockets a predecessor handed over.
fn bind_relays(
    config: &Config,
    mut inherited: Option<&mut Inherited>,
) -> Result<Vec<sluice_relay::Relay>, StartError> {
    config
        .relays
        .iter()
        .map(|r| {
            let handed = inherited
                .as_mut()
                .and_then(|i| i.tcp(&restart::relay_key(&r.name), r.addr));
            let relay = match handed.map(TcpListener::from_std) {
                Some(listener) => listener.and_then(|l| sluice_relay::Relay::from_listener(r, l)),
                None => sluice_relay::Relay::bind(r),
            };
            relay.map_err(|source| StartError::Relay {
                relay: r.name.clone(),
                addr: r.addr,
                source,
            })
        })
        .collect()
}

/// Binds the admin API's listener (`[admin]`), or takes over the one a predecessor handed
/// over; returns it with the token.
async fn bind_admin(
    config: &Config,
    inherited: Option<&mut Inherited>,
) -> Result<Option<(TcpListener, Option<Token>)>, StartError> {
    let Some(admin) = &config.admin else {
        return Ok(None);
    };
    let addr = admin.addr;
    let bound = match inherited.and_then(|i| i.tcp(restart::ADMIN_KEY, addr)) {
        Some(std) => TcpListener::from_std(std),
        None => TcpListener::bind(addr).await,
    };
    let listener = bound.map_err(|source| StartError::Bind {
        listener: "admin".to_owned(),
        addr,
        source,
    })?;
    Ok(Some((listener, admin.token.clone())))
}

/// Binds one listener, or takes over the socket a predecessor handed over for it.
async fn bind_server(
    l: &sluice_config::Listener,
    handed: Option<std::net::TcpListener>,
) -> Result<Server, StartError> {
    let bind_error = |source| StartError::Bind {
        listener: l.name.clone(),
        addr: l.addr,
        source,
    };
    let listener = match handed {
        Some(std) => TcpListener::from_std(std).map_err(bind_error)?,
        None => TcpListener::bind(l.addr).await.map_err(bind_error)?,
    };
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
    inherited: Option<&mut Inherited>,
) -> Result<Option<Acceptor>, StartError> {
    let Some(opts) = &config.acceptor else {
        return Ok(None);
    };
    let (tcp, unix) = match inherited {
        Some(i) => (
            i.tcp(restart::ACCEPTOR_KEY, opts.addr),
            opts.unix
                .as_deref()
                .and_then(|p| i.unix(restart::ACCEPTOR_UNIX_KEY, p)),
        ),
        None => (None, None),
    };
    // Clusters fed over a handoff socket take no registrations here.
    let local = |name: &String| {
        config.clusters.get(name).is_some_and(
            |c| matches!(&c.kind, ClusterKind::Reverse(r) if r.source == SessionSource::Acceptor),
        )
    };
    let reverse = clusters.iter().filter_map(|(name, u)| match u {
        Upstream::Reverse(s) if local(name) => Some(s.cluster().clone()),
        _ => None,
    });
    Acceptor::bind_inheriting(opts, reverse, tcp, unix)
        .await
        .map(Some)
        .map_err(|e| match e {
            BindError::Bind(source) => StartError::Acceptor {
                addr: opts.addr,
                source,
            },
            BindError::Tls(source) => StartError::AcceptorTls { source },
        })
}
