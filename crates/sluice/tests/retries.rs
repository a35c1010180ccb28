//! A cluster's `retry` (issue 33, item 6): which failures and answers send a request to the
//! upstream again, how many times, for which requests, and within which budget; the client gets
//! the last attempt's answer, or the one in hand when no next attempt can start. The test
//! command runs these on the fast path and again with it off (hyper); the tests of static
//! clusters check that the fast path served when it is on.
#![allow(clippy::unwrap_used)]

use crate::reverse_support;
use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use support::{client, static_config, Client, Reply, TestProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A backend that answers every request with `status` and a body naming it and the request's
/// body, counting requests.
struct Answering {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Answering {
    async fn start(name: &'static str, status: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let text = format!("{name} {}", String::from_utf8_lossy(&body));
                        let mut res = Response::new(Full::new(Bytes::from(text)));
                        *res.status_mut() = StatusCode::from_u16(status).unwrap();
                        Ok::<_, Infallible>(res)
                    }
                });
                tokio::spawn(async move {
                    let conn = hyper::server::conn::http1::Builder::new();
                    let _ = conn.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Self { addr, requests }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// A backend that reads each request's head and closes its connection without a word: a
/// reset before any response byte, on a fresh connection.
async fn resetting() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, requests)
}

async fn request(client: &Client, method: Method, url: &str, body: &'static str) -> Reply {
    let req = Request::builder().method(method).uri(url);
    support::send(client, req.body(Full::new(Bytes::from(body))).unwrap()).await
}

/// The value of the metric line that starts with `prefix` (0 when there is none).
fn metric(proxy: &TestProxy, prefix: &str) -> u64 {
    let text = proxy.metrics.render();
    let line = text.lines().find(|l| l.starts_with(prefix));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// When the fast path is on, it served (the rule is both paths').
fn assert_fast_path_served(proxy: &TestProxy) {
    if let Some(served) = support::fast_path_served(&proxy.metrics) {
        assert!(served > 0, "the fast path served nothing");
    }
}

#[tokio::test]
async fn a_listed_answer_goes_to_another_endpoint() {
    let bad = Answering::start("bad", 503).await;
    let good = Answering::start("good", 200).await;
    let extra = "lb = \"round_robin\"\nretry = { retries = 1, on = [\"503\"] }\n";
    let proxy = TestProxy::start(&static_config(&[bad.addr, good.addr], extra)).await;
    let client = client();
    for _ in 0..6 {
        let reply = request(&client, Method::GET, &proxy.url("/"), "").await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.body, "good ");
    }
    assert!(
        bad.requests() >= 1,
        "round robin never tried the failing endpoint"
    );
    let retried = metric(
        &proxy,
        "sluice_upstream_retries_total{cluster=\"backend\",reason=\"503\"}",
    );
    assert_eq!(retried, bad.requests() as u64);
    // A POST that may have been processed is not sent twice: one of two meets the 503.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(
            request(&client, Method::POST, &proxy.url("/"), "x")
                .await
                .status,
        );
    }
    assert!(
        statuses.contains(&StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn when_every_attempt_fails_the_client_gets_the_last_answer() {
    let a = Answering::start("a", 503).await;
    let b = Answering::start("b", 503).await;
    let extra = "retry = { retries = 3, on = [\"502\", \"503\"] }\n";
    let proxy = TestProxy::start(&static_config(&[a.addr, b.addr], extra)).await;
    let reply = request(&client(), Method::GET, &proxy.url("/"), "").await;
    // The upstream's own answer, not one of Sluice's.
    assert_eq!(reply.status, 503);
    assert!(reply.body == "a " || reply.body == "b ", "{reply:?}");
    assert_eq!(
        a.requests() + b.requests(),
        4,
        "one attempt and three retries"
    );
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn a_body_kept_in_memory_goes_again_whole() {
    let bad = Answering::start("bad", 502).await;
    let good = Answering::start("good", 200).await;
    let extra = "lb = \"round_robin\"\nretry = { retries = 1, on = [\"502\"] }\n";
    let proxy = TestProxy::start(&static_config(&[bad.addr, good.addr], extra)).await;
    let client = client();
    for _ in 0..4 {
        let reply = request(&client, Method::PUT, &proxy.url("/"), "the body").await;
        assert_eq!(
            (reply.status.as_u16(), reply.body.as_str()),
            (200, "good the body")
        );
    }
    assert!(bad.requests() >= 1);
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn the_budget_refuses_retries_past_its_share() {
    let failing = Answering::start("failing", 503).await;
    let extra = "retry = { retries = 3, on = [\"503\"], budget_percent = 0, budget_min = 0 }\n";
    let proxy = TestProxy::start(&static_config(&[failing.addr], extra)).await;
    let client = client();
    for _ in 0..3 {
        let reply = request(&client, Method::GET, &proxy.url("/"), "").await;
        assert_eq!(reply.status, 503);
    }
    assert_eq!(failing.requests(), 3, "a budget of nothing allows no retry");
    let refused = metric(
        &proxy,
        "sluice_upstream_retries_refused_total{cluster=\"backend\"}",
    );
    assert_eq!(refused, 3);
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn a_reset_before_the_response_is_retried_for_idempotent_requests() {
    let (reset, resets) = resetting().await;
    let good = Answering::start("good", 200).await;
    let extra = "lb = \"round_robin\"\nretry = { retries = 1, on = [\"reset\"] }\n";
    let proxy = TestProxy::start(&static_config(&[reset, good.addr], extra)).await;
    let client = client();
    for _ in 0..4 {
        let reply = request(&client, Method::GET, &proxy.url("/"), "").await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    assert!(resets.load(Ordering::SeqCst) >= 1);
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(
            request(&client, Method::POST, &proxy.url("/"), "x")
                .await
                .status,
        );
    }
    assert!(statuses.contains(&StatusCode::BAD_GATEWAY), "{statuses:?}");
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn non_idempotent_requests_go_again_when_the_policy_says_so() {
    // A 503 says the request was not processed: a POST may go again after it when told so.
    let busy = Answering::start("busy", 503).await;
    let good = Answering::start("good", 200).await;
    let extra = "lb = \"round_robin\"\n\
                 retry = { retries = 1, on = [\"503\"], non_idempotent = true }\n";
    let proxy = TestProxy::start(&static_config(&[busy.addr, good.addr], extra)).await;
    let client = client();
    for _ in 0..4 {
        let reply = request(&client, Method::POST, &proxy.url("/"), "order 1").await;
        assert_eq!(
            (reply.status.as_u16(), reply.body.as_str()),
            (200, "good order 1")
        );
    }
    assert!(busy.requests() >= 1);
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn without_connect_failure_a_dead_endpoint_is_not_left_for_another() {
    // An address nothing listens on: bound, then closed.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let good = Answering::start("good", 200).await;
    let listed = "lb = \"round_robin\"\n";
    let proxy = TestProxy::start(&static_config(&[dead_addr, good.addr], listed)).await;
    let client = client();
    for _ in 0..4 {
        let reply = request(&client, Method::GET, &proxy.url("/"), "").await;
        assert_eq!(reply.status, 200, "by default a failed connect moves on");
    }
    let unlisted = "lb = \"round_robin\"\nretry = { on = [\"503\"] }\n";
    let proxy = TestProxy::start(&static_config(&[dead_addr, good.addr], unlisted)).await;
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(
            request(&client, Method::GET, &proxy.url("/"), "")
                .await
                .status,
        );
    }
    assert!(statuses.contains(&StatusCode::BAD_GATEWAY), "{statuses:?}");
}

/// A backend that answers each request with exactly `bytes` (written at once, or head and
/// body `pause` apart when `pause` is set), then closes.
async fn raw_backend(
    bytes: &'static [u8],
    pause: Option<(usize, std::time::Duration)>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                match pause {
                    None => {
                        let _ = stream.write_all(bytes).await;
                    }
                    Some((at, pause)) => {
                        let _ = stream.write_all(&bytes[..at]).await;
                        tokio::time::sleep(pause).await;
                        let _ = stream.write_all(&bytes[at..]).await;
                    }
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn the_answer_in_hand_is_the_clients_when_no_next_attempt_can_start() {
    let failing = Answering::start("failing", 500).await;
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let extra = "retry = { retries = 1, on = [\"connect-failure\", \"500\"] }\n";
    let proxy = TestProxy::start(&static_config(&[failing.addr, dead_addr], extra)).await;
    let client = client();
    for _ in 0..6 {
        let reply = request(&client, Method::GET, &proxy.url("/"), "").await;
        // The upstream's own 500, never Sluice's 502 or 503 for the attempt that could not be.
        assert_eq!(
            (reply.status.as_u16(), reply.body.as_str()),
            (500, "failing ")
        );
    }
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn a_retry_leaves_the_budget_when_its_answer_begins() {
    let failing = Answering::start("failing", 503).await;
    // Its head at once, its body 2 s later.
    let slow = raw_backend(
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow",
        Some((38, std::time::Duration::from_secs(2))),
    )
    .await;
    let extra = "lb = \"round_robin\"\n\
                 retry = { retries = 1, on = [\"503\"], budget_percent = 0, budget_min = 1 }\n";
    let proxy = TestProxy::start(&static_config(&[failing.addr, slow], extra)).await;
    // The first request goes to the failing endpoint, then to the slow one; its head comes.
    let mut first = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    first
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = first.read(&mut buf).await.unwrap();
        assert!(n > 0);
        head.extend_from_slice(&buf[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    // While its body is still coming, the budget's one retry is free again.
    let reply = request(&client(), Method::GET, &proxy.url("/"), "").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(metric(&proxy, "sluice_upstream_retries_refused_total"), 0);
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn a_head_cut_short_goes_again_only_for_idempotent_requests_on_both_paths() {
    let cut = raw_backend(b"HTTP/1.1 200 OK\r\nContent-Le", None).await;
    let good = Answering::start("good", 200).await;
    let extra = "lb = \"round_robin\"\n\
                 retry = { retries = 1, on = [\"reset\"], non_idempotent = true }\n";
    let proxy = TestProxy::start(&static_config(&[cut, good.addr], extra)).await;
    let client = client();
    // Round robin: the GET meets the cut head first, and goes to the good endpoint.
    let reply = request(&client, Method::GET, &proxy.url("/"), "").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    // The POST meets it next: the upstream may have begun to answer, so it is not sent again.
    let reply = request(&client, Method::POST, &proxy.url("/"), "x").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{reply:?}");
    assert_fast_path_served(&proxy);
}

#[tokio::test]
async fn retries_go_to_endpoints_not_tried_yet() {
    let a = Answering::start("a", 503).await;
    let b = Answering::start("b", 503).await;
    let c = Answering::start("c", 200).await;
    let extra = "lb = \"random\"\nretry = { retries = 2, on = [\"503\"] }\n";
    let proxy = TestProxy::start(&static_config(&[a.addr, b.addr, c.addr], extra)).await;
    let client = client();
    for _ in 0..12 {
        let reply = request(&client, Method::GET, &proxy.url("/"), "").await;
        assert_eq!((reply.status.as_u16(), reply.body.as_str()), (200, "c "));
    }
    assert_fast_path_served(&proxy);
}

/// A backend whose odd requests (the 1st, 3rd, …) are answered 503 and even ones 200,
/// counting requests.
async fn every_other_503() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    let status = if n.is_multiple_of(2) { 503 } else { 200 };
                    let mut res = Response::new(Full::new(Bytes::from(format!("{status}"))));
                    *res.status_mut() = StatusCode::from_u16(status).unwrap();
                    Ok::<_, Infallible>(res)
                }
            });
            tokio::spawn(async move {
                let conn = hyper::server::conn::http1::Builder::new();
                let _ = conn.serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    (addr, requests)
}

/// Issue 48, item 4: one endpoint answering 503 every other request, one dead. A retry whose
/// untried endpoint cannot be connected goes back to the live one (it has retries left), rather
/// than giving the client the 503 in hand. Before, the fall-back to endpoints already tried was
/// skipped once a connect had failed, so the retry went nowhere: the dead endpoint's ejection
/// had to have just expired, which made it 2 requests in 27.
#[tokio::test]
async fn a_retry_that_meets_a_dead_endpoint_goes_back_to_a_live_one() {
    let (flaky, requests) = every_other_503().await;
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    // Round robin from the first endpoint: the first request meets the 503, its retry the dead
    // endpoint (never tried, so not ejected yet).
    let extra = "lb = \"round_robin\"\n\
                 retry = { retries = 2, on = [\"connect-failure\", \"reset\", \"503\"] }\n";
    let proxy = TestProxy::start(&static_config(&[flaky, dead_addr], extra)).await;
    let reply = request(&client(), Method::GET, &proxy.url("/"), "").await;
    assert_eq!(
        (reply.status.as_u16(), reply.body.as_str()),
        (200, "200"),
        "the retry gave up after the dead endpoint"
    );
    assert_eq!(requests.load(Ordering::SeqCst), 2);
    assert_fast_path_served(&proxy);
}

mod sessions {
    use super::*;
    use reverse_support::custom::serve_fn;
    use reverse_support::{start_proxy, ServiceSpec, DEFAULT_ROUTE};

    /// A service whose first answer is 503, every later one 200, counting requests.
    async fn flaky_once(acceptor: SocketAddr, sessions: usize) -> Arc<AtomicUsize> {
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        let spec = ServiceSpec::new("flaky", sessions);
        serve_fn(acceptor, &spec, move |req: Request<Incoming>| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let status = if n == 0 { 503 } else { 200 };
                let mut res = Response::new(Full::new(body));
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
                Ok(res)
            }
        })
        .await;
        requests
    }

    #[tokio::test]
    async fn a_listed_answer_goes_to_another_session() {
        let cluster = "retry = { retries = 2, on = [\"503\"] }\n";
        let proxy = start_proxy(cluster, DEFAULT_ROUTE).await;
        let requests = flaky_once(proxy.acceptor, 1).await;
        proxy.idle("default", 1).await;
        let reply = reverse_support::send_body(proxy.http, Method::PUT, "/", "kept").await;
        assert_eq!(
            (reply.status.as_u16(), reply.text().as_str()),
            (200, "kept")
        );
        assert_eq!(requests.load(Ordering::SeqCst), 2);
        // The answer that was dropped gave its session back: the one session serves on.
        proxy.idle("default", 1).await;
        let reply = reverse_support::get(proxy.http, "/").await;
        assert_eq!(reply.status, 200);
        proxy.stop().await;
    }

    #[tokio::test]
    async fn without_a_policy_the_answer_is_the_clients() {
        let proxy = start_proxy("", DEFAULT_ROUTE).await;
        let requests = flaky_once(proxy.acceptor, 1).await;
        proxy.idle("default", 1).await;
        let reply = reverse_support::get(proxy.http, "/").await;
        assert_eq!(reply.status, 503);
        assert_eq!(requests.load(Ordering::SeqCst), 1);
        proxy.stop().await;
    }
}

/// A malformed `retry` is a config error that says where and what to write instead.
#[test]
fn a_malformed_retry_is_a_config_error() {
    let endpoint: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let cases = [
        ("retry = { retries = 11 }", "at most 10 retries"),
        ("retry = { on = [\"404\"] }", "not a failure to retry"),
        (
            "retry = { on = [\"5xx\"] }",
            "unknown retry condition `5xx`",
        ),
        ("retry = { budget_percent = 150 }", "0 to 100"),
        ("retry = { retrys = 1 }", "unknown field `retrys`"),
    ];
    for (line, message) in cases {
        let text = static_config(&[endpoint], line);
        support::assert_refused_at(&text, line, message);
    }
    let reverse = "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\n\
                   [acceptor]\nlisten = \"127.0.0.1:0\"\n\
                   [[route]]\ncluster = \"api\"\n\
                   [cluster.api]\nkind = \"reverse\"\nretry = { on = [\"connect-failure\"] }\n";
    let err = sluice::config::parse_str(reverse, "t.toml", std::path::Path::new("."))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("never connects") && err.contains("t.toml:10:"),
        "{err}"
    );
}
