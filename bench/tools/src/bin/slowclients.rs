//! `slowclients --url http://HOST:PORT/path --duration S [--clients N]
//! [--read-rate BYTES_PER_SEC] [--rcvbuf BYTES]`: keeps N slow readers busy for S seconds and
//! prints one JSON report (see `sluice_bench::slowclients::Report`).

use std::process::ExitCode;

use clap::Parser;

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
    let report = rt.block_on(sluice_bench::slowclients::run(&cli.config))?;
    sluice_bench::print_json(&report)?;
    Ok(())
}
