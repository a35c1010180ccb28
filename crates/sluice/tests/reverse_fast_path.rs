//! Reverse sessions on the HTTP/1 fast path: plain requests to a reverse slice are exchanged on
//! the session's socket by the client connection's task, the rest by hyper's client on the same
//! session, and a session idle between fast-path requests is still watched, so that a service
//! closing it frees its place at once.
//!
//! The test command runs this crate's tests a second time with `SLUICE_FAST_PATH=0`; these
//! tests then expect hyper to have served everything, with the same answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;
use crate::support;

use std::time::Duration;

use reverse_support::{start_proxy, Service, ServiceSpec, DEFAULT_ROUTE};
use support::read_to_close;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn fast_path_on() -> bool {
    std::env::var("SLUICE_FAST_PATH").as_deref() != Ok("0")
}

/// The value of a metric line that starts with `series` (0 when there is none).
fn counter(metrics: &sluice::Metrics, series: &str) -> u64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Sends `request` on a new connection and reads until the proxy closes it (each request
/// says `Connection: close`).
async fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    read_to_close(&mut stream).await
}

/// The body of a one-response exchange.
fn body(raw: &str) -> &str {
    raw.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

/// One session carries requests the fast path takes and requests it leaves to hyper, in any
/// order: the session moves between the two without closing (the service sees one connection
/// throughout) and every request is answered on it.
#[tokio::test]
async fn one_session_serves_both_paths_in_turn_without_reconnecting() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let plain = "GET /session HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    // A chunked upload is hyper's (the fast path takes only bodies it has whole).
    let chunked = "POST /session HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                   Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let mut seen = Vec::new();
    for request in [plain, plain, chunked, chunked, plain, chunked, plain] {
        let raw = exchange(proxy.http, request).await;
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw:?}");
        seen.push(body(&raw).to_owned());
        proxy.idle("default", 1).await;
    }
    // `/session` answers the instance and the session's port: one connection served all.
    assert!(seen.iter().all(|s| *s == seen[0]), "{seen:?}");
    assert_eq!(svc.live(), 1);
    assert_eq!(svc.requests(), 7);
    let taken = counter(&proxy.metrics, "sluice_http1_fast_path_requests_total");
    assert_eq!(taken, if fast_path_on() { 4 } else { 0 });
    proxy.stop().await;
}

/// A service that closes an idle session frees the session's place at once, with no request
/// needed to find out (the service may register a replacement within its limit, and the
/// slice's counts are true), whichever path served the session's last request.
async fn idle_close_is_noticed_after(request: &str) {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    for _ in 0..4 {
        let raw = exchange(proxy.http, request).await;
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw:?}");
    }
    proxy.idle("default", 2).await;
    svc.kill_one();
    let noticed = proxy.cluster.wait_until(|c| c.sessions() == 1);
    tokio::time::timeout(Duration::from_secs(5), noticed)
        .await
        .expect("the closed session still counts");
    assert_eq!(proxy.cluster.idle_sessions("default"), 1);
    svc.kill();
    let noticed = proxy.cluster.wait_until(|c| c.sessions() == 0);
    tokio::time::timeout(Duration::from_secs(5), noticed)
        .await
        .expect("the closed sessions still count");
    proxy.stop().await;
}

#[tokio::test]
async fn an_idle_session_closed_by_its_service_is_noticed_after_fast_path_requests() {
    idle_close_is_noticed_after("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
}

#[tokio::test]
async fn an_idle_session_closed_by_its_service_is_noticed_after_hyper_requests() {
    // A chunked upload is hyper's on either path.
    let chunked = "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                   Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    idle_close_is_noticed_after(chunked).await;
}

/// The service learns the client's address from `Sluice-Client-Addr`, set by the proxy over
/// any copy the client sent, on either path.
#[tokio::test]
async fn the_client_address_is_stamped_over_a_spoofed_one() {
    use reverse_support::custom::serve_fn;
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    serve_fn(
        proxy.acceptor,
        &ServiceSpec::new("a", 1),
        |req: http::Request<hyper::body::Incoming>| async move {
            let all: Vec<String> = req
                .headers()
                .get_all("sluice-client-addr")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            Ok::<_, std::io::Error>(http::Response::new(http_body_util::Full::new(
                bytes::Bytes::from(all.join("|")),
            )))
        },
    )
    .await;
    proxy.idle("default", 1).await;
    let mut stream = TcpStream::connect(proxy.http).await.unwrap();
    let me = stream.local_addr().unwrap();
    let request = "GET / HTTP/1.1\r\nHost: x\r\nSluice-Client-Addr: 203.0.113.9:1\r\n\
                   Connection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let raw = read_to_close(&mut stream).await;
    assert_eq!(body(&raw), sluice_session::client_addr_value(me), "{raw:?}");
    proxy.stop().await;
}
