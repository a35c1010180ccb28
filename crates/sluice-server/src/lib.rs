//! Sluice's client-facing transport: listeners, TLS (rustls), HTTP/1.1 and HTTP/2 connections
//! (hyper), the connection loop an HTTP/1 fast path plugs into, idle timeouts, the HTTP/1
//! request-smuggling guard, per-client connection limits and graceful drain. It knows nothing
//! of routes or upstreams: it serves any [`HttpService`] (and a [`fast::FastHttp1`]).
//!
//! A [`Server`] owns one listening socket and serves any tower `Service` on it. A [`Group`]
//! runs several servers under one shutdown: stop accepting, let in-flight requests finish
//! within the grace period, then close what is left.
//!
//! # Layout
//!
//! - `counters`: the connection and byte counters a server keeps.
//! - `io`: `IdleTimeout` and reading a connection's first bytes with a deadline.
//! - `tls`: [`tls::Certificates`], certificates by SNI (swapped by a reload), their expiry.
//! - `http3` (feature `http3`): [`http3::H3Server`], a TLS listener's HTTP/3 over QUIC
//!   (quinn and h3), handing the same service the requests.
//! - `fast`: [`fast::FastHttp1`], the trait a fast path implements to take HTTP/1.1
//!   connections until it hands them to hyper.
//! - `h2own`: the own HTTP/2 transport (`own_http2`): frames and HPACK (`sluice-h2`) over the
//!   connection's bytes, no task per stream, each request handed to a [`h2own::Pipeline`].
//! - `conn`, `framing`, `prefixed`, `active`, `carrier`, `per_client`, `service`: one
//!   connection served by hyper (the h2 preface sniffed, the framing guard, a connection's
//!   requests, upgrades, limits per client, the service trait).

mod active;
mod carrier;
mod conn;
pub mod counters;
pub mod fast;
#[macro_use]
mod forward;
mod framing;
pub mod h2own;
#[cfg(feature = "http3")]
pub mod http3;
pub mod io;
mod per_client;
mod prefixed;
mod service;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use sluice_net::http::HttpOptions;
use sluice_net::log_limit::{Tally, REPORT_INTERVAL};
use socket2::SockRef;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use per_client::PerClient;

pub use self::carrier::UpgradeCarrier;
#[cfg(feature = "http3")]
pub use self::service::H3Service;
pub use self::service::HttpService;
pub use sluice_core::ClientInfo;
use sluice_net::accept::{accept_error, keep_reserve as keep_accept_reserve};
pub use sluice_net::shutdown::{os_signal, Shutdown, ShutdownSignal};

/// Default HTTP settings, the same as the config file's defaults ([`HttpOptions::default`]).
pub fn default_http_options() -> HttpOptions {
    HttpOptions::default()
}

/// One listening socket and how to speak HTTP on it.
pub struct Server {
    name: String,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    certificates: Option<Arc<tls::Certificates>>,
    http: HttpOptions,
    bytes: Option<crate::counters::ByteCounters>,
    connections: crate::counters::ConnectionCounters,
    fast: Option<Arc<dyn fast::FastHttp1>>,
    /// The own HTTP/2 transport's pipeline (`own_http2`).
    own_h2: Option<Arc<dyn h2own::Pipeline>>,
    /// The `Alt-Svc` field its answers carry (HTTP/3 offered on a UDP port).
    alt_svc: Option<http::HeaderValue>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("addr", &self.listener.local_addr().ok())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Binds `addr` for plaintext HTTP/1.1 and h2c with default settings.
    pub async fn bind(name: impl Into<String>, addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Ok(Self::from_listener(name, listener, default_http_options()))
    }

    /// Serves on an already bound listener.
    pub fn from_listener(
        name: impl Into<String>,
        listener: TcpListener,
        http: HttpOptions,
    ) -> Self {
        Self {
            name: name.into(),
            listener,
            tls: None,
            certificates: None,
            http,
            bytes: None,
            connections: Default::default(),
            fast: None,
            own_h2: None,
            alt_svc: None,
        }
    }

