//! HTTP/3 load for the `http3` scenario, where Debian's `h2load` is built without QUIC: h3
//! over quinn, the shape of `h2load -c N -m M -D S --warm-up-time W`.
//!
//! * [`Mode::Load`]: N QUIC connections (each from its own UDP socket), M requests in flight on
//!   each, for a warm-up and then S seconds; the requests answered in the S seconds are counted.
//! * [`Mode::Idle`]: N connections, one `GET` each read to its end, then held open and idle
//!   (QUIC PINGs every few seconds keep them from the idle timeout) until a line arrives on
//!   stdin; the idle scenario reads the proxy's memory meanwhile.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::{Buf, Bytes};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;
use serde::Serialize;

/// What the client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Requests as fast as the server answers them.
    Load,
    /// Connections held open and idle after one request each.
    Idle,
}

/// Where to connect, how, and for how long.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// The server's UDP address.
    #[arg(long)]
    pub addr: SocketAddr,
    /// The name to send by SNI, verify and send as `:authority` (with the port).
    #[arg(long, default_value = "localhost")]
    pub name: String,
    /// The PEM CA certificate to trust (the one that signed the server's).
    #[arg(long)]
    pub ca: std::path::PathBuf,
    /// The path to request.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// QUIC connections.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// Requests in flight on each connection (load mode).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub streams: u32,
    /// How long to count, in seconds, after the warm-up (load mode).
    #[arg(long, default_value_t = 5.0, value_parser = crate::slowclients::positive)]
    pub seconds: f64,
    /// Seconds of load before counting starts (load mode).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Load or idle.
    #[arg(long, value_enum, default_value_t = Mode::Load)]
    pub mode: Mode,
}

/// What `h3load --mode load` prints.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Answers with a 2xx read to their end within the counted seconds.
    pub requests: u64,
    /// Answers of another status within them.
    pub non2xx: u64,
    /// Requests that failed (stream or connection errors), and connections that did not open.
    pub errors: u64,
    /// What the first failure was, if any.
    pub first_error: Option<String>,
    /// Response body bytes read within the counted seconds.
    pub bytes: u64,
    /// The counted seconds, as measured.
    pub seconds: f64,
    /// Mean time from sending a request to its answer's end, in microseconds.
    pub mean_latency_us: f64,
}

/// What `h3load --mode idle` prints once every connection is open (or failed).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Opened {
    /// Connections open and idle after their request.
    pub open: u64,
    /// Connections that failed to open or to get their answer.
    pub failed: u64,
    /// How long opening them all took.
    pub seconds: f64,
    /// What the first failure was, if any.
    pub first_error: Option<String>,
}

/// The client side's QUIC and TLS setup, shared by every connection.
struct Client {
    config: quinn::ClientConfig,
    cfg: Config,
    authority: String,
}

impl Client {
    fn new(cfg: &Config) -> anyhow::Result<Self> {
        let pem =
            std::fs::read(&cfg.ca).with_context(|| format!("reading {}", cfg.ca.display()))?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            roots.add(cert?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = quinn::TransportConfig::default();
        transport.keep_alive_interval(Some(Duration::from_secs(5)));
        transport.max_idle_timeout(Some(Duration::from_secs(600).try_into()?));
        config.transport_config(Arc::new(transport));
        Ok(Self {
            config,
            authority: format!("{}:{}", cfg.name, cfg.addr.port()),
            cfg: cfg.clone(),
        })
    }

    /// A new QUIC connection from `endpoint` and its h3 request sender; the h3 driver runs on
    /// a task of its own until the connection closes.
    async fn connect(
        &self,
        endpoint: &quinn::Endpoint,
    ) -> anyhow::Result<h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>> {
        let quic = endpoint
            .connect_with(self.config.clone(), self.cfg.addr, &self.cfg.name)?
            .await
            .context("QUIC handshake")?;
        let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(quic))
            .await
            .context("HTTP/3 setup")?;
        tokio::spawn(async move { poll_fn(|cx| driver.poll_close(cx)).await });
        Ok(sender)
    }

    fn request(&self) -> anyhow::Result<http::Request<()>> {
        let uri = format!("https://{}{}", self.authority, self.cfg.path);
        Ok(http::Request::get(uri).body(())?)
    }
}

/// One request on `sender`, read to its end: its status and body length.
async fn once(
    sender: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    req: http::Request<()>,
) -> anyhow::Result<(http::StatusCode, u64)> {
    let mut stream = sender.send_request(req).await?;
    stream.finish().await?;
    let status = stream.recv_response().await?.status();
    let mut bytes = 0;
    while let Some(chunk) = stream.recv_data().await? {
        bytes += chunk.remaining() as u64;
    }
    Ok((status, bytes))
}

fn endpoint() -> anyhow::Result<quinn::Endpoint> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    Ok(quinn::Endpoint::client(any)?)
}

