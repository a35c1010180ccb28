//! What the session protocol carries beyond requests: the client's address on every request
//! (`Sluice-Client-Addr`), and a drained instance kept out until it is resumed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use bytes::Bytes;
use http::Response;
use reverse_support::custom::{serve_fn, Frames};
use reverse_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A service whose every answer is the `Sluice-Client-Addr` values it received, one a line.
async fn echo_client_addr(proxy: &TestProxy) {
    serve_fn(
        proxy.acceptor,
        &ServiceSpec::new("a", 1),
        |req| async move {
            let values: Vec<&str> = req
                .headers()
                .get_all("sluice-client-addr")
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            let body = Bytes::from(values.join("\n"));
            Ok(Response::new(Frames::new([body], None)))
        },
    )
    .await;
    proxy.idle("default", 1).await;
}

#[tokio::test]
async fn every_request_carries_the_client_address_and_never_the_clients_own() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    echo_client_addr(&proxy).await;

    let mut client = TcpStream::connect(proxy.http).await.unwrap();
    let me = client.local_addr().unwrap();
    client
        .write_all(
            b"GET / HTTP/1.1\r\nHost: test\r\nSluice-Client-Addr: 6.6.6.6:1\r\n\
              sluice-client-addr: [2001:db8::6]:2\r\nX-Forwarded-For: 6.6.6.6\r\n\
              Connection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(body, format!("127.0.0.1:{}", me.port()));
    proxy.stop().await;
}

/// Turns a hang into a failure; no test asserts a duration.
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(5), fut)
        .await
        .expect("the request hung")
}

#[tokio::test]
async fn a_slice_without_sessions_answers_503_at_once_not_after_the_queue_timeout() {
    let proxy = start_proxy("queue_timeout = \"1h\"", DEFAULT_ROUTE).await;
    let refused = within(get(proxy.http, "/")).await;
    assert_eq!(refused.status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.text(), "no sessions registered for this service\n");
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(proxy.cluster.queued("default"), 0);

    // Once a service registers, requests are served as usual.
    let _svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    assert_eq!(
        within(get(proxy.http, "/")).await.status,
        http::StatusCode::OK
    );
    proxy.stop().await;
}

#[tokio::test]
async fn no_sessions_wait_holds_requests_for_a_service_that_is_starting() {
    let proxy = start_proxy(
        "queue_timeout = \"1h\"\nno_sessions_wait = \"1h\"",
        DEFAULT_ROUTE,
    )
    .await;
    let waiting = tokio::spawn(get(proxy.http, "/"));
    proxy.cluster.wait_until(|c| c.queued("default") == 1).await;
    let _svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    assert_eq!(within(waiting).await.unwrap().status, http::StatusCode::OK);
    proxy.stop().await;
}
