//! `sluice demo`: a proxy, its acceptor and two services that dial in, all in one process.
//!
//! Nothing else needs to run. The proxy serves one listener whose only route goes to the
//! reverse cluster `demo`; two in-process instances register through [`sluice_sdk::serve`]
//! (`demo-a` with 8 sessions, `demo-b` with 4), and each request does ~20 ms of simulated work.
//! Each instance counts the requests it is working on, so the demo can show that in-flight
//! work never exceeds the sessions an instance declared. With `--load` a built-in open-loop
//! load (see [`crate::load`]) runs after start-up and the demo exits when it is done.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http::Request;
use hyper::body::Incoming;
use sluice::os_signal;
use sluice::{Proxy, ReverseCluster};
use sluice_sdk::{Identity, Options, Sessions};
use tokio::sync::oneshot;

use crate::demo_service::{Instance, WORK};

/// The reverse cluster the demo services register for.
pub(crate) const CLUSTER: &str = "demo";
/// The admission queue: requests that may wait for a session, and for how long.
const QUEUE_MAX: usize = 256;
const QUEUE_TIMEOUT: &str = "1s";
/// The demo instances: name and declared sessions.
const INSTANCES: [(&str, usize); 2] = [("demo-a", 8), ("demo-b", 4)];
/// How long start-up may take before the demo gives up (registration is local and fast).
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long each instance may take to drain at exit.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// `sluice demo` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DemoArgs {
    /// Where the proxy listens for clients.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where the acceptor listens for the demo services to dial in.
    #[arg(long, default_value = "127.0.0.1:7070")]
    acceptor: SocketAddr,
    /// Where the admin API listens (`sluice ctl status`, `/metrics`); loopback, no token.
    #[arg(long, default_value = "127.0.0.1:9901")]
    admin: SocketAddr,
    /// Run a built-in open-loop load from 0.5x to 10x the declared capacity, print a table
    /// per step, then exit.
    #[arg(long)]
    pub(crate) load: bool,
    /// Length of each load step, in seconds.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=600))]
    step_seconds: u64,
}

/// Runs the demo on its own runtime until a signal (or, with `--load`, until the load is done).
pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(demo(args))
}

/// The demo's configuration: one listener, the acceptor, one route to the reverse cluster.
fn config_text(args: &DemoArgs) -> String {
    format!(
        r#"[runtime]
shutdown_grace = "2s"

[acceptor]
listen = "{acceptor}"

[admin]
listen = "{admin}"

[[listener]]
name = "demo"
listen = "{listen}"

[[route]]
name = "demo"
path_prefix = "/"
cluster = "{CLUSTER}"

[cluster.{CLUSTER}]
kind = "reverse"
queue_max = {QUEUE_MAX}
queue_timeout = "{QUEUE_TIMEOUT}"
"#,
        acceptor = args.acceptor,
        listen = args.listen,
        admin = args.admin,
    )
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    // Installed before binding, so a signal during start-up stops the demo cleanly.
    let stop = os_signal();
    tokio::pin!(stop);
    let config = sluice::config::parse_str(&config_text(&args), "<demo>", Path::new("."))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let proxy = Proxy::bind(&config)
        .await
        .map_err(|e| in_use_hint(e.into()))?;
    let (listen, acceptor) = addresses(&proxy)?;
    let admin = proxy.admin_addr();
    let cluster = proxy
        .reverse_cluster(CLUSTER)
        .cloned()
        .context("the demo cluster is missing")?;
    println!("listening proxy={listen}");
    println!("listening acceptor={acceptor}");
    if let Some(admin) = admin {
        println!("listening admin={admin}");
    }
    let (halt, halted) = oneshot::channel::<()>();
    let server = tokio::spawn(proxy.run_until(async move {
        let _ = halted.await;
    }));
    let instances: Vec<_> = INSTANCES
        .iter()
        .map(|&(name, n)| Instance::new(name, n))
        .collect();
    let sessions = start_instances(acceptor, &instances).await?;
    print_ready(&instances);
    let outcome = tokio::select! {
        r = serve_or_load(&args, (listen, admin), &cluster, &instances) => r,
        () = &mut stop => {
            println!("stopping: signal received");
            Ok(())
        }
    };
    stop_all(sessions, halt, server).await;
    for i in &instances {
        println!("{} answered {} requests", i.name, i.served());
    }
    outcome
}

/// A port in use most likely belongs to a demo already running: say how to run another.
fn in_use_hint(e: anyhow::Error) -> anyhow::Error {
    let in_use = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    });
    match in_use {
        true => e.context(
            "is a demo already running? Stop it, or give this one free ports: --listen 127.0.0.1:0 --acceptor 127.0.0.1:0 --admin 127.0.0.1:0",
        ),
        false => e,
    }
}

