//! The acceptor: the service-facing listener where instances dial in and register sessions
//! (docs/design.md §3).
//!
//! Each connection sends one hello within `handshake_timeout` and `max_handshake_size`: a
//! registration, answered `101` and handed to its cluster's slice as an idle session; a
//! drain request, answered `200`; or a control link (many nodes), answered `101` and served
//! by `control`: demand reports out, retirements in. Refusals carry the protocol's statuses: 400 malformed, 401
//! bad token, 404 unknown service, 410 an instance an operator drained (until resumed), 429 a
//! limit, 503 draining or shutting down.
//!
//! With `tls`, every acceptor socket (TCP and UNIX) speaks TLS first, within the same
//! `handshake_timeout`. With `client_ca`, services must present a certificate the CA signed,
//! and `[acceptor.clients]` decides which services each certificate name may register for
//! (401 otherwise); bearer tokens, when configured, are checked on top.

mod control;
mod handshake;
mod link_limit;
mod rate;
mod shared;
mod tls;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Instant;
use tracing::{debug, info, warn, Instrument};

use self::rate::RateLimiter;
use self::shared::{Peer, Shared};
use crate::cluster::ReverseCluster;
use crate::instance::Limit;
use crate::metrics::ReverseMetrics;
use crate::options::AcceptorOptions;
use crate::protocol::Protocol;
use crate::stream::SessionStream;
use sluice_net::accept::accept_error;
use sluice_net::log_limit::TallyByKind;
use sluice_net::sockets::{self, Sockets};
use sluice_net::ShutdownSignal;

/// Idle time before the first keepalive probe on a session.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Why an acceptor could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The TCP address or the UNIX socket could not be bound.
    #[error("cannot bind: {0}")]
    Bind(#[source] std::io::Error),
}

/// Marks an acceptor's listening sockets as taken by a successor process (hot restart).
#[derive(Debug, Clone)]
pub struct HandedOver(Arc<AtomicBool>);

impl HandedOver {
    /// The successor has the sockets: the acceptor leaves the UNIX socket file alone.
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A bound acceptor, ready to run.
#[derive(Debug)]
pub struct Acceptor<P: Protocol> {
    tcp: TcpListener,
    unix: Option<UnixListener>,
    shared: Shared<P>,
    /// The listening sockets went to a successor: leave the UNIX socket file alone.
    handed_over: Arc<AtomicBool>,
}

impl<P: Protocol> Acceptor<P> {
    /// Binds the TCP address (and the UNIX socket, if configured) for these clusters.
    pub async fn bind(
        opts: &AcceptorOptions,
        clusters: impl IntoIterator<Item = ReverseCluster<P>>,
    ) -> Result<Self, BindError> {
        let mut sockets = Sockets::default();
        let tcp = sockets.tcp(sockets::ACCEPTOR_KEY, opts.addr).await;
        let tcp = tcp.map_err(BindError::Bind)?;
        let unix = opts
            .unix
            .as_deref()
            .map(|path| sockets.unix(sockets::ACCEPTOR_UNIX_KEY, path));
        let unix = unix.transpose().map_err(BindError::Bind)?;
        Ok(Self::from_listeners(opts, clusters, tcp, unix))
    }

    /// The same as [`bind`](Self::bind), on sockets already bound (or handed over by a
    /// predecessor in a hot restart): `unix` listens at `opts.unix`.
    pub fn from_listeners(
        opts: &AcceptorOptions,
        clusters: impl IntoIterator<Item = ReverseCluster<P>>,
        tcp: TcpListener,
        unix: Option<UnixListener>,
    ) -> Self {
        let clusters: HashMap<_, _> = clusters
            .into_iter()
            .map(|c| (c.name().to_owned(), c))
            .collect();
        if opts.tls.is_none() {
            warn_plaintext_tokens(opts.addr, &clusters);
        }
        let shared = Shared {
            total: Arc::new(Limit::new(opts.max_sessions)),
            rate: RateLimiter::new(opts.handshakes_per_second),
            links: link_limit::LinkLimits::new(
                opts.max_control_links,
                opts.max_control_links_per_address,
            ),
            opts: opts.clone(),
            clusters,
            shutdown: None,
            metrics: ReverseMetrics::default(),
            refusals: TallyByKind::new(),
            node: None,
            lends: false,
        };
        Self {
            tcp,
            unix,
            shared,
            handed_over: Arc::default(),
        }
    }

    /// Counts every handshake's outcome in `metrics`; by default nothing is counted.
    pub fn with_metrics(mut self, metrics: ReverseMetrics) -> Self {
        self.shared.metrics = metrics;
        self
    }

    /// Tells the services' control links when this node stops (`DRAINING`), so they move
    /// their sessions elsewhere; by default a node never says so.
    pub fn with_readiness(mut self, readiness: &sluice_net::Readiness) -> Self {
        self.shared.node = Some(readiness.subscribe());
        self
    }

