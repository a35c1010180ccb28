//! A framework user's own route feature ([`sluice::RouteFeature`], put on a route with
//! `Route::with_feature`): its hooks run on every transport, and a transport that does not
//! drive a hook it uses hands its requests to one that does (issue 49: eligibility fails
//! closed). A feature that says nothing of its hooks is taken to use them all, and is served
//! by hyper's path; one that only refuses is served by the HTTP/1 fast path too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::{read_to_close, Backend};

use std::sync::Arc;

use sluice::route_feature::{Asked, Fields, Hooks, Verdict};
use sluice::{Metrics, ProxyError, ProxyService, Route, RouteFeature, RouteTable, StaticCluster};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Lets through only requests with `x-key: open`; `declared` says it only refuses.
#[derive(Debug)]
struct KeyCheck {
    declared: bool,
}

impl RouteFeature for KeyCheck {
    fn name(&self) -> &'static str {
        "key_check"
    }

    fn hooks(&self) -> Hooks {
        match self.declared {
            true => Hooks::REFUSE,
            false => Hooks::ALL,
        }
    }

    fn admit<'a>(&'a self, asked: &Asked<'a>) -> Verdict<'a> {
        match asked.fields.first("x-key") {
            Some(b"open") => Verdict::Pass,
            _ => Verdict::Refuse(ProxyError::BadRequest("no key")),
        }
    }
}

/// A server with the fast path in front of `backend`, its one route carrying `KeyCheck`.
async fn serve(
    backend: &Backend,
    declared: bool,
) -> (std::net::SocketAddr, Arc<Metrics>, sluice::Shutdown) {
    let cluster = StaticCluster::new("backend", [backend.addr], Default::default()).unwrap();
    let route = Route::new("all", sluice::Target::Upstream(cluster.into()))
        .with_feature(Arc::new(KeyCheck { declared }));
    let mut table = RouteTable::new();
    table.push(sluice::Matcher::any(), Arc::new(route));
    let metrics = Arc::new(Metrics::new());
    let proxy = ProxyService::new(table).with_metrics(Arc::clone(&metrics));
    let server = sluice::Server::bind("features", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .with_fast_path(Arc::new(proxy.fast_path()));
    let addr = server.local_addr().unwrap();
    let shutdown = sluice::Shutdown::new();
    let signal = shutdown.signal();
    tokio::spawn(server.serve(proxy, signal, std::time::Duration::from_secs(1)));
    (addr, metrics, shutdown)
}

/// A request without the key, then one with it, each on a connection of its own (a 400
/// closes its connection); what came back.
async fn ask(addr: std::net::SocketAddr) -> String {
    let mut raw = String::new();
    for key in ["", "x-key: open\r\n"] {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET /1 HTTP/1.1\r\nHost: a\r\n{key}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        raw += &read_to_close(&mut stream).await;
    }
    raw
}

fn counter(metrics: &Metrics, series: &str) -> u64 {
    let text = metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether the fast path is on for a server that takes it (the test command's second run
/// turns it off everywhere).
fn fast_path_on() -> bool {
    std::env::var("SLUICE_FAST_PATH").as_deref() != Ok("0")
}

fn statuses(raw: &str) -> Vec<&str> {
    raw.split("HTTP/1.1 ").skip(1).map(|r| &r[..3]).collect()
}

#[tokio::test]
async fn a_feature_that_does_not_say_its_hooks_is_enforced_by_hyper() {
    let backend = Backend::start("b").await;
    let (addr, metrics, _shutdown) = serve(&backend, false).await;
    let raw = ask(addr).await;
    assert_eq!(statuses(&raw), ["400", "200"], "{raw}");
    assert!(raw.ends_with("b /1"), "{raw}");
    // With the fast path off (the test command's second run) nothing is handed off.
    let route = "sluice_http1_fast_path_handoffs_total{reason=\"route\"}";
    let handed_off = counter(&metrics, route) >= 1;
    assert_eq!(handed_off, fast_path_on(), "{}", metrics.render());
    assert_eq!(
        counter(&metrics, "sluice_http1_fast_path_requests_total"),
        0
    );
}

#[tokio::test]
async fn a_feature_that_only_refuses_is_enforced_on_the_fast_path_too() {
    let backend = Backend::start("b").await;
    let (addr, metrics, _shutdown) = serve(&backend, true).await;
    let raw = ask(addr).await;
    assert_eq!(statuses(&raw), ["400", "200"], "{raw}");
    assert!(raw.ends_with("b /1"), "{raw}");
    let served = counter(&metrics, "sluice_http1_fast_path_requests_total");
    let expected = if fast_path_on() { 2 } else { 0 };
    assert_eq!(served, expected, "{}", metrics.render());
}