    /// Serves HTTP/1.1 requests, plain or over TLS, with `fast` (a proxy's fast path,
    /// [`ProxyService::fast_path`](crate::ProxyService::fast_path)) and hands hyper only what it
    /// leaves, when the listener's `fast_path` is on. It is used only when the service given to
    /// [`serve`](Self::serve) is the one it belongs to: a service wrapped in tower layers is
    /// served by hyper alone (said once at warn), so the layers are never bypassed. HTTP/2 is
    /// always hyper's. By default a server has no fast path.
    pub fn with_fast_path(mut self, fast: Arc<dyn fast::FastHttp1>) -> Self {
        self.fast = Some(fast);
        self
    }

    /// Serves HTTP/2 clients with the own HTTP/2 transport and `pipeline` (the proxy's,
    /// [`ProxyService`'s](crate::h2own::Pipeline)) when the listener's `own_http2` is on, and
    /// only for the service it belongs to (as [`with_fast_path`](Self::with_fast_path)).
    pub fn with_own_http2(mut self, pipeline: Arc<dyn h2own::Pipeline>) -> Self {
        self.own_h2 = Some(pipeline);
        self
    }

    /// Offers HTTP/3 on UDP `port` of the same host to the clients of its HTTP/1.1 and HTTP/2
    /// answers: each carries `Alt-Svc: h3=":port"; ma=86400` (RFC 7838), replacing one the
    /// upstream sent (which would name the upstream's own); the fast path puts it on its
    /// answers too ([`fast::Conn::fields`]).
    pub fn with_alt_svc(mut self, port: u16) -> Self {
        let value = format!("h3=\":{port}\"; ma=86400");
        self.alt_svc = http::HeaderValue::try_from(value).ok();
        self
    }

    /// Counts its open connections and failed TLS handshakes (by default into series nobody
    /// scrapes).
    pub fn with_connection_counters(
        mut self,
        counters: crate::counters::ConnectionCounters,
    ) -> Self {
        self.connections = counters;
        self
    }

    /// Counts the bytes its connections receive and send (by default nothing is counted).
    pub fn with_byte_counters(mut self, bytes: crate::counters::ByteCounters) -> Self {
        self.bytes = Some(bytes);
        self
    }

    /// Terminates TLS with this rustls config (its ALPN list decides HTTP/2 availability).
    pub fn with_tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(TlsAcceptor::from(config));
        self
    }

    /// Terminates TLS with `certs` (chosen by SNI), offering HTTP/2 by ALPN as the listener's
    /// settings say; [`certificates`](Self::certificates) can replace them while it serves.
    pub fn with_certificates(mut self, certs: Arc<tls::Certificates>) -> std::io::Result<Self> {
        let config = tls::server_config(Arc::clone(&certs), self.http.http2)?;
        self.certificates = Some(certs);
        Ok(self.with_tls(config))
    }

    /// The certificates set by [`with_certificates`](Self::with_certificates).
    pub fn certificates(&self) -> Option<&Arc<tls::Certificates>> {
        self.certificates.as_ref()
    }

    /// Whether the listener terminates TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The listener's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bound address (useful after binding port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `service` until `signal` fires, then stops accepting, lets open connections
    /// finish their in-flight requests for up to `grace`, and closes the rest.
    pub async fn serve<S: HttpService>(self, service: S, signal: ShutdownSignal, grace: Duration) {
        let mut settings = conn::Settings::new(&self.http, self.tls.clone());
        settings.bytes = self.bytes.clone();
        settings.tls_failures = self.connections.tls_failures.clone();
        settings.fast = self.fast_path_for::<S>();
        settings.own_h2 = self.own_http2_for::<S>();
        settings.alt_svc = self.alt_svc.clone();
        settings.fields = (self.alt_svc.iter())
            .map(|v| (http::header::ALT_SVC, v.clone()))
            .collect();
        settings.nodelay = !nodelay_inherited(&self.listener);
        let local = self
            .listener
            .local_addr()
            .unwrap_or_else(|_| ClientInfo::default().local);
        settings.client.local = local;
        let settings = Arc::new(settings);
        info!(listener = %self.name, addr = %local, tls = self.tls.is_some(), "listening");
        keep_accept_reserve();
        let per_client = self.http.max_connections_per_client.map(PerClient::new);
        let mut refusals = Tally::new(REPORT_INTERVAL);
        let mut conns = JoinSet::new();
        let stop = signal.wait();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        // IPv4 clients of a dual-stack listener arrive as ::ffff:a.b.c.d; CIDR
                        // rules and X-Forwarded-For want the IPv4 form.
                        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
                        let trusted = self.http.trusted_proxies.iter().any(|n| n.contains(&peer.ip()));
                        let client = conn::Peer { addr: peer, trusted };
                        let slot = match &per_client {
                            None => None,
                            Some(per) => match per.take(peer.ip()) {
                                Some(slot) => Some(slot),
                                None => {
                                    self.refuse(&mut refusals, peer);
                                    continue;
                                }
                            },
                        };
                        let (svc, set, sig) = (service.clone(), Arc::clone(&settings), signal.clone());
                        let open = Open::new(self.connections.open.clone(), slot);
                        conns.spawn(conn::serve(stream, client, svc, set, sig, open));
                    }
                    Err(e) => accept_error(&self.name, SockRef::from(&self.listener), e).await,
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        drop(self.listener);
        drain(&self.name, conns, grace).await;
    }
}

