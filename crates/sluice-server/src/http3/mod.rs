//! HTTP/3 to clients: a TLS listener's QUIC endpoint ([`H3Server`]) on a UDP socket, serving
//! the same service as the listener's HTTP/1.1 and HTTP/2 (hyperium's `h3` over `quinn`).
//!
//! Each request becomes what every transport hands the proxy: an `http::Request` whose body
//! is a [`RequestBody`] (`Boxed`, read from the QUIC stream as the proxy polls it) with the
//! connection's [`ClientInfo`] in its extensions, so routing, admission, rewrites, limits,
//! compression and the access log are the ones the hyper path runs.
//!
//! Safety defaults: 0-RTT is off (the rustls config accepts no early data: a replayed
//! request is never served); each connection has at most `max_streams` requests open at once
//! (QUIC's stream credit) and a listener's clients their `max_connections_per_client`;
//! Retry (address validation before any state is kept) is sent to every new client when
//! `retry` is on; quinn bounds what an unvalidated address is sent to three times what it
//! sent (RFC 9000 §8), and its endpoint has a random stateless-reset key per process.

mod body;
mod conn;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicServerConfig;
use sluice_net::accept::keep_reserve;
use sluice_net::http::HttpOptions;
use sluice_net::shutdown::ShutdownSignal;
use sluice_net::tls::{invalid, provider, ticketer};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::counters::QuicCounters;
use crate::per_client::PerClient;
use crate::service::H3Service;
use crate::tls::Certificates;

pub use self::conn::ALPN;

/// What a listener's HTTP/3 takes beyond its HTTP settings.
#[derive(Debug, Clone, Copy)]
pub struct H3Options {
    /// Send every new client a Retry (its address validated before the handshake begins):
    /// one round trip more, no state for spoofed sources.
    pub retry: bool,
    /// Requests (bidirectional streams) a connection may have open at once.
    pub max_streams: u32,
}

impl Default for H3Options {
    fn default() -> Self {
        Self {
            retry: false,
            max_streams: 100,
        }
    }
}

/// One listener's QUIC endpoint, serving HTTP/3.
pub struct H3Server {
    name: String,
    endpoint: quinn::Endpoint,
    http: HttpOptions,
    options: H3Options,
    counters: QuicCounters,
    /// UDP segments per send (GSO) and per receive (GRO) the socket takes; 1: none.
    offload: (usize, usize),
    /// Turns true when a hot restart's successor has taken the socket.
    handed_over: Option<tokio::sync::watch::Receiver<bool>>,
}

