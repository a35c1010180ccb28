//! The HTTP/1 fast path on a real listener: which requests it serves, how a connection moves to
//! hyper at the first request it leaves (answers still in order, nothing lost), and the
//! listener's `fast_path = false`. What it sends and answers is held to the hyper path's by
//! `h1_differential.rs` and `h1_responses.rs`; here the counters say which path served.
//!
//! The test command runs this crate's tests a second time with `SLUICE_FAST_PATH=0` (every
//! listener's fast path off); these tests then expect hyper to have served everything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::Path;
use std::sync::Arc;

use sluice::Metrics;
use sluice::Proxy;
use support::{read_to_close, Backend};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A proxy in front of `backend` with the listener's `fast_path` as `fast_path` says; its
/// address and metrics.
async fn proxy(backend: &Backend, fast_path: bool) -> (std::net::SocketAddr, Arc<Metrics>) {
    let text = format!(
        "[[listener]]\nname = \"plain\"\nlisten = \"127.0.0.1:0\"\nfast_path = {fast_path}\n\
         [[route]]\nname = \"all\"\ncluster = \"backend\"\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        backend.addr
    );
    let config = sluice::config::parse_str(&text, "fast.toml", Path::new(".")).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let (addr, metrics) = (proxy.local_addrs()[0].1, Arc::clone(proxy.metrics()));
    tokio::spawn(proxy.run_until(std::future::pending()));
    (addr, metrics)
}

/// Whether the fast path is on for a listener that asks for it (the test command's second run
/// turns it off everywhere).
fn fast_path_on() -> bool {
    std::env::var("SLUICE_FAST_PATH").as_deref() != Ok("0")
}

/// Sends `requests` on one connection, then reads until the proxy closes it.
async fn pipeline(addr: std::net::SocketAddr, requests: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(requests.as_bytes()).await.unwrap();
    read_to_close(&mut stream).await
}

