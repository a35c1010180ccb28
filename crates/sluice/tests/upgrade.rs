//! HTTP/1.1 upgrades (WebSocket-style protocol switches) through static and reverse clusters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Only part of the reverse harness is used here.
#[allow(unused_imports)]
use crate::reverse_support;
use crate::support;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, UPGRADE};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice_sdk::{Identity, Options};
use sluice_session::DEFAULT_SLICE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Fails the test instead of hanging it when `f` never completes.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("timed out")
}

/// Answers `Upgrade: echo` with a 101 and then echoes every byte; anything else (and
/// `/refuse`) with a 200 saying whether an `Upgrade` header arrived.
async fn echo(mut req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let asked = req.headers().get(UPGRADE).is_some_and(|v| v == "echo");
    if !asked || req.uri().path() == "/refuse" {
        let seen = req.headers().contains_key(UPGRADE);
        return Ok(Response::new(Full::new(Bytes::from(format!(
            "upgrade seen: {seen}"
        )))));
    }
    let on = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let upgraded = on.await.expect("the switch did not complete");
        let (mut r, mut w) = tokio::io::split(TokioIo::new(upgraded));
        let _ = tokio::io::copy(&mut r, &mut w).await;
    });
    let res = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(UPGRADE, "echo")
        .header(CONNECTION, "upgrade")
        .body(Full::default())
        .unwrap();
    Ok(res)
}

/// A listening HTTP/1.1 backend with upgrades, serving [`echo`].
async fn echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(echo))
                    .with_upgrades(),
            );
        }
    });
    addr
}

/// Sends an upgrade request for `echo` on a raw connection and reads the response head.
async fn switch(proxy: SocketAddr) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte, so nothing after the head is consumed.
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).await.unwrap(),
            1,
            "closed in the head"
        );
        head.push(byte[0]);
    }
    (
        stream,
        String::from_utf8(head).unwrap().to_ascii_lowercase(),
    )
}

/// Round trips `from..to` over a switched connection.
async fn round_trips(stream: &mut TcpStream, from: usize, to: usize) {
    for i in from..to {
        let msg = format!("ping {i}");
        stream.write_all(msg.as_bytes()).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg.as_bytes());
    }
}

/// Closes our half; the other side closes too, and nothing more arrives.
async fn close(mut stream: TcpStream) {
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}

fn assert_switched(head: &str) {
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("\r\nupgrade: echo\r\n"), "{head}");
    assert!(head.contains("\r\nconnection: upgrade\r\n"), "{head}");
}

#[tokio::test]
async fn static_cluster_carries_an_upgrade() {
    let backend = echo_backend().await;
    let proxy = support::TestProxy::start(&support::static_config(&[backend], "")).await;
    let (mut stream, head) = within(switch(proxy.addr())).await;
    assert_switched(&head);
    within(round_trips(&mut stream, 0, 5)).await;
    within(close(stream)).await;
    // The upgraded connection left the pool: the next request still works.
    let reply = support::get(&support::client(), &proxy.url("/plain")).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn reverse_session_carries_an_upgrade_and_is_replaced() {
    let proxy = reverse_support::start_proxy("", reverse_support::DEFAULT_ROUTE).await;
    let mut options = Options::new(proxy.acceptor, Identity::new("api"));
    options.capacity = 2;
    let sessions = sluice_sdk::serve(options, tower::service_fn(echo)).unwrap();
    within(proxy.idle(DEFAULT_SLICE, 2)).await;

    let (mut stream, head) = within(switch(proxy.http)).await;
    assert_switched(&head);
    within(round_trips(&mut stream, 0, 3)).await;
    // The upgrade consumed its session and the SDK dialed a replacement, while the upgraded
    // connection is still open: two idle sessions that both serve, neither of them the socket
    // the echo runs on.
    within(proxy.idle(DEFAULT_SLICE, 2)).await;
    assert_eq!(proxy.cluster.sessions(), 2);
    let (a, b) = within(async {
        tokio::join!(
            reverse_support::get(proxy.http, "/a"),
            reverse_support::get(proxy.http, "/b")
        )
    })
    .await;
    for reply in [a, b] {
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.text(), "upgrade seen: false");
    }
    within(round_trips(&mut stream, 3, 6)).await;
    within(close(stream)).await;

    drop(sessions);
    proxy.stop().await;
}

