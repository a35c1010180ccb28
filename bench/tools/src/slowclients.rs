//! Clients that read slowly: each keeps one connection, sends a `GET`, reads the response at
//! `--read-rate` bytes per second through a small receive buffer, and asks again, so a proxy
//! in front of a fast backend has to hold (or buffer) every response it relays.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use crate::response::ResponseParser;
use crate::target::Target;

/// Reads happen this often, each taking at most its share of the read rate.
const TICK: Duration = Duration::from_millis(250);

/// How long a client waits after an error before connecting again.
const RETRY: Duration = Duration::from_secs(1);

/// Who reads, how slowly, for how long.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// The URL to `GET`: `http://HOST:PORT/path` (plain HTTP only).
    #[arg(long, value_parser = Target::parse)]
    pub url: Target,
    /// How many clients, their starts spread over the first second.
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub clients: u32,
    /// Bytes per second each client reads at most.
    #[arg(long, value_name = "BYTES_PER_SEC", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(4..))]
    pub read_rate: u32,
    /// How long to run, in seconds.
    #[arg(long, value_name = "SECONDS", value_parser = positive)]
    pub duration: f64,
    /// The socket receive buffer (`SO_RCVBUF`, set before connecting), so the kernel does not
    /// take the whole response off the server's hands.
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    pub rcvbuf: u32,
}

/// A positive, finite number of seconds (clap's value parser).
pub(crate) fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// What `slowclients` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Clients started.
    pub clients: u32,
    /// Clients that connected at least once.
    pub connected: u64,
    /// Responses read to their end.
    pub responses_completed: u64,
    /// Bytes read, heads included.
    pub bytes_read: u64,
    /// Failed connects, broken connections and invalid responses.
    pub errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connected: AtomicU64,
    responses: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

#[derive(Debug)]
struct Client {
    addr: SocketAddr,
    request: Bytes,
    /// Bytes one tick may read.
    share: usize,
    rcvbuf: u32,
    counters: Arc<Counters>,
}

/// Runs every client until the duration ends or `stop` completes, whichever is first, then
/// closes everything and reports. Fails only when the URL's host does not resolve.
pub async fn run(config: &Config, stop: impl Future<Output = ()>) -> io::Result<Report> {
    let counters = Arc::new(Counters::default());
    let client = Arc::new(Client {
        addr: config.url.resolve().await?,
        request: config.url.get_request("sluice-slowclients"),
        share: (config.read_rate as usize / 4).max(1),
        rcvbuf: config.rcvbuf,
        counters: counters.clone(),
    });
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(config.duration);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..config.clients {
        let begin = start + Duration::from_secs(1) * i / config.clients;
        let client = client.clone();
        tasks.spawn(async move {
            tokio::time::sleep_until(begin).await;
            let _ = tokio::time::timeout_at(end, client.run()).await;
        });
    }
    let all_ended = async { while tasks.join_next().await.is_some() {} };
    tokio::select! {
        () = all_ended => {}
        () = stop => {}
    }
    tasks.shutdown().await;
    Ok(Report {
        clients: config.clients,
        connected: counters.connected.load(Ordering::Relaxed),
        responses_completed: counters.responses.load(Ordering::Relaxed),
        bytes_read: counters.bytes.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
    })
}

impl Client {
    /// Connects, and requests and reads slowly forever; reconnects after errors.
    async fn run(&self) {
        let mut counted = false;
        let mut throttle = Throttle::new(self.share);
        loop {
            let result = async {
                let mut stream = self.connect().await?;
                if !counted {
                    counted = true;
                    self.counters.connected.fetch_add(1, Ordering::Relaxed);
                }
                while self.exchange(&mut stream, &mut throttle).await? {}
                Ok::<_, io::Error>(())
            };
            if result.await.is_err() {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(RETRY).await;
            }
        }
    }

    async fn connect(&self) -> io::Result<TcpStream> {
        let socket = match self.addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        // Before connecting, so that the window the kernel advertises is small from the start.
        socket.set_recv_buffer_size(self.rcvbuf)?;
        socket.connect(self.addr).await
    }

    /// One request and its response, read within `throttle`; returns whether the connection
    /// stays open.
    async fn exchange(&self, stream: &mut TcpStream, throttle: &mut Throttle) -> io::Result<bool> {
        stream.write_all(&self.request).await?;
        let mut parser = ResponseParser::new();
        let mut buf = vec![0; self.share];
        loop {
            let max = throttle.allowance().await;
            let read = tokio::time::timeout_at(throttle.next, stream.read(&mut buf[..max]));
            let Ok(n) = read.await else {
                continue; // nothing this tick
            };
            let n = n?;
            if n == 0 {
                let done = parser.eof().map_err(invalid)?;
                self.counters.responses.fetch_add(1, Ordering::Relaxed);
                return Ok(!done.close);
            }
            throttle.left -= n;
            self.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
            let (used, done) = parser.feed(&buf[..n]).map_err(invalid)?;
            if let Some(done) = done {
                self.counters.responses.fetch_add(1, Ordering::Relaxed);
                return Ok(!done.close && used == n);
            }
        }
    }
}

/// The read budget of one client: `share` bytes per [`TICK`], unused bytes expiring.
#[derive(Debug)]
struct Throttle {
    share: usize,
    /// Bytes left to read before `next`.
    left: usize,
    /// The end of the current tick.
    next: Instant,
}

impl Throttle {
    fn new(share: usize) -> Self {
        Self {
            share,
            left: share,
            next: Instant::now() + TICK,
        }
    }

    /// How many bytes may be read before `next`; waits for the next tick when none.
    async fn allowance(&mut self) -> usize {
        if self.left == 0 {
            tokio::time::sleep_until(self.next).await;
        }
        let now = Instant::now();
        if now >= self.next {
            self.next = now + TICK;
            self.left = self.share;
        }
        self.left
    }
}

fn invalid(e: crate::response::ParseError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}