/// The value of a metric line that starts with `series` (0 when there is none).
fn counter(metrics: &Metrics, series: &str) -> u64 {
    let text = metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// The bodies of the responses in `raw`, in order (each answer of the backend is `b <path>`).
fn bodies(raw: &str) -> Vec<&str> {
    raw.split("HTTP/1.1 ")
        .skip(1)
        .map(|r| r.split_once("\r\n\r\n").map_or("", |(_, body)| body))
        .collect()
}

#[tokio::test]
async fn plain_requests_to_a_static_cluster_take_the_fast_path() {
    let backend = Backend::start("b").await;
    let (addr, metrics) = proxy(&backend, true).await;
    let raw = pipeline(
        addr,
        "GET /one HTTP/1.1\r\nHost: x\r\n\r\n\
         POST /two HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
         GET /three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(bodies(&raw), ["b /one", "b /two", "b /three"], "{raw:?}");
    assert_eq!(backend.requests(), 3);
    let taken = if fast_path_on() { 3 } else { 0 };
    assert_eq!(
        counter(&metrics, "sluice_http1_fast_path_requests_total"),
        taken
    );
    assert!(!metrics
        .render()
        .contains("sluice_http1_fast_path_handoffs_total{"));
}

#[tokio::test]
async fn a_connection_moves_to_hyper_at_the_first_request_the_fast_path_leaves() {
    let backend = Backend::start("b").await;
    let (addr, metrics) = proxy(&backend, true).await;
    // The chunked body is hyper's to relay; the request after it stays with hyper.
    let raw = pipeline(
        addr,
        "GET /one HTTP/1.1\r\nHost: x\r\n\r\n\
         POST /two HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
         GET /three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(bodies(&raw), ["b /one", "b /two", "b /three"], "{raw:?}");
    let (taken, handed) = if fast_path_on() { (1, 1) } else { (0, 0) };
    assert_eq!(
        counter(&metrics, "sluice_http1_fast_path_requests_total"),
        taken
    );
    let reason = "sluice_http1_fast_path_handoffs_total{reason=\"body\"}";
    assert_eq!(counter(&metrics, reason), handed);
}

#[tokio::test]
async fn a_request_the_parser_defers_is_counted_with_its_reason() {
    let backend = Backend::start("b").await;
    let (addr, metrics) = proxy(&backend, true).await;
    let raw = pipeline(
        addr,
        "POST /wait HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\
         Connection: close\r\n\r\nok",
    )
    .await;
    assert!(raw.ends_with("b /wait"), "{raw:?}");
    let handed = u64::from(fast_path_on());
    let reason = "sluice_http1_fast_path_handoffs_total{reason=\"negotiation\"}";
    assert_eq!(counter(&metrics, reason), handed);
}

#[tokio::test]
async fn a_listener_with_the_fast_path_off_leaves_everything_to_hyper() {
    let backend = Backend::start("b").await;
    let (addr, metrics) = proxy(&backend, false).await;
    let raw = pipeline(
        addr,
        "GET /one HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(bodies(&raw), ["b /one"], "{raw:?}");
    let forced = std::env::var("SLUICE_FAST_PATH").as_deref() == Ok("1");
    let taken = u64::from(forced);
    assert_eq!(
        counter(&metrics, "sluice_http1_fast_path_requests_total"),
        taken
    );
}

/// A client that accepts trailers (`TE: trailers`) gets them from hyper's server, which
/// forwards an upstream's trailer fields; the fast path drops them, so it leaves such a request
/// to hyper.
#[tokio::test]
async fn a_request_that_accepts_trailers_is_left_to_hyper() {
    let backend = Backend::start("b").await;
    let (addr, metrics) = proxy(&backend, true).await;
    let raw = pipeline(
        addr,
        "GET /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(bodies(&raw), ["b /t"], "{raw:?}");
    let handed = u64::from(fast_path_on());
    let reason = "sluice_http1_fast_path_handoffs_total{reason=\"trailers\"}";
    assert_eq!(counter(&metrics, reason), handed);
    assert_eq!(
        counter(&metrics, "sluice_http1_fast_path_requests_total"),
        0
    );
}

/// Issue 30, item 2: a proxy service wrapped in a tower layer must see every request through
/// the layer. Given the proxy's fast path, a server serving the wrapped service leaves it off
/// (and says so), so the layer's header is on every answer.
#[tokio::test]
async fn a_layered_proxy_is_never_bypassed_by_the_fast_path() {
    use sluice::{ProxyService, Route, RouteTable, Server, StaticCluster};
    let backend = Backend::start("b").await;
    let cluster =
        StaticCluster::new("backend", [backend.addr], Default::default()).expect("a plain cluster");
    let mut table = RouteTable::new();
    table.push(sluice::Matcher::any(), Route::to_upstream("all", cluster));
    let proxy = ProxyService::new(table);
    let layered = tower::ServiceBuilder::new()
        .map_response(|mut res: http::Response<sluice::ProxyBody>| {
            res.headers_mut()
                .insert("x-layer", http::HeaderValue::from_static("seen"));
            res
        })
        .service(proxy.clone());
    let server = Server::bind("layered", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .with_fast_path(Arc::new(proxy.fast_path()));
    let addr = server.local_addr().unwrap();
    let shutdown = sluice::Shutdown::new();
    let signal = shutdown.signal();
    tokio::spawn(server.serve(layered, signal, std::time::Duration::from_secs(1)));
    let raw = pipeline(
        addr,
        "GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw.matches("x-layer: seen").count(), 2, "{raw}");
    assert_eq!(bodies(&raw), ["b /1", "b /2"]);
}

/// A proxy whose routes answer themselves (`direct_response`): a redirect naming the rewritten
/// path, a fixed answer with the route's response edits, and a 204; `fast_path` as it says.
async fn answering(fast_path: bool) -> (std::net::SocketAddr, Arc<Metrics>) {
    let text = format!(
        "[[listener]]\nname = \"plain\"\nlisten = \"127.0.0.1:0\"\nfast_path = {fast_path}\n\
         [[route]]\nname = \"moved\"\npath_prefix = \"/old/\"\n\
         rewrite = {{ regex = \"^/old/\", replace = \"/new/\" }}\n\
         direct_response = {{ status = 308, location = \"https://{{host}}{{uri}}\" }}\n\
         [[route]]\nname = \"tea\"\npath_prefix = \"/tea\"\n\
         response_headers = {{ set = {{ \"x-served-by\" = \"sluice\" }}, remove = [\"x-drop\"] }}\n\
         direct_response = {{ status = 418, body = \"short and stout\\n\", \
         headers = {{ \"content-type\" = \"text/plain\", \"x-drop\" = \"1\", \"x-kept\" = \"2\" }} }}\n\
         [[route]]\nname = \"empty\"\npath_prefix = \"/empty\"\ndirect_response = {{ status = 204 }}\n\
         [[route]]\nname = \"early\"\npath_prefix = \"/early\"\ndirect_response = {{ status = 103 }}\n\
         [[route]]\nname = \"odd\"\npath_prefix = \"/odd\"\n\
         direct_response = {{ status = 599, body = \"odd\\n\", \
         headers = {{ \"date\" = \"Thu, 01 Jan 2026 00:00:00 GMT\" }} }}\n"
    );
    let config = sluice::config::parse_str(&text, "fast.toml", Path::new(".")).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let (addr, metrics) = (proxy.local_addrs()[0].1, Arc::clone(proxy.metrics()));
    tokio::spawn(proxy.run_until(std::future::pending()));
    (addr, metrics)
}

/// `raw` with every `date` field's value blanked (the two paths answer a second apart at most).
fn dateless(raw: &str) -> String {
    raw.split("\r\n")
        .map(|line| match line.get(..6) {
            Some(name) if name.eq_ignore_ascii_case("date: ") => "date: -",
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// A route's own answer (a redirect, a fixed response, its answer to `HEAD`, one that closes)
/// is the fast path's to write, byte for byte as hyper's server writes it; a request with a
/// body, or for a status without one (204), is left to hyper.
#[tokio::test]
async fn a_routes_own_answer_is_written_as_hyper_writes_it() {
    let requests = "GET /old/a/b?c=d HTTP/1.1\r\nHost: a.example:8080\r\n\r\n\
                    HEAD /old/x HTTP/1.1\r\nHost: a.example\r\n\r\n\
                    HEAD /tea HTTP/1.1\r\nHost: a.example\r\n\r\n\
                    GET /tea HTTP/1.1\r\nHost: a.example\r\n\r\n\
                    POST /tea HTTP/1.1\r\nHost: a.example\r\nContent-Length: 2\r\n\r\nhi\
                    GET /tea HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n";
    let closing = "GET /tea HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n";
    let empty = "GET /empty HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n";
    // A status without a reason phrase, and a `Date` of the route's own.
    let odd = "GET /odd HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n";
    // An interim status, which hyper's server will not send as an answer.
    let early = "GET /early HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n";
    let (fast, metrics) = answering(true).await;
    let (hyper, _) = answering(false).await;
    for sent in [requests, closing, empty, odd, early] {
        let (got, want) = (pipeline(fast, sent).await, pipeline(hyper, sent).await);
        assert_eq!(dateless(&got), dateless(&want), "{sent:?}");
    }
    let got = pipeline(fast, requests).await;
    assert!(
        got.starts_with(
            "HTTP/1.1 308 Permanent Redirect\r\nlocation: https://a.example/new/a/b?c=d\r\n"
        ),
        "{got:?}"
    );
    assert_eq!(got.matches("short and stout\n").count(), 3, "{got:?}");
    assert_eq!(got.matches("x-served-by: sluice\r\n").count(), 4, "{got:?}");
    assert!(!got.contains("x-drop"), "{got:?}");
    let got = pipeline(fast, odd).await;
    assert!(got.starts_with("HTTP/1.1 599 <none>\r\n"), "{got:?}");
    assert_eq!(got.matches("date: ").count(), 1, "{got:?}");
    assert!(
        got.contains("date: Thu, 01 Jan 2026 00:00:00 GMT\r\n"),
        "{got:?}"
    );
    // Each run: the redirect, two HEADs and a GET here, then the POST and all after it
    // hyper's; the closing GET and the 599 (twice) here; the 204 and the 103 hyper's.
    let (taken, body, route) = if fast_path_on() {
        (2 * 4 + 3, 2, 2)
    } else {
        (0, 0, 0)
    };
    assert_eq!(
        counter(&metrics, "sluice_http1_fast_path_requests_total"),
        taken
    );
    let handed = |reason: &str| {
        let series = format!("sluice_http1_fast_path_handoffs_total{{reason=\"{reason}\"}}");
        counter(&metrics, &series)
    };
    assert_eq!((handed("body"), handed("route")), (body, route));
}
