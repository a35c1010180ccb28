//! `openloop --url http://HOST:PORT/path --rate R --duration S [--max-conns N]
//! [--timeout-ms T] [--threads N] [--warmup S]`: offers R requests per second for S seconds
//! and prints one JSON report (see `sluice_bench::openloop::Report`).

use std::process::ExitCode;

use clap::Parser;

/// Open-loop HTTP/1.1 load: a fixed rate, latency from each request's due time.
#[derive(Debug, Parser)]
#[command(name = "openloop")]
struct Cli {
    #[command(flatten)]
    config: sluice_bench::openloop::Config,
    /// Tokio worker threads (1: a current-thread runtime).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
}

fn main() -> ExitCode {
    sluice_bench::exit("openloop", start(Cli::parse()))
}

fn start(cli: Cli) -> anyhow::Result<()> {
    let rt = sluice_bench::runtime(cli.threads.into())?;
    let report = rt.block_on(sluice_bench::openloop::run(&cli.config))?;
    sluice_bench::print_json(&report)?;
    Ok(())
}
