//! Plumbing shared by the Sluice examples, kept out of them so that each example shows only
//! the framework API: a tiny flag parser, log setup, the `listening` line scripts wait for,
//! and demo backends so that every example runs on its own.
//!
//! The framework examples are `load_balance.rs`, `host_routing.rs` and `dynamic_upstreams.rs`
//! next to this file; `hello_service.rs` is a service that listens or dials in through the SDK
//! (the benchmarks use it). `README.md` says how to run them.

use std::convert::Infallible;
use std::fmt;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use sluice::{Group, ProxyBody, Server};
use tracing_subscriber::EnvFilter;

/// How long each server lets in-flight requests finish on shutdown.
pub const GRACE: Duration = Duration::from_secs(5);

/// A command line the example does not understand.
pub struct ArgError(String);

// `main` returning `Err` prints the error with `Debug`; show the message, not the struct.
impl fmt::Debug for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArgError {}

/// Command-line flags as `--name value` pairs; a flag may be repeated.
#[derive(Debug, Default)]
pub struct Args {
    pairs: Vec<(String, String)>,
}

impl Args {
    /// Parses the process arguments, accepting only the flags named in `known` (without `--`).
    pub fn from_env(known: &[&str]) -> Result<Self, ArgError> {
        Self::parse(std::env::args().skip(1), known)
    }

    /// Parses `--name value` pairs, accepting only the flags named in `known`.
    pub fn parse(args: impl IntoIterator<Item = String>, known: &[&str]) -> Result<Self, ArgError> {
        let mut args = args.into_iter();
        let mut pairs = Vec::new();
        while let Some(arg) = args.next() {
            let name = arg
                .strip_prefix("--")
                .filter(|name| known.contains(name))
                .ok_or_else(|| {
                    ArgError(format!(
                        "unexpected {arg:?}; flags: --{}",
                        known.join(", --")
                    ))
                })?;
            let value = args
                .next()
                .ok_or_else(|| ArgError(format!("--{name} needs a value")))?;
            pairs.push((name.to_owned(), value));
        }
        Ok(Self { pairs })
    }

    /// The last `--name` as a socket address, or `default` when it is not given.
    pub fn addr(&self, name: &str, default: &str) -> Result<SocketAddr, ArgError> {
        parse_addr(name, self.values(name).last().unwrap_or(default))
    }

    /// Every `--name`, in order, as socket addresses (empty when it is not given).
    pub fn addrs(&self, name: &str) -> Result<Vec<SocketAddr>, ArgError> {
        self.values(name).map(|v| parse_addr(name, v)).collect()
    }

    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.pairs
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn parse_addr(name: &str, value: &str) -> Result<SocketAddr, ArgError> {
    value
        .parse()
        .map_err(|_| ArgError(format!("--{name} {value:?} is not IP:PORT")))
}

/// Sends logs to stderr, filtered by `RUST_LOG` (default `info`); stdout carries only the
/// `listening` lines.
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_env_filter(filter)
        .init();
}

/// Binds a plaintext server and prints `listening NAME=IP:PORT` on stdout: the line a script
/// (or the tests) waits for before sending traffic, since `ADDR` may have port 0.
pub async fn bind(name: &str, addr: SocketAddr) -> io::Result<Server> {
    let server = Server::bind(name, addr).await?;
    writeln!(io::stdout(), "listening {name}={}", server.local_addr()?)?;
    Ok(server)
}

/// `given` when it is not empty; otherwise starts one demo backend per name in `group` and
/// returns their addresses.
pub async fn upstreams_or_demo(
    group: &mut Group,
    given: Vec<SocketAddr>,
    names: &[&str],
) -> io::Result<Vec<SocketAddr>> {
    if !given.is_empty() {
        return Ok(given);
    }
    let mut addrs = Vec::with_capacity(names.len());
    for name in names {
        addrs.push(demo_backend(group, name).await?);
    }
    Ok(addrs)
}

/// Starts a backend on `127.0.0.1:0` in `group` that answers every request with `name` and a
/// newline; returns its address.
pub async fn demo_backend(group: &mut Group, name: &str) -> io::Result<SocketAddr> {
    let server = Server::bind(name, SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = server.local_addr()?;
    let body = format!("{name}\n");
    let service = tower::service_fn(move |_req: Request<Incoming>| {
        let res = Response::new(ProxyBody::full(body.clone()));
        async move { Ok::<_, Infallible>(res) }
    });
    group.add(server, service, GRACE);
    tracing::info!(backend = name, %addr, "started demo backend");
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::{ArgError, Args};

    fn parse(args: &[&str]) -> Result<Args, ArgError> {
        let args = args.iter().map(|a| (*a).to_owned());
        Args::parse(args, &["listen", "upstream"])
    }

    #[test]
    fn repeated_flags_keep_their_order_and_absent_ones_take_the_default() {
        let args = parse(&["--upstream", "127.0.0.1:1", "--upstream", "[::1]:2"]).expect("valid");
        let upstreams = args.addrs("upstream").expect("addresses");
        let expected = ["127.0.0.1:1", "[::1]:2"].map(|a| a.parse().expect("addr"));
        assert_eq!(upstreams, expected);
        let listen = args.addr("listen", "127.0.0.1:8080").expect("default");
        assert_eq!(listen, "127.0.0.1:8080".parse().expect("addr"));
    }

    #[test]
    fn unknown_flags_missing_values_and_bad_addresses_are_refused() {
        let unknown = parse(&["--port", "80"]).expect_err("unknown flag");
        assert_eq!(
            unknown.to_string(),
            r#"unexpected "--port"; flags: --listen, --upstream"#
        );
        let missing = parse(&["--listen"]).expect_err("missing value");
        assert_eq!(missing.to_string(), "--listen needs a value");
        let args = parse(&["--listen", "localhost:80"]).expect("parsed lazily");
        let bad = args
            .addr("listen", "127.0.0.1:8080")
            .expect_err("not an IP");
        assert_eq!(bad.to_string(), r#"--listen "localhost:80" is not IP:PORT"#);
    }
}
