//! The registration handshake: 101 and every refusal status, and drain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use http::StatusCode;
use reverse_support::service::{dial, dial_raw};
use reverse_support::{get, start_proxy, Service, ServiceSpec, DEFAULT_ROUTE};
use sluice_session::Drain;

#[tokio::test]
async fn registered_session_serves_requests() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let res = get(proxy.http, "/hello").await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.text(), "a");
    assert_eq!(svc.requests(), 1);
    assert_eq!(proxy.cluster.sessions(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn malformed_handshake_is_400() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let (_, status) = dial_raw(proxy.acceptor, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status, 400);
    let (_, status) = dial_raw(proxy.acceptor, b"\x00\x01garbage\r\n\r\n").await;
    assert_eq!(status, 400);
    proxy.stop().await;
}

#[tokio::test]
async fn bad_or_missing_token_is_401() {
    let proxy = start_proxy("tokens = [\"first\", \"s3cret\"]", DEFAULT_ROUTE).await;
    let mut spec = ServiceSpec::new("a", 1);
    assert_eq!(dial(proxy.acceptor, &spec.registration()).await.1, 401);
    spec.token = Some("s3cre".into());
    assert_eq!(dial(proxy.acceptor, &spec.registration()).await.1, 401);
    spec.token = Some("s3cret".into());
    assert_eq!(dial(proxy.acceptor, &spec.registration()).await.1, 101);
    proxy.stop().await;
}

#[tokio::test]
async fn unknown_service_is_404() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let mut spec = ServiceSpec::new("a", 1);
    spec.service = "nope".into();
    assert_eq!(dial(proxy.acceptor, &spec.registration()).await.1, 404);
    proxy.stop().await;
}

#[tokio::test]
async fn session_limits_are_429() {
    let proxy = start_proxy(
        "max_sessions_per_instance = 2\nmax_sessions = 3",
        DEFAULT_ROUTE,
    )
    .await;
    let a = ServiceSpec::new("a", 1).registration();
    let b = ServiceSpec::new("b", 1).registration();
    let mut keep = Vec::new();
    for _ in 0..2 {
        let (stream, status) = dial(proxy.acceptor, &a).await;
        assert_eq!(status, 101);
        keep.push(stream);
    }
    assert_eq!(dial(proxy.acceptor, &a).await.1, 429, "per instance");
    let (stream, status) = dial(proxy.acceptor, &b).await;
    assert_eq!(status, 101);
    keep.push(stream);
    assert_eq!(dial(proxy.acceptor, &b).await.1, 429, "per cluster");
    proxy.stop().await;
}

#[tokio::test]
async fn draining_instance_is_503_until_its_sessions_close() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    let busy = tokio::spawn(get(proxy.http, "/wait"));
    proxy.idle("default", 1).await;
    let drain = Drain {
        identity: ServiceSpec::new("a", 1).registration().identity,
    };
    assert_eq!(dial_raw(proxy.acceptor, &drain.encode()).await.1, 200);
    svc.wait_live(1).await; // the idle session closed at once
    let again = ServiceSpec::new("a", 1).registration();
    assert_eq!(dial(proxy.acceptor, &again).await.1, 503);
    svc.open_gate();
    assert_eq!(busy.await.unwrap().status, StatusCode::OK);
    svc.wait_live(0).await; // the busy one closed after its response
    proxy.cluster.wait_until(|c| c.sessions() == 0).await;
    // A drained instance with no sessions left may register afresh.
    assert_eq!(dial(proxy.acceptor, &again).await.1, 101);
    proxy.stop().await;
}
