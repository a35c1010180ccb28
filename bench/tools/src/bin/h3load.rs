//! `h3load --addr HOST:PORT --ca PEM [--connections N] [--streams M] [--seconds S]
//! [--warmup W] [--path P] [--mode load|idle]`: HTTP/3 load, or idle HTTP/3 connections, and
//! JSON reports (see `sluice_bench::h3load`).

use std::process::ExitCode;

use clap::Parser;
use sluice_bench::h3load::Mode;

/// HTTP/3 requests as fast as the server answers them, or idle HTTP/3 connections.
#[derive(Debug, Parser)]
#[command(name = "h3load")]
struct Cli {
    #[command(flatten)]
    config: sluice_bench::h3load::Config,
}

fn main() -> ExitCode {
    sluice_bench::exit("h3load", start(Cli::parse()))
}

fn start(cli: Cli) -> anyhow::Result<()> {
    let rt = sluice_bench::runtime(1)?;
    match cli.config.mode {
        Mode::Load => {
            let report = rt.block_on(sluice_bench::h3load::load(&cli.config))?;
            sluice_bench::print_json(&report)?;
        }
        Mode::Idle => rt.block_on(sluice_bench::h3load::idle(&cli.config))?,
    }
    Ok(())
}
