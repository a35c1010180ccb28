//! `tlsload --addr HOST:PORT --ca PEM [--name NAME] [--connections N] [--seconds S]
//! [--mode full|resumed]`: new TLS connections, one request each, and one JSON report (see
//! `sluice_bench::tlsload::Report`).

use std::process::ExitCode;

use clap::Parser;

/// New TLS connections as fast as the proxy takes them.
#[derive(Debug, Parser)]
#[command(name = "tlsload")]
struct Cli {
    #[command(flatten)]
    config: sluice_bench::tlsload::Config,
}

fn main() -> ExitCode {
    sluice_bench::exit("tlsload", start(Cli::parse()))
}

fn start(cli: Cli) -> anyhow::Result<()> {
    let rt = sluice_bench::runtime(1)?;
    let report = rt.block_on(sluice_bench::tlsload::run(&cli.config))?;
    sluice_bench::print_json(&report)?;
    Ok(())
}