impl std::fmt::Debug for H3Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H3Server")
            .field("name", &self.name)
            .field("addr", &self.endpoint.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl H3Server {
    /// Serves HTTP/3 on `socket` (bound UDP) with the listener's `certs` (chosen by SNI as its
    /// TLS over TCP's are, and replaced with them by a reload).
    pub fn new(
        name: impl Into<String>,
        socket: std::net::UdpSocket,
        certs: Arc<Certificates>,
        http: HttpOptions,
        options: H3Options,
    ) -> io::Result<Self> {
        let offload = {
            let state = quinn::udp::UdpSocketState::new((&socket).into())?;
            (state.max_gso_segments(), state.gro_segments())
        };
        socket.set_nonblocking(true)?;
        let server = server_config(certs, &http, options)?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )?;
        Ok(Self {
            name: name.into(),
            endpoint,
            http,
            options,
            counters: QuicCounters::default(),
            offload,
            handed_over: None,
        })
    }

    /// Counts its handshakes and requests (by default into series nobody scrapes).
    pub fn with_counters(mut self, counters: QuicCounters) -> Self {
        self.counters = counters;
        self
    }

    /// Stops at once, rather than draining, when `handed_over` is true at the shutdown: a hot
    /// restart's successor reads the same UDP socket then, and packets of its clients taken
    /// here would be refused. The connections open here are closed (H3_NO_ERROR); carrying
    /// them over is not done yet.
    pub fn with_handover(mut self, handed_over: tokio::sync::watch::Receiver<bool>) -> Self {
        self.handed_over = Some(handed_over);
        self
    }

    /// The listener's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Whether the socket sends with UDP GSO (several datagrams per system call).
    pub fn gso(&self) -> bool {
        self.offload.0 > 1
    }

    /// Serves `service` until `signal` fires, then stops taking connections, tells open ones
    /// to finish (GOAWAY), lets their requests end for up to `grace`, and closes the rest.
    pub async fn serve<S: H3Service>(self, service: S, signal: ShutdownSignal, grace: Duration) {
        let local = self
            .local_addr()
            .unwrap_or(sluice_core::ClientInfo::default().local);
        let (gso, gro) = self.offload;
        info!(listener = %self.name, addr = %local, gso_segments = gso, gro_segments = gro, "listening for HTTP/3 (QUIC)");
        keep_reserve();
        let settings = Arc::new(conn::Settings::new(
            &self.http,
            local,
            self.counters.clone(),
        ));
        let per_client = self.http.max_connections_per_client.map(PerClient::new);
        let mut conns = JoinSet::new();
        let stop = signal.wait();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                incoming = self.endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    if self.options.retry && !incoming.remote_address_validated() {
                        if let Err(e) = incoming.retry() {
                            e.into_incoming().ignore();
                        }
                        continue;
                    }
                    let peer = incoming.remote_address();
                    let slot = match &per_client {
                        None => None,
                        Some(per) => match per.take(peer.ip().to_canonical()) {
                            Some(slot) => Some(slot),
                            None => {
                                debug!(listener = %self.name, client.addr = %peer, "QUIC connection over max_connections_per_client refused");
                                incoming.refuse();
                                continue;
                            }
                        },
                    };
                    let (svc, set, sig) = (service.clone(), Arc::clone(&settings), signal.clone());
                    conns.spawn(conn::serve(incoming, svc, set, sig, slot));
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        if self.handed_over.as_ref().is_some_and(|h| *h.borrow()) {
            warn!(listener = %self.name, open = conns.len(), "HTTP/3: a successor has the UDP socket; closing this process's QUIC connections");
            self.endpoint.close(conn::NO_ERROR, b"restart");
            conns.shutdown().await;
            let closed = self.endpoint.wait_idle();
            let _ = tokio::time::timeout(Duration::from_secs(1), closed).await;
            return;
        }
        // No new connections from here; the open ones were told by the signal.
        self.endpoint.set_server_config(None);
        drain(&self.name, conns, grace).await;
        self.endpoint.close(conn::NO_ERROR, b"");
        if tokio::time::timeout(grace, self.endpoint.wait_idle())
            .await
            .is_err()
        {
            warn!(listener = %self.name, "QUIC endpoint not idle after the grace period");
        }
    }
}

async fn drain(listener: &str, mut conns: JoinSet<()>, grace: Duration) {
    info!(listener, open = conns.len(), grace = ?grace, "HTTP/3: stopped accepting; draining connections");
    let all_done = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, all_done).await.is_err() {
        warn!(
            listener,
            left = conns.len(),
            "HTTP/3: grace period over; closing remaining connections"
        );
        conns.shutdown().await;
    }
}

/// The QUIC server config of a listener: TLS 1.3 with ALPN `h3` over its certificates, no
/// early data (0-RTT off), and the transport's limits from its settings.
fn server_config(
    certs: Arc<Certificates>,
    http: &HttpOptions,
    options: H3Options,
) -> io::Result<quinn::ServerConfig> {
    let tls = tls_config(certs)?;
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| invalid(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(options.max_streams.into())
        // The client's control and QPACK streams, and a few it may open to be ignored.
        .max_concurrent_uni_streams(16u32.into())
        .max_idle_timeout(quinn::IdleTimeout::try_from(http.idle_timeout).ok())
        // Responses one after another rather than round-robin: RFC 9218's default for a
        // request without a priority (not incremental), and fewer stream frames per packet.
        .send_fairness(false);
    server.transport_config(Arc::new(transport));
    Ok(server)
}

/// The rustls config of a listener's QUIC endpoint: the same certificates (so a reload
/// applies to it too), TLS 1.3 only, ALPN `h3`, tickets for resumption, and no early data:
/// 0-RTT stays off, as a replayed request would be served twice.
fn tls_config(certs: Arc<Certificates>) -> io::Result<Arc<rustls::ServerConfig>> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| invalid(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.ticketer = ticketer()?;
    config.max_early_data_size = 0;
    Ok(Arc::new(config))
}