#[tokio::test]
async fn an_instance_whose_sessions_are_all_upgraded_is_listed_as_upgraded() {
    let proxy = reverse_support::start_proxy("", reverse_support::DEFAULT_ROUTE).await;
    let mut identity = Identity::new("api");
    identity.instance = Some("ws".into());
    let mut options = Options::new(proxy.acceptor, identity);
    options.capacity = 1;
    let sessions = sluice_sdk::serve(options, tower::service_fn(echo)).unwrap();
    within(proxy.idle(DEFAULT_SLICE, 1)).await;
    let (mut stream, head) = within(switch(proxy.http)).await;
    assert_switched(&head);
    within(round_trips(&mut stream, 0, 1)).await;
    // No session left (the replacement is shrunk away), one upgraded connection open: the
    // instance is still listed, with it.
    sessions.set_capacity(0);
    within(proxy.cluster.wait_until(|c| c.sessions() == 0)).await;
    let instances = proxy.cluster.instances();
    let listed: Vec<_> = instances
        .iter()
        .map(|i| (i.id().to_owned(), i.sessions()))
        .collect();
    assert_eq!(listed, [("ws".to_owned(), 0)]);
    assert_eq!(instances[0].upgraded(), 1);
    within(close(stream)).await;
    within(proxy.cluster.wait_until(|c| c.instances().is_empty())).await;
    drop(sessions);
    proxy.stop().await;
}

#[tokio::test]
async fn an_upgrade_answered_200_is_an_ordinary_response() {
    let backend = echo_backend().await;
    let proxy = support::TestProxy::start(&support::static_config(&[backend], "")).await;
    let stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/refuse")
        .header("host", "test")
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, "echo")
        .body(Full::<Bytes>::default())
        .unwrap();
    let res = within(sender.send_request(req)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(!res.headers().contains_key(UPGRADE));
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "upgrade seen: true");
    // The client's connection is still HTTP: a second request on it works.
    let req = Request::get("/again")
        .header("host", "test")
        .body(Full::<Bytes>::default())
        .unwrap();
    let res = within(sender.send_request(req)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn http2_requests_never_carry_upgrade_upstream() {
    let backend = echo_backend().await;
    let proxy = support::TestProxy::start(&support::static_config(&[backend], "")).await;
    let mut h2 = support::h2_connect(proxy.addr()).await;
    let req = Request::get(proxy.url("/ws"))
        .header(UPGRADE, "echo")
        .body(Full::default())
        .unwrap();
    let reply = within(support::h2_send(&mut h2, req)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "upgrade seen: false");
}

#[tokio::test]
async fn a_101_nobody_asked_for_is_a_bad_gateway() {
    // A raw backend that switches protocols whatever it is asked.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: upgrade\r\n\r\n";
                let _ = stream.write_all(switch).await;
                let _ = stream.read(&mut buf).await;
            });
        }
    });
    let proxy = support::TestProxy::start(&support::static_config(&[backend], "")).await;
    let reply = within(support::get(&support::client(), &proxy.url("/plain"))).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
}

/// A shutdown drains an upgraded connection like an open HTTP one: it keeps carrying bytes
/// after the trigger, the proxy waits for it, and finishes once it closes.
#[tokio::test]
async fn a_shutdown_lets_an_upgraded_connection_finish_within_the_grace() {
    let backend = echo_backend().await;
    let proxy = support::TestProxy::start(&support::static_config(&[backend], "")).await;
    let (mut stream, head) = within(switch(proxy.addr())).await;
    assert_switched(&head);
    within(round_trips(&mut stream, 0, 3)).await;
    proxy.shutdown();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !proxy.task.is_finished(),
        "the proxy stopped with an upgraded connection open"
    );
    within(round_trips(&mut stream, 3, 6)).await;
    within(close(stream)).await;
    within(proxy.task).await.unwrap();
}

/// When the grace ends, an upgraded connection still open is closed, as any other is.
#[tokio::test]
async fn an_upgraded_connection_still_open_when_the_grace_ends_is_closed() {
    let backend = echo_backend().await;
    let config = support::static_config(&[backend], "").replace("\"5s\"", "\"500ms\"");
    let proxy = support::TestProxy::start(&config).await;
    let (mut stream, head) = within(switch(proxy.addr())).await;
    assert_switched(&head);
    within(round_trips(&mut stream, 0, 3)).await;
    proxy.shutdown();
    within(proxy.task).await.unwrap();
    let mut rest = Vec::new();
    let read = within(stream.read_to_end(&mut rest)).await;
    assert!(
        read.is_err() || rest.is_empty(),
        "the bridge still ran after the proxy stopped: read {read:?}, {rest:?}"
    );
}