impl Server {
    /// Counts a connection closed as it was accepted, for being one more than
    /// `max_connections_per_client` lets its client hold; says so once per interval.
    fn refuse(&self, refusals: &mut Tally, peer: SocketAddr) {
        self.connections.refused.inc();
        if let Some(refused) = refusals.record(1, std::time::Instant::now()) {
            let limit = self.http.max_connections_per_client.unwrap_or_default();
            warn!(listener = %self.name, client.addr = %peer.ip(), refused, limit, "connections over max_connections_per_client closed at accept");
        }
    }

    /// The fast path, if the listener has it on and it belongs to the service `S` served.
    fn fast_path_for<S: 'static>(&self) -> Option<Arc<dyn fast::FastHttp1>> {
        let fast = self.fast.clone().filter(|_| fast_path_on(&self.http))?;
        if fast.service_type() != std::any::TypeId::of::<S>() {
            warn!(listener = %self.name, "the fast path is off here: the service served is not the proxy it belongs to (wrapped in tower layers?), and the layers must see every request");
            return None;
        }
        Some(fast)
    }
}

impl Server {
    /// The own HTTP/2 transport, if the listener has it on and it belongs to the service `S`.
    fn own_http2_for<S: 'static>(&self) -> Option<Arc<dyn h2own::Pipeline>> {
        let own = self.own_h2.clone().filter(|_| own_http2_on(&self.http))?;
        if own.service_type() != std::any::TypeId::of::<S>() {
            warn!(listener = %self.name, "the own HTTP/2 transport is off here: the service served is not the proxy it belongs to (wrapped in tower layers?), and the layers must see every request");
            return None;
        }
        Some(own)
    }
}

/// Whether the own HTTP/2 transport is on by default (a listener's `own_http2` says otherwise).
pub const OWN_HTTP2_DEFAULT: bool = true;

/// The listener's `own_http2`; where it says nothing, `SLUICE_OWN_HTTP2` (`0` or `1`) or else
/// the default: the test command runs the proxy's suites both ways, and a test that names a
/// transport gets it either way.
fn own_http2_on(http: &HttpOptions) -> bool {
    if let Some(own) = http.own_http2 {
        return own;
    }
    match std::env::var("SLUICE_OWN_HTTP2").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => OWN_HTTP2_DEFAULT,
    }
}

/// The listener's `fast_path`, unless `SLUICE_FAST_PATH` is `0` or `1`: the test command runs
/// the proxy's suites both ways with it.
fn fast_path_on(http: &HttpOptions) -> bool {
    match std::env::var("SLUICE_FAST_PATH").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => http.fast_path,
    }
}

/// An open connection's share of its listener's counts: the `open` gauge, and its client's
/// slot under `max_connections_per_client`. Given back when the connection ends, also when a
/// drain cuts it.
struct Open {
    gauge: prometheus_client::metrics::gauge::Gauge,
    /// Boxed: only listeners with that limit have one, and every connection holds this.
    _slot: Option<Box<per_client::Slot>>,
}

