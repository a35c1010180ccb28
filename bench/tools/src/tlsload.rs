//! New TLS connections as fast as a proxy accepts them: each of N clients connects, completes
//! a handshake (full, or resumed from the session its previous connection got), sends one
//! `GET` with `Connection: close`, reads the response to its end and starts again. What a
//! handshake costs the proxy is its CPU time over the handshakes counted here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Whether clients resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Every connection makes a full handshake (resumption off).
    Full,
    /// Every connection after a client's first resumes the session its previous one got.
    Resumed,
}

/// Where to connect, how, and for how long.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// The proxy's TLS address.
    #[arg(long)]
    pub addr: SocketAddr,
    /// The name to send by SNI and verify.
    #[arg(long, default_value = "localhost")]
    pub name: String,
    /// The PEM CA certificate to trust (the one that signed the proxy's).
    #[arg(long)]
    pub ca: std::path::PathBuf,
    /// Clients connecting at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 5.0, value_parser = crate::slowclients::positive)]
    pub seconds: f64,
    /// Full or resumed handshakes.
    #[arg(long, value_enum, default_value_t = Mode::Full)]
    pub mode: Mode,
}

/// What `tlsload` prints.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Connections whose response was a 200, read to the end.
    pub requests: u64,
    /// Of those, how many resumed a session.
    pub resumed: u64,
    /// Connections that failed (connect, handshake, or not a 200).
    pub errors: u64,
    /// What the first failure was, if any.
    pub first_error: Option<String>,
    /// The run's length.
    pub seconds: f64,
}

/// Runs the clients until `cfg.seconds` have passed.
pub async fn run(cfg: &Config) -> anyhow::Result<Report> {
    let pem = std::fs::read(&cfg.ca).with_context(|| format!("reading {}", cfg.ca.display()))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert?)?;
    }
    let name = ServerName::try_from(cfg.name.clone())?;
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        cfg.name
    );
    let until = Instant::now() + Duration::from_secs_f64(cfg.seconds);
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..cfg.connections {
        // One config per client: a resuming client resumes its own session.
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
        if cfg.mode == Mode::Full {
            config.resumption = Resumption::disabled();
        }
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = Client {
            connector: TlsConnector::from(Arc::new(config)),
            addr: cfg.addr,
            name: name.clone(),
            request: request.clone().into_bytes(),
        };
        clients.spawn(async move { client.run(until).await });
    }
    let mut report = Report::default();
    while let Some(done) = clients.join_next().await {
        let one = done?;
        report.requests += one.requests;
        report.resumed += one.resumed;
        report.errors += one.errors;
        report.first_error = report.first_error.or(one.first_error);
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

struct Client {
    connector: TlsConnector,
    addr: SocketAddr,
    name: ServerName<'static>,
    request: Vec<u8>,
}

impl Client {
    async fn run(self, until: Instant) -> Report {
        let mut report = Report::default();
        let mut body = Vec::with_capacity(4096);
        while Instant::now() < until {
            match self.once(&mut body).await {
                Ok(resumed) => {
                    report.requests += 1;
                    report.resumed += u64::from(resumed);
                }
                Err(e) => {
                    report.errors += 1;
                    report.first_error.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
        report
    }

    /// One connection, one request; whether the handshake resumed.
    async fn once(&self, body: &mut Vec<u8>) -> anyhow::Result<bool> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let mut tls = self.connector.connect(self.name.clone(), tcp).await?;
        let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
        tls.write_all(&self.request).await?;
        body.clear();
        // `Connection: close`: the response ends with the connection (a missing close_notify
        // is rustls's UnexpectedEof, which still ends a complete response here).
        let _ = tls.read_to_end(body).await;
        anyhow::ensure!(body.starts_with(b"HTTP/1.1 200"), "not a 200");
        Ok(resumed)
    }
}
