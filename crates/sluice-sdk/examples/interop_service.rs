//! The service the cross-language interop test and the SDK benchmark run in Rust; the Go
//! (`sdk/go/internal/interopsvc`) and Python (`sdk/python/tests/interop_service.py`) twins take
//! the same flags and print the same lines, so one driver runs all three.
//!
//! `interop_service --acceptor ADDR --service NAME --instance ID --capacity N [--delay-ms D]`
//! dials in (token from `SLUICE_TOKEN`) and prints `registered N`; `--listen ADDR` listens
//! instead and prints `listening ADDR`. Each request with an `X-Request-Id` prints
//! `start <id>` before its delay; every answer is `200` with body `<instance>\n` (`<instance>
//! <client address>\n` for a request with `X-Echo-Client`; this one also says in
//! `x-in-flight` how many requests it was handling, this one included, and echoes
//! `x-request-id`). SIGTERM drains (dialing in), prints `drained` and exits 0.

use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{header, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice_sdk::{Acceptor, Identity, Options};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Default)]
struct Args {
    acceptor: Option<String>,
    listen: Option<String>,
    service: String,
    instance: String,
    capacity: usize,
    delay: Duration,
}

fn args() -> Result<Args, BoxError> {
    let mut a = Args {
        service: "hello".into(),
        instance: "rust".into(),
        capacity: 1,
        ..Args::default()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--acceptor" => a.acceptor = Some(value),
            "--listen" => a.listen = Some(value),
            "--service" => a.service = value,
            "--instance" => a.instance = value,
            "--capacity" => a.capacity = value.parse()?,
            "--delay-ms" => a.delay = Duration::from_millis(value.parse()?),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(a)
}

/// Requests being handled right now, for `x-in-flight`.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

async fn handle(req: Request<Incoming>, a: Args) -> Result<Response<String>, Infallible> {
    let in_flight = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    let res = respond(req, &a).await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    let mut res = res?;
    res.headers_mut().insert("x-in-flight", in_flight.into());
    Ok(res)
}

async fn respond(req: Request<Incoming>, a: &Args) -> Result<Response<String>, Infallible> {
    let id = req.headers().get("x-request-id").cloned();
    if let Some(id) = &id {
        say(&format!("start {}", String::from_utf8_lossy(id.as_bytes())));
    }
    if !a.delay.is_zero() {
        tokio::time::sleep(a.delay).await;
    }
    let echo = req.headers().contains_key("x-echo-client");
    let client = req.extensions().get::<sluice_sdk::ClientAddr>().copied();
    let _ = req.into_body().collect().await;
    let body = match (echo, client) {
        (false, _) => format!("{}\n", a.instance),
        (true, Some(client)) => format!("{} {client}\n", a.instance),
        (true, None) => format!("{} none\n", a.instance),
    };
    let mut res = Response::new(body);
    res.headers_mut()
        .insert(header::CONTENT_TYPE, "text/plain".parse().expect("static"));
    // Echoed, so a test can tell that every answer reached the request it belongs to.
    if let Some(id) = id {
        res.headers_mut().insert("x-request-id", id);
    }
    Ok(res)
}

/// One line on stdout, whole.
fn say(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let a = args()?;
    let mut term = signal(SignalKind::terminate())?;
    let service = {
        let a = a.clone();
        tower::service_fn(move |req| handle(req, a.clone()))
    };
    if let Some(listen) = &a.listen {
        let listener = TcpListener::bind(listen).await?;
        say(&format!("listening {}", listener.local_addr()?));
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => r?,
                _ = term.recv() => return Ok(()),
            };
            let _ = stream.set_nodelay(true);
            let a = a.clone();
            let svc = hyper::service::service_fn(move |req| handle(req, a.clone()));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    }
    let acceptor = a
        .acceptor
        .clone()
        .ok_or("give --acceptor ADDR or --listen ADDR")?;
    let mut identity = Identity::new(a.service.clone());
    identity.instance = Some(a.instance.clone());
    identity.token = std::env::var("SLUICE_TOKEN").ok();
    let mut options = Options::new(Acceptor::Tcp(acceptor), identity);
    options.capacity = a.capacity;
    let sessions = sluice_sdk::serve(options, service)?;
    let mut status = sessions.subscribe();
    let ready = status.wait_for(|s| s.registered >= a.capacity || s.last_error.is_some());
    if let Some(e) = ready
        .await?
        .last_error
        .clone()
        .filter(|e| !e.is_retryable())
    {
        return Err(format!("the acceptor refused this instance: {e}").into());
    }
    say(&format!("registered {}", a.capacity));
    term.recv().await;
    sessions.shutdown().await?;
    say("drained");
    Ok(())
}
