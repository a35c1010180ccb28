//! A hello service run either way Sluice can reach it: listening for the proxy to connect
//! (`--listen ADDR`, a plain hyper HTTP/1.1 server behind a static cluster), or dialing in
//! to the acceptor as sessions (`--acceptor ADDR [--service NAME] [--capacity N]`, through
//! `sluice_sdk::serve`). Both answer every request with `hello\n` from the same tower service,
//! so `bench/reverse_compare.py` compares the two paths and nothing else.
//!
//! Dialing in, it sends the bearer token in `SLUICE_TOKEN` when that is set. Prints
//! `listening hello=IP:PORT` or `registered N` on stdout once ready; Ctrl-C or SIGTERM exits
//! (dialing in, it drains first).

use std::convert::Infallible;
use std::error::Error;
use std::io::Write;
use std::net::SocketAddr;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice::os_signal;
use sluice_sdk::{Identity, Options};
use tokio::net::TcpListener;

type BoxError = Box<dyn Error + Send + Sync>;

async fn hello(_req: Request<Incoming>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::from("hello\n")))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let stop = os_signal();
    let flags = flags(std::env::args().skip(1))?;
    let get = |name: &str| {
        flags
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    match (get("listen"), get("acceptor")) {
        (Some(listen), None) => tokio::select! {
            r = listen_on(listen.parse()?) => r,
            () = stop => Ok(()),
        },
        (None, Some(acceptor)) => {
            let service = get("service").unwrap_or("hello");
            let capacity = get("capacity").unwrap_or("1").parse()?;
            dial_in(acceptor, service, capacity, stop).await
        }
        _ => Err("give exactly one of --listen ADDR or --acceptor ADDR".into()),
    }
}

/// `--name value` pairs, accepting only this example's flags.
fn flags(args: impl Iterator<Item = String>) -> Result<Vec<(String, String)>, BoxError> {
    let known = ["listen", "acceptor", "service", "capacity"];
    let mut args = args;
    let mut pairs = Vec::new();
    while let Some(arg) = args.next() {
        let name = arg.strip_prefix("--").filter(|n| known.contains(n));
        let name =
            name.ok_or_else(|| format!("unexpected {arg:?}; flags: --{}", known.join(", --")))?;
        let value = args
            .next()
            .ok_or_else(|| format!("--{name} needs a value"))?;
        pairs.push((name.to_owned(), value));
    }
    Ok(pairs)
}

/// Serves HTTP/1.1 with keep-alive on every accepted connection, one task each.
async fn listen_on(addr: SocketAddr) -> Result<(), BoxError> {
    let listener = TcpListener::bind(addr).await?;
    writeln!(
        std::io::stdout(),
        "listening hello={}",
        listener.local_addr()?
    )?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(hello);
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let _ = conn.await;
        });
    }
}

/// Keeps `capacity` sessions registered for `service` until `stop`, then drains.
async fn dial_in(
    acceptor: &str,
    service: &str,
    capacity: usize,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), BoxError> {
    let mut identity = Identity::new(service);
    // From the environment rather than a flag, so that it does not show in `ps`.
    identity.token = std::env::var("SLUICE_TOKEN").ok();
    let mut options = Options::new(sluice_sdk::Acceptor::Tcp(acceptor.into()), identity);
    options.capacity = capacity;
    let sessions = sluice_sdk::serve(options, tower::service_fn(hello))?;
    let mut status = sessions.subscribe();
    tokio::pin!(stop);
    tokio::select! {
        r = status.wait_for(|s| s.registered >= capacity) => { r?; }
        () = &mut stop => return Ok(()),
    }
    writeln!(std::io::stdout(), "registered {capacity}")?;
    stop.await;
    sessions.shutdown().await?;
    Ok(())
}
