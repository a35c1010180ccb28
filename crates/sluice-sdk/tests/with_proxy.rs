//! The SDK against the real proxy: a `sluice::Proxy` built from TOML text, with its listener
//! and acceptor on 127.0.0.1:0, and SDK instances that dial in and register sessions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::proxy;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use proxy::{config, get, instance, load, registered, within, RunningProxy};
use sluice::Proxy;
use sluice_sdk::{serve, Identity, Options};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_queues_in_the_proxy_and_never_exceeds_the_sessions() {
    let proxy = RunningProxy::any_port().await;
    let (sessions, counter) = instance(proxy.acceptor, "a", 4, Duration::from_millis(10));
    registered(&sessions, 4).await;
    proxy.idle(4).await;

    // 40 clients at once, ten times the capacity, three requests each.
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let addr = proxy.http;
        clients.spawn(async move {
            let mut replies = Vec::new();
            for _ in 0..3 {
                replies.push(get(addr).await);
            }
            replies
        });
    }
    let replies = within(clients.join_all()).await.concat();
    assert_eq!(replies.len(), 120);
    for (status, body) in &replies {
        assert_eq!((*status, body.as_str()), (StatusCode::OK, "hello from a"));
    }
    assert_eq!(counter.served(), 120);
    assert_eq!(
        counter.max_in_flight(),
        4,
        "the service saw more or less than its sessions"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_redials_a_restarted_proxy_at_the_same_address() {
    let first = RunningProxy::any_port().await;
    let (http, acceptor) = (first.http, first.acceptor);
    let (sessions, counter) = instance(acceptor, "a", 3, Duration::ZERO);
    registered(&sessions, 3).await;
    first.idle(3).await;
    assert_eq!(get(http).await.0, StatusCode::OK);

    first.stop().await;
    // Every session ended with the proxy; the SDK keeps re-dialing a closed port meanwhile.
    registered(&sessions, 0).await;
    let second = RunningProxy::start(http, acceptor).await;
    registered(&sessions, 3).await;
    second.idle(3).await;
    for _ in 0..6 {
        assert_eq!(get(http).await, (StatusCode::OK, "hello from a".into()));
    }
    assert_eq!(counter.served(), 7);
    within(sessions.shutdown()).await.unwrap();
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_under_continuous_load_loses_no_request() {
    let proxy = RunningProxy::any_port().await;
    let work = Duration::from_millis(2);
    let (a, a_counter) = instance(proxy.acceptor, "a", 4, work);
    let (b, b_counter) = instance(proxy.acceptor, "b", 4, work);
    registered(&a, 4).await;
    registered(&b, 4).await;
    proxy.idle(8).await;

    let stop = Arc::new(AtomicBool::new(false));
    let statuses = load(proxy.http, 8, Arc::clone(&stop));
    a_counter.served_at_least(20).await;
    within(a.shutdown()).await.unwrap();
    within(proxy.cluster.wait_until(|c| c.instance_sessions("a") == 0)).await;
    // The load goes on, now to `b` alone.
    let b_before = b_counter.served();
    b_counter.served_at_least(b_before + 20).await;
    stop.store(true, Ordering::SeqCst);
    let statuses = within(statuses).await.unwrap();

    assert!(statuses.len() >= 40, "{} requests", statuses.len());
    let failed: Vec<_> = statuses.iter().filter(|s| !s.is_success()).collect();
    assert!(failed.is_empty(), "non-2xx during the drain: {failed:?}");
    assert_eq!(proxy.cluster.instance_sessions("a"), 0);
    assert_eq!(proxy.cluster.instance_sessions("b"), 4);
    within(b.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_capacity_closes_sessions_at_the_proxy() {
    let proxy = RunningProxy::any_port().await;
    let (sessions, _counter) = instance(proxy.acceptor, "a", 4, Duration::ZERO);
    registered(&sessions, 4).await;
    proxy.idle(4).await;
    assert_eq!(proxy.cluster.instance_sessions("a"), 4);

    sessions.set_capacity(1);
    // A surplus session retires with its next response, so requests drive the shrink.
    within(async {
        while proxy.cluster.instance_sessions("a") > 1 {
            assert_eq!(get(proxy.http).await.0, StatusCode::OK);
        }
    })
    .await;
    registered(&sessions, 1).await;
    for _ in 0..3 {
        assert_eq!(get(proxy.http).await.0, StatusCode::OK);
    }
    assert_eq!(proxy.cluster.instance_sessions("a"), 1);
    assert_eq!(sessions.capacity(), 1);
    within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_stopped_in_process_closes_its_sessions() {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let proxy = Proxy::bind(&config(any, any)).await.unwrap();
    let (sessions, _counter) = instance(proxy.acceptor_addr().unwrap(), "a", 2, Duration::ZERO);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run_until(async move {
        let _ = stopped.await;
    }));
    registered(&sessions, 2).await;
    let _ = stop.send(());
    within(task).await.unwrap();
    registered(&sessions, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_the_address_the_proxy_saw_not_one_the_client_chose() {
    use sluice_sdk::ClientAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let proxy = RunningProxy::any_port().await;
    let mut options = Options::new(proxy.acceptor, Identity::new("api"));
    options.capacity = 1;
    let service = tower::service_fn(|req: Request<Incoming>| async move {
        let client = req.extensions().get::<ClientAddr>().copied();
        let body = client.map_or_else(|| "none".to_owned(), |c| c.to_string());
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::from(body)))
    });
    let sessions = serve(options, service).unwrap();
    proxy.idle(1).await;

    let mut client = TcpStream::connect(proxy.http).await.unwrap();
    let me = client.local_addr().unwrap();
    client
        .write_all(
            b"GET / HTTP/1.1\r\nHost: a\r\nSluice-Client-Addr: 6.6.6.6:1\r\n\
              X-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = String::new();
    within(client.read_to_string(&mut answer)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(&format!("\r\n\r\n{me}")), "{answer}");
    within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_drain_keeps_the_instance_out_and_shutdown_still_works() {
    let proxy = RunningProxy::any_port().await;
    let (sessions, _counter) = instance(proxy.acceptor, "a", 2, Duration::ZERO);
    registered(&sessions, 2).await;
    assert!(proxy.cluster.drain_and_hold("a"));

    // The SDK's re-dials are refused with 410: it stops, reports it, and stays out.
    let mut status = sessions.subscribe();
    let status = within(status.wait_for(|s| s.registered == 0 && s.last_error.is_some()))
        .await
        .unwrap()
        .clone();
    let error = status.last_error.unwrap();
    assert!(error.is_drained() && !error.is_retryable(), "{error}");
    let registrations = status.registrations;
    assert_eq!(proxy.cluster.instance_sessions("a"), 0);
    within(sessions.shutdown()).await.unwrap();
    assert_eq!(proxy.cluster.instance_sessions("a"), 0);
    assert_eq!(registrations, 2, "it must not have re-registered");

    // Resumed, the same instance id registers again.
    assert!(proxy.cluster.resume("a"));
    let (again, _counter) = instance(proxy.acceptor, "a", 1, Duration::ZERO);
    registered(&again, 1).await;
    within(again.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_closes_idle_sessions_at_once_and_the_next_burst_stays_within_it() {
    let proxy = RunningProxy::any_port().await;
    let (sessions, counter) = instance(proxy.acceptor, "a", 8, Duration::from_millis(20));
    registered(&sessions, 8).await;
    proxy.idle(8).await;

    sessions.set_capacity(2);
    // No request needed: the six idle surplus sessions close, and the proxy drops them.
    within(proxy.cluster.wait_until(|c| c.instance_sessions("a") == 2)).await;
    registered(&sessions, 2).await;
    let burst: Vec<_> = (0..8).map(|_| tokio::spawn(get(proxy.http))).collect();
    for request in burst {
        assert_eq!(within(request).await.unwrap().0, StatusCode::OK);
    }
    assert!(counter.max_in_flight() <= 2, "{}", counter.max_in_flight());
    within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_instance_comes_back_by_itself_within_one_probe() {
    let proxy = RunningProxy::any_port().await;
    let mut identity = Identity::new("api");
    identity.instance = Some("a".into());
    let mut options = Options::new(proxy.acceptor, identity);
    options.capacity = 2;
    options.drained_probe = Duration::from_millis(50);
    let sessions = serve(
        options,
        tower::service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(Full::<Bytes>::from("back")))
        }),
    )
    .unwrap();
    registered(&sessions, 2).await;
    assert!(proxy.cluster.drain_and_hold("a"));
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.registered == 0 && s.last_error.is_some()))
        .await
        .unwrap();
    assert!(sessions.last_error().unwrap().is_drained());

    // `sluice ctl resume`: nothing to do at the service.
    assert!(proxy.cluster.resume("a"));
    registered(&sessions, 2).await;
    proxy.idle(2).await;
    assert_eq!(get(proxy.http).await, (StatusCode::OK, "back".into()));
    within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}