    /// Lends every session to other processes (a standalone acceptor): HTTP/2 registrations
    /// are refused, as their connections' state cannot move with their sockets.
    pub fn lending(mut self) -> Self {
        self.shared.lends = true;
        self
    }

    /// Sessions across every cluster, against `max_sessions`; shared with the sessions a
    /// predecessor hands over.
    pub fn total(&self) -> Arc<Limit> {
        Arc::clone(&self.shared.total)
    }

    /// The switch that, once a successor has the listening sockets (hot restart), leaves the
    /// UNIX socket's file in place when this acceptor stops (it belongs to the successor).
    pub fn handed_over(&self) -> HandedOver {
        HandedOver(Arc::clone(&self.handed_over))
    }

    /// The bound TCP address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The UNIX socket path, if one is configured.
    pub fn unix_path(&self) -> Option<&PathBuf> {
        self.shared.opts.unix.as_ref()
    }

    /// Accepts service connections until `signal` fires. Handshakes still in progress then
    /// answer 503; registered sessions are closed by whoever owns their clusters ([`ReverseCluster::close`](crate::cluster::ReverseCluster::close)), as `sluice::Proxy::run_until` does when it ends.
    pub async fn run(self, signal: ShutdownSignal) {
        let mut shared = self.shared;
        shared.shutdown = Some(signal.clone());
        let shared = Arc::new(shared);
        let tls = shared.opts.tls.is_some();
        info!(acceptor.addr = ?self.tcp.local_addr().ok(), acceptor.tls = tls, "acceptor running");
        sluice_net::accept::keep_reserve();
        let stop = signal.wait();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, peer)) => spawn_tcp(stream, peer, &shared),
                    Err(error) => accept_error("acceptor", SockRef::from(&self.tcp), error).await,
                },
                accepted = accept_unix(self.unix.as_ref()) => match accepted {
                    Ok(stream) => {
                        tokio::spawn(serve(stream, None, Arc::clone(&shared)));
                    }
                    Err(error) => {
                        if let Some(l) = &self.unix {
                            accept_error("acceptor (unix)", SockRef::from(l), error).await;
                        }
                    }
                },
            }
        }
        if let Some(path) = &shared.opts.unix {
            if !self.handed_over.load(Ordering::Acquire) {
                let _ = std::fs::remove_file(path);
            }
        }
        info!("acceptor stopped");
    }
}

async fn accept_unix(l: Option<&UnixListener>) -> std::io::Result<UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Sessions idle for long stretches; keepalive finds a peer that vanished without a FIN.
fn spawn_tcp<P: Protocol>(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared<P>>) {
    let sock = SockRef::from(&stream);
    let keepalive = TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    if let Err(error) = sock.set_tcp_keepalive(&keepalive) {
        debug!(service.addr = %peer, %error, "cannot enable TCP keepalive");
    }
    let _ = stream.set_nodelay(true);
    let span = tracing::debug_span!("service", service.addr = %peer);
    tokio::spawn(serve(stream, Some(peer.ip()), Arc::clone(shared)).instrument(span));
}

/// Runs TLS first when configured, then the registration handshake; one deadline covers both.
async fn serve<P: Protocol, S>(io: S, ip: Option<IpAddr>, shared: Arc<Shared<P>>)
where
    S: SessionStream,
{
    let deadline = Instant::now() + shared.opts.handshake_timeout;
    // Counted per connection and before TLS, so a flood of TLS handshakes from one address
    // costs the acceptor no more than the limit allows.
    let rate_limited = ip.is_some_and(|ip| !shared.rate.allow(ip));
    let mut peer = Peer {
        ip,
        cert_names: None,
        rate_limited,
    };
    let Some(config) = &shared.opts.tls else {
        return handshake::handle(io, peer, shared, deadline).await;
    };
    if rate_limited {
        // No HTTP answer is possible before TLS: the connection closes, and the service's
        // SDK re-dials with backoff as after any failed dial.
        shared.count("429");
        return debug!("handshake rate exceeded; closed before TLS");
    }
    let Some(io) = tls::accept(config, io, deadline).await else {
        return;
    };
    peer.cert_names = tls::client_names(io.get_ref().1);
    handshake::handle(io, peer, shared, deadline).await;
}

fn warn_plaintext_tokens<P: Protocol>(
    addr: SocketAddr,
    clusters: &HashMap<String, ReverseCluster<P>>,
) {
    if addr.ip().is_loopback() {
        return;
    }
    for c in clusters.values().filter(|c| c.has_tokens()) {
        warn!(acceptor.addr = %addr, cluster = %c.name(), "bearer tokens will cross a non-loopback acceptor without TLS");
    }
}
