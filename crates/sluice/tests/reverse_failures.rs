//! Sessions that die, retire or run out: dead idle sessions, killed services, the idempotent
//! retry, `Connection: close`, and the admission queue's 503s.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::sync::Arc;

use http::{Method, StatusCode};
use reverse_support::{
    get, send, send_body, start_proxy, Service, ServiceSpec, TestProxy, DEFAULT_ROUTE,
};
use sluice::ReverseCluster;

#[tokio::test]
async fn dead_idle_session_is_skipped_without_a_client_error() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    svc.kill_one();
    for _ in 0..10 {
        assert_eq!(get(proxy.http, "/").await.status, StatusCode::OK);
    }
    assert_eq!(svc.requests(), 10);
    proxy.stop().await;
}

#[tokio::test]
async fn service_killed_mid_request_gives_that_client_502_only() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let doomed = Service::start(proxy.acceptor, ServiceSpec::new("doomed", 1)).await;
    proxy.idle("default", 1).await;
    let hung = tokio::spawn(send(proxy.http, Method::POST, "/hang"));
    proxy.idle("default", 0).await;
    let healthy = Service::start(proxy.acceptor, ServiceSpec::new("healthy", 2)).await;
    proxy.idle("default", 2).await;
    doomed.kill();
    assert_eq!(hung.await.unwrap().status, StatusCode::BAD_GATEWAY);
    for _ in 0..6 {
        let res = get(proxy.http, "/").await;
        assert_eq!(
            (res.status, res.text().as_str()),
            (StatusCode::OK, "healthy")
        );
    }
    assert_eq!(healthy.requests(), 6);
    proxy.stop().await;
}

#[tokio::test]
async fn idempotent_request_is_retried_once_on_another_session() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    // The first /flaky drops its session before any response byte.
    assert_eq!(get(proxy.http, "/flaky").await.status, StatusCode::OK);
    assert_eq!(svc.requests(), 2);
    svc.wait_live(1).await;
    proxy.stop().await;
}

#[tokio::test]
async fn idempotent_request_with_a_buffered_body_is_retried() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    let res = send_body(proxy.http, Method::PUT, "/flaky", "replayed body").await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(svc.requests(), 2);
    proxy.stop().await;
}

