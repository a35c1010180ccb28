//! bench-pingora: a minimal HTTP/1.1 reverse proxy built on Cloudflare's
//! `pingora`, used ONLY as a benchmark comparator for Sluice.
//!
//! Every request is proxied over plain HTTP/1.1 (no TLS, no cache, no
//! per-request logging) to one fixed upstream, reusing upstream connections
//! from pingora's keep-alive pool.
//!
//! Usage:
//!   bench-pingora --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT
//!                 [--threads 1] [--keepalive 256] [--no-work-stealing]

use std::net::SocketAddr;
use std::process::exit;

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

const USAGE: &str = "usage: bench-pingora --listen ADDR:PORT --upstream ADDR:PORT \
[--threads N (default 1)] [--keepalive N (default 256)] [--no-work-stealing]";

/// Parsed command line.
struct Args {
    listen: SocketAddr,
    upstream: SocketAddr,
    threads: usize,
    keepalive: usize,
    work_stealing: bool,
}

/// Print an error plus usage and exit with status 2 (bad invocation).
fn fail(msg: &str) -> ! {
    eprintln!("bench-pingora: {msg}\n{USAGE}");
    exit(2)
}

/// Hand-rolled flag parsing: every value flag takes exactly one argument.
fn parse_args() -> Args {
    let mut listen = None;
    let mut upstream = None;
    let mut threads = 1usize;
    let mut keepalive = 256usize;
    let mut work_stealing = true;

    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            exit(0);
        }
        if flag == "--no-work-stealing" {
            work_stealing = false;
            continue;
        }
        if !["--listen", "--upstream", "--threads", "--keepalive"].contains(&flag.as_str()) {
            fail(&format!("unknown flag {flag:?}"));
        }
        let Some(value) = it.next() else {
            fail(&format!("missing value for {flag}"))
        };
        let addr = |v: &str| -> SocketAddr {
            v.parse()
                .unwrap_or_else(|e| fail(&format!("{flag}: invalid socket address {v:?}: {e}")))
        };
        let count = |v: &str| -> usize {
            match v.parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => fail(&format!("{flag}: expected a positive integer, got {v:?}")),
            }
        };
        match flag.as_str() {
            "--listen" => listen = Some(addr(&value)),
            "--upstream" => upstream = Some(addr(&value)),
            "--threads" => threads = count(&value),
            "--keepalive" => keepalive = count(&value),
            _ => unreachable!("flag checked above"),
        }
    }

    Args {
        listen: listen.unwrap_or_else(|| fail("--listen is required")),
        upstream: upstream.unwrap_or_else(|| fail("--upstream is required")),
        threads,
        keepalive,
        work_stealing,
    }
}

/// The proxy logic: every request goes to the same plain-HTTP upstream.
struct Forward {
    /// Template peer, cloned per request. Its hash (address, no TLS) is the
    /// key pingora uses for the upstream keep-alive pool, so all requests
    /// share one pool.
    peer: HttpPeer,
}

#[async_trait]
impl ProxyHttp for Forward {
    type CTX = ();
    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _s: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }

    // No per-request access log: the default `logging` hook is a no-op.
}

fn main() {
    let args = parse_args();

    // Only warnings and errors; RUST_LOG still overrides for debugging.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();

    // Keep pingora's scratch files out of the shared /tmp defaults so that
    // several instances can run side by side. Neither is written unless
    // daemonising / upgrading, which we never do.
    let tmp = std::env::temp_dir();
    let pid = std::process::id();
    let conf = ServerConf {
        threads: args.threads,
        work_stealing: args.work_stealing,
        upstream_keepalive_pool_size: args.keepalive,
        // SIGTERM => graceful terminate; exit (almost) immediately instead
        // of pingora's default 300 s grace period + 5 s runtime drain.
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        pid_file: tmp.join(format!("bench-pingora-{pid}.pid")).display().to_string(),
        upgrade_sock: tmp.join(format!("bench-pingora-{pid}.sock")).display().to_string(),
        ..ServerConf::default()
    };

    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let forward = Forward {
        // tls = false, empty SNI: plain HTTP/1.1 to the upstream.
        peer: HttpPeer::new(args.upstream, false, String::new()),
    };
    let mut proxy = http_proxy_service(&server.configuration, forward);
    proxy.threads = Some(args.threads);
    proxy.add_tcp(&args.listen.to_string());
    server.add_service(proxy);

    eprintln!(
        "bench-pingora: listening on {} -> upstream {} (threads={}, keepalive={}, work_stealing={})",
        args.listen, args.upstream, args.threads, args.keepalive, args.work_stealing
    );
    server.run_forever();
}
