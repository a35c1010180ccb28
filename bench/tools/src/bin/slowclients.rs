//! `slowclients --url http://HOST:PORT/path --duration S [--clients N]
//! [--read-rate BYTES_PER_SEC] [--rcvbuf BYTES]`: keeps N slow readers busy for S seconds and
//! prints one JSON report (see `sluice_bench::slowclients::Report`). SIGTERM ends the run early,
//! with the report of what it counted so far.

use std::process::ExitCode;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

/// Clients that read HTTP/1.1 responses slowly.
#[derive(Debug, Parser)]
#[command(name = "slowclients")]
struct Cli {
    #[command(flatten)]
    config: sluice_bench::slowclients::Config,
}

fn main() -> ExitCode {
    sluice_bench::exit("slowclients", start(Cli::parse()))
}

fn start(cli: Cli) -> anyhow::Result<()> {
    let rt = sluice_bench::runtime(1)?;
    let report = rt.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let stop = async move {
            term.recv().await;
        };
        sluice_bench::slowclients::run(&cli.config, stop).await
    })?;
    sluice_bench::print_json(&report)?;
    Ok(())
}
