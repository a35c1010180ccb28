//! One service instance dialing many Sluice nodes (`protocol/README.md`, "Many nodes"): its
//! handler counts its own concurrency, so a test can check that the requests in flight,
//! summed over every node, never exceed the declared capacity.
//!
//! ```text
//! multinode --acceptor dns:nodes.test:7070 --service api --capacity 16 \
//!           [--instance ID] [--delay-ms D] [--stats 127.0.0.1:9000]
//! ```
//!
//! Every flag may come from the environment instead (`SLUICE_ACCEPTOR`, `SLUICE_SERVICE`,
//! `SLUICE_CAPACITY`, `SLUICE_INSTANCE`, `SLUICE_DELAY_MS`, `SLUICE_STATS`); the token is
//! `SLUICE_TOKEN`. The acceptor is any form `Acceptor::parse` reads (`host:port`, `dns:NAME:PORT`,
//! `a:7070,b:7070`). Each request waits `delay-ms` and answers `200` with `<instance>\n`.
//! Stdout gets `max_in_flight N` each time the most requests in flight at once grows. With
//! `--stats`, an HTTP endpoint answers `GET /max` (that maximum), `GET /nodes` (one line per
//! node: address, live, demand, held, target) and `POST /capacity?n=K` (sets the capacity).
//! SIGTERM drains, prints `drained max_in_flight N` and exits 0. The SDK's log lines (one per
//! outage, rebalance, capacity change) go to stderr; `RUST_LOG` filters them (default `info`).

use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice_sdk::{Acceptor, Identity, Options, Status};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone)]
struct Args {
    acceptor: String,
    service: String,
    instance: String,
    capacity: usize,
    delay: Duration,
    stats: Option<String>,
}

/// `--flag value`, else `SLUICE_FLAG`, else the default.
fn args() -> Result<Args, BoxError> {
    let mut flags = std::collections::HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let name = flag
            .strip_prefix("--")
            .ok_or(format!("unexpected {flag}"))?;
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        flags.insert(name.replace('-', "_").to_uppercase(), value);
    }
    let get = |name: &str| {
        let env = std::env::var(format!("SLUICE_{name}")).ok();
        flags.get(name).cloned().or(env)
    };
    Ok(Args {
        acceptor: get("ACCEPTOR").ok_or("give --acceptor ADDR or SLUICE_ACCEPTOR")?,
        service: get("SERVICE").unwrap_or_else(|| "hello".into()),
        instance: get("INSTANCE").unwrap_or_else(|| "rust".into()),
        capacity: get("CAPACITY").map_or(Ok(1), |c| c.parse())?,
        delay: Duration::from_millis(get("DELAY_MS").map_or(Ok(0), |d| d.parse())?),
        stats: get("STATS"),
    })
}

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static MAX_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

async fn handle(_req: Request<Incoming>, a: Args) -> Result<Response<String>, Infallible> {
    let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    if MAX_IN_FLIGHT.fetch_max(now, Ordering::SeqCst) < now {
        say(&format!("max_in_flight {now}"));
    }
    tokio::time::sleep(a.delay).await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    Ok(Response::new(format!("{}\n", a.instance)))
}

/// The stats endpoint's answer; a capacity to set goes to `resize`.
fn stats(
    req: &Request<Incoming>,
    status: &Status,
    resize: &mpsc::Sender<usize>,
) -> Response<String> {
    let path = req.uri().path();
    let body = match (req.method(), path) {
        (&Method::GET, "/max") => format!("{}\n", MAX_IN_FLIGHT.load(Ordering::SeqCst)),
        (&Method::GET, "/nodes") => status
            .nodes
            .iter()
            .map(|n| {
                let (addr, live, d, held, t) = (n.address, n.live, n.demand, n.held, n.target);
                format!("{addr} live={live} demand={d:.1} held={held} target={t}\n")
            })
            .collect(),
        // As the Go and Python examples take it, so one test drives all three.
        (&Method::POST, "/capacity") => {
            let n = req.uri().query().and_then(|q| q.strip_prefix("n="));
            match n.map(str::parse) {
                Some(Ok(n)) if resize.try_send(n).is_ok() => format!("capacity {n}\n"),
                _ => return reply(StatusCode::BAD_REQUEST, "POST /capacity?n=K\n"),
            }
        }
        _ => {
            return reply(
                StatusCode::NOT_FOUND,
                "GET /max, GET /nodes, POST /capacity?n=K\n",
            )
        }
    };
    reply(StatusCode::OK, &body)
}

fn reply(status: StatusCode, body: &str) -> Response<String> {
    let mut res = Response::new(body.to_owned());
    *res.status_mut() = status;
    res
}

async fn serve_stats(
    addr: String,
    status: watch::Receiver<Status>,
    resize: mpsc::Sender<usize>,
) -> Result<(), BoxError> {
    let listener = TcpListener::bind(&addr).await?;
    say(&format!("stats {}", listener.local_addr()?));
    loop {
        let (stream, _) = listener.accept().await?;
        let (status, resize) = (status.clone(), resize.clone());
        let svc = hyper::service::service_fn(move |req| {
            let res = stats(&req, &status.borrow(), &resize);
            async move { Ok::<_, Infallible>(res) }
        });
        let conn = hyper::server::conn::http1::Builder::new();
        tokio::spawn(conn.serve_connection(TokioIo::new(stream), svc));
    }
}

/// One line on stdout, whole.
fn say(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let a = args()?;
    let mut term = signal(SignalKind::terminate())?;
    let mut identity = Identity::new(a.service.clone());
    identity.instance = Some(a.instance.clone());
    identity.token = std::env::var("SLUICE_TOKEN").ok();
    let mut options = Options::new(Acceptor::parse(&a.acceptor)?, identity);
    options.capacity = a.capacity;
    let service = {
        let a = a.clone();
        tower::service_fn(move |req| handle(req, a.clone()))
    };
    let sessions = sluice_sdk::serve(options, service)?;
    let (resize, mut resizes) = mpsc::channel(8);
    if let Some(addr) = a.stats.clone() {
        tokio::spawn(serve_stats(addr, sessions.subscribe(), resize));
    }
    loop {
        tokio::select! {
            Some(n) = resizes.recv() => sessions.set_capacity(n),
            _ = term.recv() => break,
        }
    }
    sessions.shutdown().await?;
    say(&format!(
        "drained max_in_flight {}",
        MAX_IN_FLIGHT.load(Ordering::SeqCst)
    ));
    Ok(())
}