#[tokio::test]
async fn non_idempotent_request_is_not_retried() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    let res = send(proxy.http, Method::POST, "/flaky").await;
    assert_eq!(res.status, StatusCode::BAD_GATEWAY);
    assert_eq!(svc.requests(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn connection_close_retires_the_session() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    assert_eq!(get(proxy.http, "/close").await.status, StatusCode::OK);
    svc.wait_live(1).await;
    proxy.cluster.wait_until(|c| c.sessions() == 1).await;
    assert_eq!(proxy.cluster.idle_sessions("default"), 1);
    assert_eq!(get(proxy.http, "/").await.status, StatusCode::OK);
    proxy.stop().await;
}

#[tokio::test]
async fn full_queue_answers_503_with_retry_after() {
    let proxy = start_proxy("queue_max = 1\nqueue_timeout = \"10s\"", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let busy = tokio::spawn(get(proxy.http, "/wait"));
    proxy.idle("default", 0).await;
    let queued = tokio::spawn(get(proxy.http, "/"));
    proxy.cluster.wait_until(|c| c.queued("default") == 1).await;
    let refused = get(proxy.http, "/").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers["retry-after"], "1");
    svc.open_gate();
    assert_eq!(busy.await.unwrap().status, StatusCode::OK);
    assert_eq!(queued.await.unwrap().status, StatusCode::OK);
    assert_eq!(svc.requests(), 2);
    proxy.stop().await;
}

#[tokio::test]
async fn a_full_queue_frees_the_places_of_waiters_whose_wait_expired() {
    let proxy = start_proxy("queue_max = 1\nqueue_timeout = \"100ms\"", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let busy = tokio::spawn(get(proxy.http, "/wait"));
    proxy.idle("default", 0).await;
    // Each waits in the one place the queue has, and expires: none is refused as "queue full"
    // by the waiter before it.
    for _ in 0..3 {
        let expired = get(proxy.http, "/").await;
        assert_eq!(expired.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            expired.text().contains("queue wait expired"),
            "{}",
            expired.text()
        );
    }
    svc.open_gate();
    assert_eq!(busy.await.unwrap().status, StatusCode::OK);
    proxy.stop().await;
}

/// Waits until the cluster's state satisfies `done`; false if it did not within 5 s.
async fn within_5s(proxy: &TestProxy, done: impl Fn(&ReverseCluster) -> bool) -> bool {
    let wait = proxy.cluster.wait_until(done);
    tokio::time::timeout(std::time::Duration::from_secs(5), wait)
        .await
        .is_ok()
}

/// Connects and sends a request head; the request is then in the proxy's hands.
async fn send_head(proxy: &TestProxy, path: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;

    let mut client = tokio::net::TcpStream::connect(proxy.http).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nhost: example\r\n\r\n");
    client.write_all(head.as_bytes()).await.unwrap();
    client
}

/// A client that hangs up while its request waits in the queue gives its place back at once
/// (not at `queue_timeout`), and its request never reaches a session.
#[tokio::test]
async fn a_client_that_hangs_up_while_queued_frees_its_place_and_its_request_is_not_sent() {
    let proxy = start_proxy("queue_max = 1\nqueue_timeout = \"60s\"", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let busy = tokio::spawn(get(proxy.http, "/wait"));
    proxy.idle("default", 0).await;
    let leaver = send_head(&proxy, "/left").await;
    assert!(within_5s(&proxy, |c| c.queued("default") == 1).await);
    drop(leaver);
    assert!(
        within_5s(&proxy, |c| c.queued("default") == 0).await,
        "the place of a client that hung up is still held"
    );
    // The queue's one place is free for the next client, which gets the session in turn.
    let next = tokio::spawn(get(proxy.http, "/"));
    assert!(within_5s(&proxy, |c| c.queued("default") == 1).await);
    svc.open_gate();
    assert_eq!(busy.await.unwrap().status, StatusCode::OK);
    assert_eq!(next.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        svc.requests(),
        2,
        "the request of the client that left was sent"
    );
    proxy.stop().await;
}

/// A proxy (`cluster`: its extra keys) and a service of one session, whose client asks for
/// `path` and hangs up while the service works on it; then the service answers. Waits until
/// the proxy has closed the client's connection in turn: by then it has given the request up.
async fn hang_up_during(cluster: &str, path: &str) -> (TestProxy, Arc<Service>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let proxy = start_proxy(cluster, DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let mut leaver = send_head(&proxy, path).await;
    proxy.idle("default", 0).await;
    leaver.shutdown().await.unwrap();
    let _ = leaver.read_to_end(&mut Vec::new()).await;
    svc.open_gate();
    (proxy, svc)
}

/// Whether the one session comes back and serves the next request.
async fn session_kept(proxy: &TestProxy, svc: &Service) {
    assert!(
        within_5s(proxy, |c| c.idle_sessions("default") == 1).await,
        "the session did not come back after the answer"
    );
    let next = get(proxy.http, "/").await;
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!(svc.live(), 1, "the session closed when its client left");
}

/// A client that hangs up while the service works on its request does not cost the session:
/// the proxy still reads the answer off it, and leases the session again.
#[tokio::test]
async fn a_client_that_hangs_up_mid_request_does_not_cost_the_session() {
    let (proxy, svc) = hang_up_during("", "/wait").await;
    session_kept(&proxy, &svc).await;
    assert_eq!(svc.requests(), 2);
    proxy.stop().await;
}

/// Nor when its answer is longer than the response buffer: the proxy reads it off to its end
/// (by the request's deadline) on both paths, and the session goes back.
#[tokio::test]
async fn a_client_that_hangs_up_before_a_long_answer_does_not_cost_the_session() {
    let (proxy, svc) = hang_up_during("response_buffer = \"4KiB\"", "/wait/big/300000").await;
    session_kept(&proxy, &svc).await;
    proxy.stop().await;
}

/// But an answer too long to be worth reading for nobody (past 1 MiB and the response buffer)
/// closes its session instead, on both paths: the proxy does not download it.
#[tokio::test]
async fn a_client_that_hangs_up_before_a_huge_answer_closes_its_session() {
    let (proxy, svc) = hang_up_during("response_buffer = \"4KiB\"", "/wait/big/3000000").await;
    tokio::time::timeout(std::time::Duration::from_secs(10), svc.wait_live(0))
        .await
        .expect("the session of a huge abandoned answer stayed open");
    proxy.stop().await;
}

#[tokio::test]
async fn expired_queue_wait_answers_503() {
    let proxy = start_proxy("queue_timeout = \"50ms\"", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let busy = tokio::spawn(get(proxy.http, "/wait"));
    proxy.idle("default", 0).await;
    let expired = get(proxy.http, "/").await;
    assert_eq!(expired.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(expired.headers["retry-after"], "1");
    svc.open_gate();
    assert_eq!(busy.await.unwrap().status, StatusCode::OK);
    // The session survived the expired wait and serves the next request.
    assert_eq!(get(proxy.http, "/").await.status, StatusCode::OK);
    proxy.stop().await;
}

/// A response head that breaks the protocol: response bytes arrived, so the request may have
/// been acted on and must not be sent to a second session.
#[tokio::test]
async fn a_malformed_response_is_502_and_not_retried() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let spec = ServiceSpec::new("a", 2);
    let heads = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let (mut stream, status) =
            reverse_support::service::dial(proxy.acceptor, &spec.registration()).await;
        assert_eq!(status, 101);
        let heads = Arc::clone(&heads);
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    heads.fetch_add(1, Ordering::SeqCst);
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: oops\r\n\r\n")
                        .await;
                }
            }
        });
    }
    proxy.idle("default", 2).await;
    let res = get(proxy.http, "/").await;
    assert_eq!(res.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        heads.load(Ordering::SeqCst),
        1,
        "the request reached a second session"
    );
    proxy.stop().await;
}
