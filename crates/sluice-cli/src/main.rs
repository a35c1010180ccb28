//! The `sluice` command: a thin shell over the `sluice` library.
//!
//! `run` and `check` live here; `demo` (and its `--load` generator) and `ctl` in their own
//! modules.

mod ctl;
mod demo;
mod demo_service;
mod load;
mod notify;
mod reload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use sluice::config::{self, Config};
use sluice::os_signal;
use tracing::info;

/// Sluice: a reverse proxy whose backends dial in and declare their capacity.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SLUICE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// The flag's value, for a successor started with the same one.
    fn as_arg(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy (with no -c: an embedded default that needs nothing else running).
    Run {
        /// Configuration file (TOML).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Worker threads (overrides `[runtime] workers`; default: one per CPU).
        #[arg(long)]
        workers: Option<usize>,
        /// Hot restart: take over the listening sockets and idle sessions of the Sluice
        /// running with the same `[runtime] upgrade_socket`, which then drains and exits.
        #[arg(long)]
        upgrade: bool,
    },
    /// Run a standalone acceptor: services register here ([acceptor]); Sluice processes
    /// whose reverse clusters set `handoff` draw the sessions over [handoff]'s socket.
    Acceptor {
        /// Configuration file (TOML) with [acceptor], [handoff] and the reverse clusters.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate a configuration file and exit (0: valid, 2: invalid).
    ///
    /// Reads every file the configuration names and every `env:`/`file:` secret, as `run`
    /// would: `nginx -t` and `haproxy -c` do the same. Where the secrets are not (CI, a build
    /// host), `--no-secrets` checks the rest.
    Check {
        /// Configuration file (TOML).
        #[arg(short, long)]
        config: PathBuf,
        /// Do not read `env:NAME`/`file:PATH` secrets: check only that each reference is well
        /// formed, so a config validates without its secrets. TLS certificate and key files
        /// and htpasswd files are still read.
        #[arg(long)]
        no_secrets: bool,
    },
    /// Start a proxy, its acceptor and two demo services that dial in; print what to try.
    Demo(demo::DemoArgs),
    /// Ask a running Sluice's admin API ([admin]) for its status, drain an instance, add or
    /// remove an endpoint.
    Ctl(ctl::CtlArgs),
}

/// mimalloc instead of glibc's malloc: the request path allocates and frees small objects
/// (header maps, request state, channel slots) on every request; glibc's malloc and free took
/// about 6% of the proxy's CPU, and the switch cut CPU per request by 5% (issue 7's note).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Under `demo --load` the overload steps refuse requests on purpose: their warnings would
    // land in the table. RUST_LOG still decides when it is set.
    let default_filter = match &cli.command {
        Command::Demo(args) if args.load => "error",
        _ => "info",
    };
    init_logging(cli.log_format, default_filter);
    if matches!(
        cli.command,
        Command::Run { .. } | Command::Acceptor { .. } | Command::Demo(_)
    ) {
        raise_open_files_limit();
    }
    match cli.command {
        Command::Check { config, no_secrets } => check(&config, no_secrets),
        Command::Run {
            config,
            workers,
            upgrade,
        } => exit(run(config, workers, upgrade, cli.log_format)),
        Command::Demo(args) => exit(demo::run(args)),
        Command::Acceptor { config } => exit(acceptor(config)),
        Command::Ctl(args) => ctl::run(args),
    }
}

/// Raises the soft limit on open files to the hard one, as Go's runtime and HAProxy do: every
/// client connection, upstream connection and session is a descriptor, and the soft limit
/// many systems start a shell with (1024) is far below what a proxy holds at once. Out of
/// them, accepts fail and clients are shed; `demo --load`, whose client and proxy share one
/// process, turned its 5x step into connection errors and halved goodput (issue 48, item 7).
/// The hard limit is what an operator allows (systemd's `LimitNOFILE`); it is not raised.
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    // An unlimited hard limit is not a value the soft one may take (the kernel's nr_open
    // caps it): left as it is.
    let (Some(soft), Some(hard)) = (limit.current, limit.maximum) else {
        return;
    };
    if soft >= hard {
        return;
    }
    let raised = Rlimit {
        current: Some(hard),
        maximum: Some(hard),
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open files limit"),
        Err(e) => tracing::debug!(soft, hard, error = %e, "could not raise the open files limit"),
    }
}

fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each once: a cause whose text its effect already shows (errors
/// that print their source, as `thiserror`'s `{source}` does) is not repeated.
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Colour only for a person at a terminal: never in files or pipes, nor with NO_COLOR set.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn check(path: &std::path::Path, no_secrets: bool) -> ExitCode {
    let loaded = match no_secrets {
        true => config::load_file_without_secrets(path),
        false => config::load_file(path),
    };
    match loaded {
        Ok(c) => {
            let mut counts = vec![
                plural(c.listeners.len(), "listener"),
                plural(c.routes.len(), "route"),
                plural(c.clusters.len(), "cluster"),
            ];
            if !c.relays.is_empty() {
                counts.push(plural(c.relays.len(), "relay"));
            }
            // Said on the line a CI log shows, so a green check is not read as "secrets present".
            let unread = if no_secrets { "; secrets not read" } else { "" };
            println!("{}: ok ({}{unread})", path.display(), counts.join(", "));
            if c.routes.is_empty() && !c.listeners.is_empty() {
                eprintln!(
                    "{}: warning: no [[route]]: every request to its listeners is answered 404",
                    path.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// `1 route`, `2 routes`.
fn plural(n: usize, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

fn load(path: Option<PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => config::load_file(&p).map_err(|e| anyhow::anyhow!("{e}")),
        None => {
            info!("no -c FILE given: running the embedded default config (a direct-response route on 127.0.0.1:8080)");
            Ok(config::embedded_default())
        }
    }
}

fn run(
    path: Option<PathBuf>,
    workers: Option<usize>,
    upgrade: bool,
    log_format: LogFormat,
) -> anyhow::Result<()> {
    let config = load(path.clone())?;
    // A file with only [[relay]]s is served here too.
    if config.listeners.is_empty() && config.relays.is_empty() {
        anyhow::bail!(
            "{} has no [[listener]]: it is a standalone acceptor's file; run it with `sluice acceptor -c FILE`",
            config.source
        );
    }
    let workers = workers.or(config.runtime.workers);
    let runtime = build_runtime(workers)?;
    runtime.block_on(async {
        // Installed before binding, so a signal during start-up drains instead of killing.
        let stop = stopping(os_signal());
        let inherited = match upgrade {
            true => Some(take_over(&config).await?),
            false => None,
        };
        let mut proxy = sluice::Proxy::bind_inheriting(&config, inherited).await?;
        let upgraded = proxy.upgraded();
        let successor_pid = Arc::new(AtomicU32::new(0));
        if let (Some(path), Some(_)) = (&path, &config.runtime.upgrade_socket) {
            let successor = reload::Successor {
                config: path.clone(),
                workers,
                log_format: log_format.as_arg(),
                in_place: proxy.in_place(),
                started: Arc::clone(&successor_pid),
                busy: Arc::default(),
            };
            let hook = successor.hook(proxy.upgraded());
            proxy = proxy.with_reload(hook.clone());
            tokio::spawn(reload::on_sighup(hook));
        } else {
            let why = match path {
                None => "sluice runs its embedded configuration; start it with -c FILE and [runtime] upgrade_socket",
                Some(_) => "reloading needs [runtime] upgrade_socket in the configuration (a reload is a hot restart: the successor is a child of this process)",
            };
            tokio::spawn(reload::explain_sighup(why));
        }
        info!(source = %config.source, "sluice started; SIGTERM or SIGINT drains and exits");
        match upgrade {
            true => notify::successor_ready(),
            false => notify::ready(),
        }
        proxy.run_until(stop).await;
        // Handed over: the successor is the service's main process, even if this one drained
        // before the successor could say so itself.
        match successor_pid.load(Ordering::SeqCst) {
            pid if pid != 0 && *upgraded.borrow() => notify::handed_to(pid),
            _ => {}
        }
        info!("sluice stopped");
        Ok(())
    })
}

/// `signal`, then `STOPPING=1` to the service manager.
async fn stopping(signal: impl std::future::Future<Output = ()>) {
    signal.await;
    notify::stopping();
}

fn acceptor(path: PathBuf) -> anyhow::Result<()> {
    let config = load(Some(path))?;
    let runtime = build_runtime(config.runtime.workers)?;
    runtime.block_on(async {
        let stop = stopping(os_signal());
        let acceptor = sluice::Standalone::bind(&config).await?;
        info!(source = %config.source, "standalone acceptor started; SIGTERM or SIGINT stops it");
        notify::ready();
        acceptor.run_until(stop).await;
        Ok(())
    })
}

/// Connects to the running Sluice's upgrade socket and takes its listening sockets.
async fn take_over(config: &Config) -> anyhow::Result<sluice::Inherited> {
    let Some(path) = &config.runtime.upgrade_socket else {
        anyhow::bail!(
            "--upgrade needs `upgrade_socket` under [runtime] in {} (the running Sluice must have it too)",
            config.source
        );
    };
    let inherited = sluice::Inherited::take_over(path)
        .await
        .with_context(|| {
            format!(
                "taking over from the Sluice listening on {} (is one running with this `upgrade_socket`, as this user?)",
                path.display()
            )
        })?;
    Ok(inherited)
}

fn build_runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if let Some(n) = workers.filter(|n| *n > 1) {
        builder.worker_threads(n);
    }
    builder
        .enable_all()
        .build()
        .context("starting the async runtime")
}
