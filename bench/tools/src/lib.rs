//! The programs the benchmark harness (`bench/*.py`) runs around the proxies it compares, so
//! that every target sees the same backend and the same load:
//!
//! * `bench-backend`: the one backend, listening or dialing in to Sluice as sessions.
//! * `openloop`: an open-loop load generator (a fixed offered rate, latency from each
//!   request's due time), where `wrk` is closed-loop.
//! * `slowclients`: clients that read responses slowly.
//! * `tlsload`: new TLS connections, full or resumed handshakes, one request each.
//! * `h3load`: HTTP/3 load (h2load's shape), or idle HTTP/3 connections.
//!
//! Each prints JSON (or a readiness line) on stdout for the harness to parse.
//!
//! # Layout
//! * [`backend`]: the request handler, its counters and the `/stats` service.
//! * [`openloop`]: the schedule, the connection pool and the report.
//! * [`slowclients`]: the slow readers.
//! * [`tlsload`]: the TLS connection loop.
//! * [`h3load`]: the HTTP/3 request loops and idle connections.
//! * [`response`]: where an HTTP/1.1 response ends, for both clients.
//! * [`target`]: parsing the `http://` URL the clients load.
//! * [`summary`]: latency percentiles.

pub mod backend;
pub mod h3load;
pub mod openloop;
pub mod response;
pub mod slowclients;
pub mod summary;
pub mod target;
pub mod tlsload;

/// Builds the Tokio runtime the programs run on: one thread (the harness pins it with
/// `taskset`) unless `threads` is more than 1.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if threads > 1 {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build()
}

/// The exit of every program here: an error is printed as one line with its causes (whatever
/// `RUST_BACKTRACE` says) and exits 1.
pub fn exit(program: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints `value` as one line of JSON on stdout and flushes it.
pub fn print_json<T: serde::Serialize>(value: &T) -> std::io::Result<()> {
    say(&serde_json::to_string(value)?)
}

/// Prints one whole line on stdout and flushes it, so a harness reading a pipe sees it now.
pub fn say(line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}
