//! `bench-backend (--listen ADDR | --acceptor ADDR --service NAME --sessions N [--streams S]
//! [--instance ID]) [--grpc] [--delay-ms D] [--body-bytes B] [--stats ADDR] [--threads N]`: the
//! backend of every benchmark target. Prints `listening ADDR` or, dialing in (token from
//! `SLUICE_TOKEN`), `registered N` once N sessions are registered; with `--stats`, then `stats
//! ADDR`. SIGTERM or SIGINT exits 0 (dialing in, after draining for at most 2 s). `--streams`
//! makes the sessions HTTP/2 ones of S streams each; `--grpc` dialing in needs it.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{ArgGroup, Parser};
use sluice_bench::backend::{self, Backend, Counters};
use sluice_bench::say;
use sluice_sdk::{Acceptor, Identity, Options, SessionService};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// How long a dial-in backend waits for the proxy to close its sessions when told to stop.
const DRAIN: Duration = Duration::from_secs(2);

/// The benchmark backend: `200 text/plain` with a body of a chosen size after a chosen delay.
#[derive(Debug, Parser)]
#[command(name = "bench-backend")]
#[command(group(ArgGroup::new("mode").required(true).args(["listen", "acceptor"])))]
struct Cli {
    /// Listen for plain HTTP/1.1 on this address (port 0: any; the ready line says which).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Speak gRPC over HTTP/2 instead (listening: cleartext with prior knowledge; dialing in:
    /// on HTTP/2 sessions, so --streams is required): every call is answered with the body as
    /// one gRPC message (ten on a method named `Stream`) and `grpc-status: 0`; --delay-ms and
    /// queries do not apply.
    #[arg(long)]
    grpc: bool,
    /// Dial in to this Sluice acceptor instead, as sessions of --service.
    #[arg(long, value_name = "ADDR", requires_all = ["service", "sessions"])]
    acceptor: Option<String>,
    /// The service (cluster) the sessions serve.
    #[arg(long, value_name = "NAME", requires = "acceptor")]
    service: Option<String>,
    /// How many sessions to keep registered.
    #[arg(long, value_name = "N", requires = "acceptor",
          value_parser = clap::value_parser!(u32).range(1..))]
    sessions: Option<u32>,
    /// Register HTTP/2 sessions of N streams each (the SDK's `Options::streams`): each takes
    /// N requests at once. Without it, HTTP/1.1 sessions.
    #[arg(long, value_name = "N", requires = "acceptor",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    streams: Option<u32>,
    /// The instance id (default: the proxy uses this host's address).
    #[arg(long, value_name = "ID", requires = "acceptor")]
    instance: Option<String>,
    /// Also serve `GET /stats` and `POST /reset` on this address.
    #[arg(long, value_name = "ADDR")]
    stats: Option<String>,
    #[command(flatten)]
    config: backend::Config,
    /// Tokio worker threads (1: a current-thread runtime).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
}

fn main() -> ExitCode {
    sluice_bench::exit("bench-backend", start(Cli::parse()))
}

fn start(cli: Cli) -> anyhow::Result<()> {
    let rt = sluice_bench::runtime(cli.threads.into())?;
    let result = rt.block_on(run(cli));
    // Open connections and sessions end with the process; do not wait for them.
    rt.shutdown_background();
    result
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut stop = Stop::new()?;
    let counters = Arc::new(Counters::default());
    let backend = Arc::new(Backend::new(&cli.config, counters.clone()));
    let stats = match &cli.stats {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let sessions = match (&cli.listen, &cli.acceptor) {
        (Some(addr), _) => {
            let listener = bind(addr).await?;
            say(&format!("listening {}", listener.local_addr()?))?;
            if cli.grpc {
                let reply = backend.grpc_reply();
                tokio::spawn(backend::grpc::serve(listener, counters.clone(), reply));
            } else {
                let handler = move |req| backend.clone().handle(req);
                tokio::spawn(backend::serve(listener, Some(counters.clone()), handler));
            }
            None
        }
        (None, Some(acceptor)) => {
            let sessions = if cli.grpc {
                if cli.streams.is_none() {
                    bail!("--grpc dialing in needs HTTP/2 sessions: give --streams N");
                }
                let (calls, reply) = (counters.clone(), backend.grpc_reply());
                let service = tower::service_fn(move |req| {
                    backend::grpc::call(calls.clone(), reply.clone(), req)
                });
                dial_in(&cli, acceptor, service, &counters, &mut stop).await?
            } else {
                let service = tower::service_fn(move |req| backend.clone().handle(req));
                dial_in(&cli, acceptor, service, &counters, &mut stop).await?
            };
            match sessions {
                Some(sessions) => Some(sessions),
                None => return Ok(()),
            }
        }
        (None, None) => bail!("give --listen ADDR or --acceptor ADDR"),
    };
    if let Some(listener) = stats {
        say(&format!("stats {}", listener.local_addr()?))?;
        tokio::spawn(backend::serve(listener, None, move |req| {
            counters.clone().serve(req)
        }));
    }
    stop.recv().await;
    if let Some(sessions) = sessions {
        match tokio::time::timeout(DRAIN, sessions.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("drain failed: {e}"),
            Err(_) => eprintln!("sessions still open after {DRAIN:?}; exiting anyway"),
        }
    }
    Ok(())
}

async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    backend::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// Starts the sessions serving `service` and waits until all are registered; `None` when told
/// to stop first.
async fn dial_in<S: SessionService>(
    cli: &Cli,
    acceptor: &str,
    service: S,
    counters: &Arc<Counters>,
    stop: &mut Stop,
) -> anyhow::Result<Option<sluice_sdk::Sessions>> {
    let capacity = cli.sessions.unwrap_or(1) as usize;
    let mut identity = Identity::new(cli.service.clone().unwrap_or_default());
    identity.instance = cli.instance.clone();
    identity.token = std::env::var("SLUICE_TOKEN").ok();
    let mut options = Options::new(Acceptor::Tcp(acceptor.to_owned()), identity);
    options.capacity = capacity;
    options.streams = cli.streams;
    let sessions = sluice_sdk::serve(options, service)?;
    let mut status = sessions.subscribe();
    let ready = status.wait_for(|s| {
        s.registered >= capacity || s.last_error.as_ref().is_some_and(|e| !e.is_retryable())
    });
    let refused = tokio::select! {
        ready = ready => ready?.last_error.clone().filter(|e| !e.is_retryable()),
        () = stop.recv() => return Ok(None),
    };
    if let Some(e) = refused {
        bail!("the acceptor refused this instance: {e}");
    }
    say(&format!("registered {capacity}"))?;
    // Re-dials during a run show in /stats as `registrations`.
    let mut watch = sessions.subscribe();
    let counters = counters.clone();
    tokio::spawn(async move {
        loop {
            counters.set_registrations(watch.borrow_and_update().registrations);
            if watch.changed().await.is_err() {
                return;
            }
        }
    });
    Ok(Some(sessions))
}

/// SIGTERM or SIGINT.
#[derive(Debug)]
struct Stop {
    term: Signal,
    int: Signal,
}

impl Stop {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