/// Counters the request loops add to, and whether counting has started or stopped.
#[derive(Default)]
struct Tally {
    counting: AtomicBool,
    requests: AtomicU64,
    non2xx: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    latency_us: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl Tally {
    fn error(&self, e: &anyhow::Error) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first_error.lock() {
            first.get_or_insert_with(|| format!("{e:#}"));
        }
    }
}

/// The load mode: runs the request loops through the warm-up and the counted seconds.
pub async fn load(cfg: &Config) -> anyhow::Result<Report> {
    let client = Arc::new(Client::new(cfg)?);
    let tally = Arc::new(Tally::default());
    let warmup = Duration::from_secs_f64(cfg.warmup.max(0.0));
    let until = Instant::now() + warmup + Duration::from_secs_f64(cfg.seconds);
    let mut loops = tokio::task::JoinSet::new();
    let mut endpoints = Vec::new();
    for _ in 0..cfg.connections {
        let ep = endpoint()?;
        let sender = match client.connect(&ep).await {
            Ok(s) => s,
            Err(e) => {
                tally.error(&e);
                continue;
            }
        };
        endpoints.push(ep);
        for _ in 0..cfg.streams {
            let (client, tally, mut sender) =
                (Arc::clone(&client), Arc::clone(&tally), sender.clone());
            loops.spawn(async move {
                while Instant::now() < until {
                    let started = Instant::now();
                    let result = match client.request() {
                        Ok(req) => once(&mut sender, req).await,
                        Err(e) => Err(e),
                    };
                    if !tally.counting.load(Ordering::Relaxed) || Instant::now() >= until {
                        continue;
                    }
                    match result {
                        Ok((status, bytes)) => {
                            let kind = if status.is_success() {
                                &tally.requests
                            } else {
                                &tally.non2xx
                            };
                            kind.fetch_add(1, Ordering::Relaxed);
                            tally.bytes.fetch_add(bytes, Ordering::Relaxed);
                            let us = started.elapsed().as_micros() as u64;
                            tally.latency_us.fetch_add(us, Ordering::Relaxed);
                        }
                        Err(e) => tally.error(&e),
                    }
                }
            });
        }
    }
    tokio::time::sleep(warmup).await;
    tally.counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep_until(until.into()).await;
    let seconds = started.elapsed().as_secs_f64();
    while loops.join_next().await.is_some() {}
    for ep in &endpoints {
        ep.close(0u32.into(), b"done");
    }
    let answered = tally.requests.load(Ordering::Relaxed) + tally.non2xx.load(Ordering::Relaxed);
    let first_error = tally.first_error.lock().ok().and_then(|f| f.clone());
    Ok(Report {
        requests: tally.requests.load(Ordering::Relaxed),
        non2xx: tally.non2xx.load(Ordering::Relaxed),
        errors: tally.errors.load(Ordering::Relaxed),
        first_error,
        bytes: tally.bytes.load(Ordering::Relaxed),
        seconds,
        mean_latency_us: tally.latency_us.load(Ordering::Relaxed) as f64 / answered.max(1) as f64,
    })
}

/// Connections opened at once in idle mode, and connections per UDP socket there.
const IDLE_CONCURRENCY: usize = 64;
const IDLE_PER_ENDPOINT: usize = 100;

/// The idle mode: opens the connections, prints [`Opened`], holds them until a line arrives on
/// stdin, closes them and prints `{"closed": N}`.
pub async fn idle(cfg: &Config) -> anyhow::Result<()> {
    let client = Arc::new(Client::new(cfg)?);
    let started = Instant::now();
    let n = cfg.connections as usize;
    let endpoints = (0..n.div_ceil(IDLE_PER_ENDPOINT))
        .map(|_| endpoint())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let gate = Arc::new(tokio::sync::Semaphore::new(IDLE_CONCURRENCY));
    let mut opening = tokio::task::JoinSet::new();
    for i in 0..n {
        let (client, gate) = (Arc::clone(&client), Arc::clone(&gate));
        let ep = endpoints[i / IDLE_PER_ENDPOINT].clone();
        opening.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let mut sender = client.connect(&ep).await?;
            let (status, _) = once(&mut sender, client.request()?).await?;
            anyhow::ensure!(status.is_success(), "status {status}");
            Ok(sender)
        });
    }
    let (mut held, mut opened) = (Vec::with_capacity(n), Opened::default());
    while let Some(done) = opening.join_next().await {
        match done? {
            Ok(sender) => held.push(sender),
            Err(e) => {
                opened.failed += 1;
                opened.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    opened.open = held.len() as u64;
    opened.seconds = started.elapsed().as_secs_f64();
    crate::print_json(&opened)?;
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line)).await??;
    let closed = held.len();
    drop(held);
    for ep in &endpoints {
        ep.close(0u32.into(), b"done");
    }
    for ep in &endpoints {
        ep.wait_idle().await;
    }
    crate::say(&format!("{{\"closed\": {closed}}}"))?;
    Ok(())
}
