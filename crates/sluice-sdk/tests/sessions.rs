//! Registering, serving, re-dialing, resizing and draining against a fake acceptor.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::Arc;

use bytes::Bytes;
use http::header::CONNECTION;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use sluice_sdk::serve;
use sluice_session::Reply;
use support::{hello, options, registered, within, Event, Fake};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Barrier;

#[tokio::test]
async fn registers_capacity_sessions_that_serve_concurrently() {
    let (mut fake, addr) = Fake::tcp().await;
    // Every request waits for all four: they can only finish if all four are in flight at once.
    let barrier = Arc::new(Barrier::new(4));
    let service = tower::service_fn(move |req: Request<Incoming>| {
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            hello(req).await
        }
    });
    let sessions = serve(options(addr, 4), service).unwrap();
    let all = fake.sessions(4).await;
    for s in &all {
        assert_eq!(s.registration.identity, support::identity());
        assert_eq!(s.registration.capacity, Some(4));
    }
    registered(&sessions, 4).await;

    let mut requests = tokio::task::JoinSet::new();
    for (i, mut s) in all.into_iter().enumerate() {
        requests.spawn(async move { s.get(&format!("/r{i}")).await });
    }
    let mut bodies: Vec<String> = within(requests.join_all())
        .await
        .into_iter()
        .map(|r| r.body)
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["hello /r0", "hello /r1", "hello /r2", "hello /r3"]);
}

#[tokio::test]
async fn bytes_sent_with_the_101_are_the_first_request() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sessions = serve(
        options(listener.local_addr().unwrap(), 1),
        tower::service_fn(hello),
    )
    .unwrap();
    let (mut stream, _) = within(listener.accept()).await.unwrap();
    support::read_hello(&mut stream).await.unwrap();
    let mut segment = Reply::switching_protocols();
    segment.extend_from_slice(b"GET /first HTTP/1.1\r\nHost: app.example\r\n\r\n");
    stream.write_all(&segment).await.unwrap();

    let mut response = Vec::new();
    while !response.ends_with(b"hello /first") {
        let mut chunk = [0u8; 512];
        let n = within(stream.read(&mut chunk)).await.unwrap();
        assert_ne!(n, 0, "closed early: {}", String::from_utf8_lossy(&response));
        response.extend_from_slice(&chunk[..n]);
    }
    assert!(response.starts_with(b"HTTP/1.1 200 OK\r\n"));
    drop(sessions);
}

#[tokio::test]
async fn a_session_the_acceptor_closes_is_redialed() {
    let (mut fake, addr) = Fake::tcp().await;
    let sessions = serve(options(addr, 2), tower::service_fn(hello)).unwrap();
    let mut all = fake.sessions(2).await;
    all.pop();
    let mut replacement = fake.session().await;
    assert_eq!(replacement.get("/again").await.body, "hello /again");
    registered(&sessions, 2).await;
    // Two sessions now, three registrations since start: the re-dial shows as churn.
    assert_eq!(sessions.subscribe().borrow().registrations, 3);
}

#[tokio::test]
async fn shrinking_closes_idle_surplus_sessions_at_once() {
    let (mut fake, addr) = Fake::tcp().await;
    let sessions = serve(options(addr, 4), tower::service_fn(hello)).unwrap();
    let all = fake.sessions(4).await;
    registered(&sessions, 4).await;

    sessions.set_capacity(2);
    assert_eq!(sessions.capacity(), 2);
    // All four idle: two close without a request, the other two serve on.
    registered(&sessions, 2).await;
    let mut kept = Vec::new();
    for mut s in all {
        if s.try_get("/x").await.is_some() {
            kept.push(s);
        }
    }
    assert_eq!(kept.len(), 2);
    // The survivors are not retired too.
    for s in &mut kept {
        assert!(s.get("/y").await.headers.get(CONNECTION).is_none());
    }
    assert_eq!(sessions.registered(), 2);
    // Retired slots did not dial replacements.
    assert_eq!(fake.pending(), 0);
}

#[tokio::test]
async fn growing_dials_more_sessions() {
    let (mut fake, addr) = Fake::tcp().await;
    let sessions = serve(options(addr, 4), tower::service_fn(hello)).unwrap();
    let _first = fake.sessions(4).await;
    sessions.set_capacity(6);
    for mut s in fake.sessions(2).await {
        assert_eq!(s.registration.capacity, Some(6));
        assert_eq!(s.get("/more").await.body, "hello /more");
    }
    registered(&sessions, 6).await;
}

#[tokio::test]
async fn shutdown_drains_and_returns_only_after_every_session_is_closed() {
    let (mut fake, addr) = Fake::tcp().await;
    let sessions = serve(options(addr, 3), tower::service_fn(hello)).unwrap();
    let mut all = fake.sessions(3).await;
    registered(&sessions, 3).await;
    let mut status = sessions.subscribe();
    let shutdown = tokio::spawn(sessions.shutdown());

    match fake.next().await {
        Event::Drain(drain) => assert_eq!(drain.identity, support::identity()),
        _ => panic!("expected the drain request"),
    }
    // The proxy closes two sessions; the SDK sees it, but must keep waiting for the third.
    all.truncate(1);
    within(status.wait_for(|s| s.registered == 1))
        .await
        .unwrap();
    assert!(!shutdown.is_finished());
    assert_eq!(all[0].get("/late").await.body, "hello /late");

    all.clear();
    within(shutdown).await.unwrap().unwrap();
    assert_eq!(status.borrow().registered, 0);
    // Every slot has ended, so nothing can dial any more.
    assert_eq!(fake.pending(), 0);
}

#[tokio::test]
async fn a_websocket_style_upgrade_consumes_the_session_and_it_is_replaced() {
    let (mut fake, addr) = Fake::tcp().await;
    let service = tower::service_fn(|mut req: Request<Incoming>| async move {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move { drop(upgrade.await) });
        let res = Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(Full::new(Bytes::new()))
            .unwrap();
        Ok::<_, std::convert::Infallible>(res)
    });
    let sessions = serve(options(addr, 1), service).unwrap();
    let mut s = fake.session().await;
    registered(&sessions, 1).await;
    let req = Request::get("/ws")
        .header("host", "app.example")
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .body(Full::default())
        .unwrap();
    let res = s.send(req).await;
    assert_eq!(res.status(), StatusCode::SWITCHING_PROTOCOLS);
    let _upgraded = within(hyper::upgrade::on(res)).await.unwrap();
    let _replacement = fake.session().await;
}