impl Open {
    fn new(
        gauge: prometheus_client::metrics::gauge::Gauge,
        slot: Option<per_client::Slot>,
    ) -> Self {
        gauge.inc();
        Self {
            gauge,
            _slot: slot.map(Box::new),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Sets `TCP_NODELAY` on the listener, so that the connections it accepts have it from the
/// start (Linux copies it to each accepted socket, as it does on BSD); false when that failed
/// and each connection must set it. An inherited listener gets it too.
fn nodelay_inherited(listener: &TcpListener) -> bool {
    SockRef::from(listener).set_tcp_nodelay(true).is_ok()
}

async fn drain(listener: &str, mut conns: JoinSet<()>, grace: Duration) {
    info!(listener, open = conns.len(), grace = ?grace, "stopped accepting; draining connections");
    let all_done = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, all_done).await.is_err() {
        warn!(
            listener,
            left = conns.len(),
            "grace period over; closing remaining connections"
        );
        conns.shutdown().await;
    }
    debug!(listener, "drained");
}

type ServeFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Several servers sharing one shutdown.
#[derive(Default)]
pub struct Group {
    shutdown: Shutdown,
    servers: Vec<ServeFuture>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("servers", &self.servers.len())
            .finish()
    }
}

impl Group {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a server; it starts when the group runs and drains within `grace` on shutdown.
    pub fn add<S: HttpService>(
        &mut self,
        server: Server,
        service: S,
        grace: Duration,
    ) -> &mut Self {
        let signal = self.shutdown.signal();
        self.servers
            .push(Box::pin(server.serve(service, signal, grace)));
        self
    }

    /// Adds a listener's HTTP/3 endpoint, served and drained as its other servers are.
    #[cfg(feature = "http3")]
    pub fn add_http3<S: H3Service>(
        &mut self,
        server: http3::H3Server,
        service: S,
        grace: Duration,
    ) -> &mut Self {
        let signal = self.shutdown.signal();
        self.servers
            .push(Box::pin(server.serve(service, signal, grace)));
        self
    }

    /// A signal that fires when the group starts shutting down (for tasks that should stop
    /// with it).
    pub fn signal(&self) -> ShutdownSignal {
        self.shutdown.signal()
    }

    /// Runs every server until `trigger` resolves, then shuts them all down gracefully and
    /// returns when the last one has drained.
    pub async fn run_until(self, trigger: impl Future<Output = ()>) {
        let handles: Vec<_> = self.servers.into_iter().map(tokio::spawn).collect();
        trigger.await;
        self.shutdown.trigger();
        for handle in handles {
            if let Err(e) = handle.await {
                warn!(error = %e, "a server task failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::convert::Infallible;

    use http_body_util::Empty;
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A connection the drain cuts (its request never answered within the grace) is no longer
    /// counted open: the gauge follows the connection's end, also when it is cut.
    #[tokio::test]
    async fn a_connection_cut_by_the_drain_is_counted_closed() {
        let never = tower::service_fn(|_req: http::Request<hyper::body::Incoming>| async {
            std::future::pending::<Result<http::Response<Empty<bytes::Bytes>>, Infallible>>().await
        });
        let counters = crate::counters::ConnectionCounters::default();
        let server = Server::bind("cut", "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap()
            .with_connection_counters(counters.clone());
        let mut client = tokio::net::TcpStream::connect(server.local_addr().unwrap())
            .await
            .unwrap();
        let shutdown = Shutdown::new();
        let serving =
            tokio::spawn(server.serve(never, shutdown.signal(), Duration::from_millis(50)));
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        // The gauge counts the connection once the server has accepted it.
        let counted = async {
            while counters.open.get() == 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), counted)
            .await
            .unwrap();
        shutdown.trigger();
        serving.await.unwrap();
        assert_eq!(counters.open.get(), 0);
    }

    /// The connections a listener accepts once it is served have `TCP_NODELAY` without a call
    /// of their own (responses written in parts would otherwise wait on Nagle's algorithm).
    #[tokio::test]
    async fn accepted_connections_have_nodelay_from_the_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        assert!(nodelay_inherited(&listener));
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}