fn addresses(proxy: &Proxy) -> anyhow::Result<(SocketAddr, SocketAddr)> {
    let listen = proxy
        .local_addrs()
        .first()
        .map(|(_, addr)| *addr)
        .context("the demo listener has no address")?;
    let acceptor = proxy
        .acceptor_addr()
        .context("the demo acceptor has no address")?;
    Ok((listen, acceptor))
}

/// Starts every instance and waits until each has registered all its sessions.
async fn start_instances(
    acceptor: SocketAddr,
    instances: &[Arc<Instance>],
) -> anyhow::Result<Vec<Sessions>> {
    let mut all = Vec::with_capacity(instances.len());
    for instance in instances {
        println!(
            "starting {}: dials {acceptor} and registers {} sessions",
            instance.name, instance.sessions
        );
        all.push(start_instance(acceptor, Arc::clone(instance))?);
    }
    for (sessions, instance) in all.iter().zip(instances) {
        let mut status = sessions.subscribe();
        let registered = status.wait_for(|s| s.registered >= instance.sessions);
        tokio::time::timeout(READY_TIMEOUT, registered)
            .await
            .with_context(|| format!("{} did not register in time", instance.name))?
            .with_context(|| format!("{} stopped before registering", instance.name))?;
    }
    Ok(all)
}

fn start_instance(acceptor: SocketAddr, instance: Arc<Instance>) -> anyhow::Result<Sessions> {
    let mut identity = Identity::new(CLUSTER);
    identity.instance = Some(instance.name.to_owned());
    let mut options = Options::new(acceptor, identity);
    options.capacity = instance.sessions;
    let service = tower::service_fn(move |_req: Request<Incoming>| {
        let instance = Arc::clone(&instance);
        async move { Ok::<_, Infallible>(instance.handle().await) }
    });
    sluice_sdk::serve(options, service).context("starting a demo instance")
}

/// Without `--load`: explains what to try and waits for a signal. With it: runs the load.
async fn serve_or_load(
    args: &DemoArgs,
    (listen, admin): (SocketAddr, Option<SocketAddr>),
    cluster: &ReverseCluster,
    instances: &[Arc<Instance>],
) -> anyhow::Result<()> {
    if args.load {
        let step = Duration::from_secs(args.step_seconds);
        return crate::load::run(listen, cluster, instances, step).await;
    }
    print_banner(listen, admin, instances);
    std::future::pending::<()>().await;
    Ok(())
}

/// One line that says every instance registered (tests wait for it).
fn print_ready(instances: &[Arc<Instance>]) {
    let each: Vec<_> = instances
        .iter()
        .map(|i| format!("{}={}", i.name, i.sessions))
        .collect();
    println!("ready sessions {}", each.join(" "));
}

fn print_banner(listen: SocketAddr, admin: Option<SocketAddr>, instances: &[Arc<Instance>]) {
    let declared: usize = instances.iter().map(|i| i.sessions).sum();
    println!();
    println!("Sluice is proxying http://{listen}/ to the reverse cluster `{CLUSTER}`.");
    println!("Its instances dialed in; the proxy never connects to them. Each request");
    println!("leases one session exclusively and works ~{WORK:?}, so at most {declared}");
    println!("requests run at once; the rest wait in the admission queue ({QUEUE_MAX} deep,");
    println!("{QUEUE_TIMEOUT} timeout) or get 503 with Retry-After.");
    println!();
    println!("Try:");
    println!("  curl -i http://{listen}/");
    println!("  for i in $(seq 20); do curl -s http://{listen}/ & done; wait");
    println!(
        "  sluice demo --load --listen 127.0.0.1:0 --acceptor 127.0.0.1:0 --admin 127.0.0.1:0"
    );
    println!("                          # a second demo on free ports under an open-loop load,");
    println!(
        "                          # 0.5x to 10x capacity (stop this one to use the defaults)"
    );
    if let Some(admin) = admin {
        println!("  sluice ctl --admin http://{admin} status    # sessions, queues; curl http://{admin}/metrics");
        println!(
            "  open http://{admin}/ui    # the dashboard in a browser: sessions, queues, live"
        );
    }
    println!();
    println!("Ctrl-C stops the demo.");
}

/// Drains the instances (bounded), then stops the proxy and waits for it.
async fn stop_all(
    sessions: Vec<Sessions>,
    halt: oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
) {
    for s in sessions {
        match tokio::time::timeout(DRAIN_TIMEOUT, s.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "a demo instance could not drain"),
            Err(_) => tracing::warn!("a demo instance did not drain in time"),
        }
    }
    let _ = halt.send(());
    if let Err(e) = server.await {
        tracing::warn!(error = %e, "the proxy task failed");
    }
}
