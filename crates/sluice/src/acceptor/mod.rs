//! The acceptor: the service-facing listener where instances dial in and register sessions
//! (DESIGN.md §3).
//!
//! Each connection sends one hello within `handshake_timeout` and `max_handshake_size`: a
//! registration, answered `101` and handed to its cluster's slice as an idle session, or a
//! drain request, answered `200`. Refusals carry the protocol's statuses: 400 malformed, 401
//! bad token, 404 unknown service, 429 a limit, 503 draining or shutting down.

mod handshake;
mod rate;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use sluice_session::Rejection;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tracing::{debug, info, warn};

use self::rate::RateLimiter;
use crate::server::ShutdownSignal;
use crate::upstream::reverse::Limit;
use crate::upstream::ReverseCluster;

pub use sluice_config::Acceptor as AcceptorOptions;

/// Idle time before the first keepalive probe on a session.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// A bound acceptor, ready to run.
#[derive(Debug)]
pub struct Acceptor {
    tcp: TcpListener,
    unix: Option<UnixListener>,
    shared: Shared,
}

/// What every handshake consults.
#[derive(Debug)]
struct Shared {
    opts: AcceptorOptions,
    clusters: HashMap<String, ReverseCluster>,
    /// Sessions across every cluster.
    total: Arc<Limit>,
    rate: RateLimiter,
    shutdown: Option<ShutdownSignal>,
}

impl Acceptor {
    /// Binds the TCP address (and the UNIX socket, if configured) for these clusters.
    pub async fn bind(
        opts: &AcceptorOptions,
        clusters: impl IntoIterator<Item = ReverseCluster>,
    ) -> std::io::Result<Self> {
        let tcp = TcpListener::bind(opts.addr).await?;
        let unix = opts.unix.as_ref().map(UnixListener::bind).transpose()?;
        let clusters: HashMap<_, _> = clusters
            .into_iter()
            .map(|c| (c.name().to_owned(), c))
            .collect();
        warn_plaintext_tokens(opts.addr, &clusters);
        let shared = Shared {
            total: Arc::new(Limit::new(opts.max_sessions)),
            rate: RateLimiter::new(opts.handshakes_per_second),
            opts: opts.clone(),
            clusters,
            shutdown: None,
        };
        Ok(Self { tcp, unix, shared })
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
    /// answer 503; sessions already registered live on until the proxy drops their clusters.
    pub async fn run(self, signal: ShutdownSignal) {
        let mut shared = self.shared;
        shared.shutdown = Some(signal.clone());
        let shared = Arc::new(shared);
        info!(acceptor.addr = ?self.tcp.local_addr().ok(), "acceptor running");
        let stop = signal.wait();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, peer)) => spawn_tcp(stream, peer, &shared),
                    Err(error) => debug!(%error, "acceptor accept failed"),
                },
                accepted = accept_unix(self.unix.as_ref()) => match accepted {
                    Ok(stream) => {
                        tokio::spawn(handshake::handle(stream, None, Arc::clone(&shared)));
                    }
                    Err(error) => debug!(%error, "acceptor accept failed (unix)"),
                },
            }
        }
        if let Some(path) = &shared.opts.unix {
            let _ = std::fs::remove_file(path);
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
fn spawn_tcp(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    let sock = SockRef::from(&stream);
    let keepalive = TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    if let Err(error) = sock.set_tcp_keepalive(&keepalive) {
        debug!(service.addr = %peer, %error, "cannot enable TCP keepalive");
    }
    let _ = stream.set_nodelay(true);
    let span = tracing::debug_span!("service", service.addr = %peer);
    let fut = handshake::handle(stream, Some(peer.ip()), Arc::clone(shared));
    tokio::spawn(tracing::Instrument::instrument(fut, span));
}

fn warn_plaintext_tokens(addr: SocketAddr, clusters: &HashMap<String, ReverseCluster>) {
    if addr.ip().is_loopback() {
        return;
    }
    for c in clusters.values().filter(|c| c.has_tokens()) {
        warn!(acceptor.addr = %addr, cluster = %c.name(), "bearer tokens will cross a non-loopback acceptor without TLS");
    }
}

impl Shared {
    /// The checks common to registering and draining: shutdown (503), handshake rate (429),
    /// service (404), token (401).
    fn admit(
        &self,
        service: &str,
        token: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<ReverseCluster, Rejection> {
        if self.shutdown.as_ref().is_some_and(|s| s.is_triggered()) {
            return Err(Rejection::unavailable("shutting down"));
        }
        if peer.is_some_and(|ip| !self.rate.allow(ip)) {
            return Err(Rejection::limited(
                "handshakes per second from this address",
            ));
        }
        let cluster = self
            .clusters
            .get(service)
            .ok_or_else(|| Rejection::unknown_service(service))?;
        if !cluster.authorize(token) {
            return Err(Rejection::unauthorized());
        }
        Ok(cluster.clone())
    }
}
