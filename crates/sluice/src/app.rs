//! [`Proxy`]: a whole Sluice built from a validated configuration.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice_config::{Action, ClusterKind, Config};
use tokio::net::TcpListener;

use crate::acceptor::{Acceptor, BindError};
use crate::proxy::ProxyService;
use crate::router::{Direct, Matcher, Route, RouteTable, Target};
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
    service: ProxyService<RouteTable>,
    clusters: BTreeMap<String, Upstream>,
    acceptor: Option<Acceptor>,
    grace: Duration,
}

impl Proxy {
    /// Builds clusters and routes from `config` and binds every listener.
    pub async fn bind(config: &Config) -> Result<Self, StartError> {
        let clusters = build_clusters(config);
        let routes = build_routes(config, &clusters);
        let mut servers = Vec::with_capacity(config.listeners.len());
        for l in &config.listeners {
            let listener = TcpListener::bind(l.addr)
                .await
                .map_err(|source| StartError::Bind {
                    listener: l.name.clone(),
                    addr: l.addr,
                    source,
                })?;
            let mut server = Server::from_listener(&l.name, listener, l.http.clone());
            if let Some(t) = &l.tls {
                let cfg =
                    tls::server_config(t, l.http.http2).map_err(|source| StartError::Tls {
                        listener: l.name.clone(),
                        source,
                    })?;
                server = server.with_tls(cfg);
            }
            servers.push(server);
        }
        let service = ProxyService::new(routes);
        let acceptor = bind_acceptor(config, &clusters).await?;
        Ok(Self {
            servers,
            service,
            clusters,
            acceptor,
            grace: config.runtime.shutdown_grace,
        })
    }

    /// Each listener's name and bound address.
    pub fn local_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.servers
            .iter()
            .filter_map(|s| Some((s.name().to_owned(), s.local_addr().ok()?)))
            .collect()
    }

    /// The cluster with this name, for runtime changes (adding or removing endpoints).
    pub fn cluster(&self, name: &str) -> Option<&Upstream> {
        self.clusters.get(name)
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
    pub async fn run_until(self, trigger: impl Future<Output = ()>) {
        for upstream in self.clusters.values() {
            upstream.start();
        }
        let mut group = Group::new();
        for server in self.servers {
            group.add(server, self.service.clone(), self.grace);
        }
        let acceptor = self.acceptor.map(|a| tokio::spawn(a.run(group.signal())));
        group.run_until(trigger).await;
        if let Some(task) = acceptor {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "the acceptor task failed");
            }
        }
        // Sessions would otherwise outlive the proxy in a process that goes on (an embedding
        // program, `sluice demo`): their connection tasks keep the cluster alive. Closing them
        // tells the services, which re-dial wherever Sluice runs next.
        for upstream in self.clusters.values() {
            if let Upstream::Reverse(slice) = upstream {
                slice.cluster().close();
            }
        }
    }
}

fn build_clusters(config: &Config) -> BTreeMap<String, Upstream> {
    config
        .clusters
        .iter()
        .map(|(name, c)| {
            let upstream = match &c.kind {
                ClusterKind::Static(s) => Upstream::from(StaticCluster::from_config(name, s)),
                ClusterKind::Reverse(r) => Upstream::from(
                    ReverseCluster::from_config(name, r).slice(sluice_config::DEFAULT_SLICE),
                ),
            };
            (name.clone(), upstream)
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

/// Binds the acceptor for the reverse clusters, if `[acceptor]` is configured.
async fn bind_acceptor(
    config: &Config,
    clusters: &BTreeMap<String, Upstream>,
) -> Result<Option<Acceptor>, StartError> {
    let Some(opts) = &config.acceptor else {
        return Ok(None);
    };
    let reverse = clusters.values().filter_map(|u| match u {
        Upstream::Reverse(s) => Some(s.cluster().clone()),
        Upstream::Static(_) => None,
    });
    Acceptor::bind(opts, reverse)
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
