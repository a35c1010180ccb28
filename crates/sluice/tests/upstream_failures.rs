//! Static clusters when endpoints fail: error statuses with short reasons (never a hang),
//! passive ejection and recovery, the stale keep-alive retry, and active health checks.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::Request;
use http_body_util::Full;
use support::upstream::{
    count_by_backend, endpoint, wait_until, within, ObservedBackend, RawBackend, RefusingPort,
};
use support::{get, static_config, Backend, Reply, TestProxy};

async fn fetch(proxy: &TestProxy, path: &str) -> Reply {
    within("request", get(&support::client(), &proxy.url(path))).await
}

async fn sequential(client: &support::Client, proxy: &TestProxy, n: usize) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        replies.push(within("request", get(client, &proxy.url("/"))).await);
    }
    replies
}

#[track_caller]
fn assert_plain_error(reply: &Reply, status: u16, reason: &str) {
    assert_eq!(
        (reply.status.as_u16(), reply.body.as_str()),
        (status, format!("{reason}\n").as_str())
    );
    assert_eq!(reply.headers["content-type"], "text/plain; charset=utf-8");
}

/// Lets `backoff` of cluster time pass at once. Only call it while no request is running:
/// paused time jumps to the next timer whenever the runtime waits for loopback I/O.
async fn skip_time(backoff: Duration) {
    tokio::time::pause();
    tokio::time::advance(backoff).await;
    tokio::time::resume();
}

#[tokio::test]
async fn refused_then_ejected_then_recovered_after_the_backoff() {
    let (dead, other) = (RefusingPort::new(), RefusingPort::new());
    let extra = r#"lb = "round_robin"
ejection = { backoff = "5s", max_backoff = "20s" }"#;
    let proxy = TestProxy::start(&static_config(&[dead.addr, other.addr], extra)).await;

    assert_plain_error(&fetch(&proxy, "/").await, 502, "upstream connect failed");
    let unavailable = "no healthy upstream";
    assert_plain_error(&fetch(&proxy, "/").await, 503, unavailable);

    // The backend comes back on its port; its ejection still holds until the backoff ends.
    let revived = Backend::start_on("revived", dead.listen()).await;
    assert_plain_error(&fetch(&proxy, "/").await, 503, unavailable);
    assert_eq!(revived.connections(), 0);
    skip_time(Duration::from_secs(5)).await;

    for _ in 0..4 {
        let reply = fetch(&proxy, "/x").await;
        assert_eq!(
            (reply.status.as_u16(), reply.body.as_str()),
            (200, "revived /x")
        );
    }
}

#[tokio::test]
async fn a_dead_endpoint_is_skipped_and_not_retried_within_its_backoff() {
    let dead = RefusingPort::new();
    let live = Backend::start("live").await;
    // Round robin starts at the first endpoint, so the first request meets the dead one.
    let extra = r#"lb = "round_robin"
ejection = { backoff = "5s", max_backoff = "20s" }"#;
    let proxy = TestProxy::start(&static_config(&[dead.addr, live.addr], extra)).await;
    let client = support::client();

    let mut replies = sequential(&client, &proxy, 10).await;
    // Were the dead endpoint tried again within its backoff, it would now get requests.
    let revived = Backend::start_on("revived", dead.listen()).await;
    replies.extend(sequential(&client, &proxy, 10).await);

    assert_eq!(count_by_backend(&replies)["live"], 20);
    assert_eq!(revived.requests(), 0);
    skip_time(Duration::from_secs(5)).await;
    let after = sequential(&client, &proxy, 10).await;
    assert_eq!(count_by_backend(&after)["revived"], 5);
}

#[tokio::test]
async fn response_timeout_is_504() {
    let backend = ObservedBackend::start("a").await;
    let extra = r#"response_timeout = "100ms""#;
    let proxy = TestProxy::start(&static_config(&[backend.addr], extra)).await;

    // `/wait` is never released: only the timeout can end the exchange.
    assert_plain_error(
        &fetch(&proxy, "/wait").await,
        504,
        "upstream response timed out",
    );
    assert_eq!(backend.requests(), 1);
}

/// Linux drops a SYN to a listener whose accept queue is full, so the connect hangs until
/// the connect timeout.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn connect_timeout_is_504() {
    let blackhole = support::upstream::BlackholePort::new().await;
    let extra = r#"connect_timeout = "100ms""#;
    let proxy = TestProxy::start(&static_config(&[blackhole.addr], extra)).await;

    assert_plain_error(&fetch(&proxy, "/").await, 504, "upstream connect timed out");
}

#[tokio::test]
async fn a_backend_answering_garbage_is_502() {
    let backend = RawBackend::garbage().await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;

    assert_plain_error(&fetch(&proxy, "/").await, 502, "upstream protocol error");
    assert_eq!(backend.stats.answered.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_get_on_a_stale_pooled_connection_is_retried_on_a_fresh_one() {
    let backend = RawBackend::one_request_per_connection().await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;
    let client = support::client();

    let first = within("first", get(&client, &proxy.url("/"))).await;
    let second = within("second", get(&client, &proxy.url("/"))).await;

    assert_eq!((first.status.as_u16(), first.body.as_str()), (200, "ok"));
    assert_eq!((second.status.as_u16(), second.body.as_str()), (200, "ok"));
    // The second request went out on the pooled connection, which the backend closed.
    assert_eq!(backend.stats.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(backend.connections(), 2);
}

#[tokio::test]
async fn a_post_on_a_stale_pooled_connection_is_not_retried() {
    let backend = RawBackend::one_request_per_connection().await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;
    let client = support::client();
    let warm = within("warm-up", get(&client, &proxy.url("/"))).await;
    assert_eq!(warm.status, 200);

    let post = Request::post(proxy.url("/submit"))
        .body(Full::from("payload"))
        .unwrap();
    let reply = within("post", support::send(&client, post)).await;

    assert_plain_error(&reply, 502, "upstream protocol error");
    assert_eq!(backend.stats.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(backend.connections(), 1, "the POST was sent twice");
}

#[tokio::test]
async fn health_checks_take_a_failing_endpoint_out_and_back_in() {
    let (good, flaky) = (
        ObservedBackend::start("good").await,
        ObservedBackend::start("flaky").await,
    );
    flaky.healthy.store(false, Ordering::SeqCst);
    let extra = r#"lb = "round_robin"
health_check = { path = "/healthz", interval = "50ms", timeout = "1s", unhealthy_threshold = 2, healthy_threshold = 1 }"#;
    let proxy = TestProxy::start(&static_config(&[good.addr, flaky.addr], extra)).await;
    // Checks start with the cluster's first request.
    assert_eq!(fetch(&proxy, "/").await.status, 200);
    let (good_ep, flaky_ep) = (endpoint(&proxy, good.addr), endpoint(&proxy, flaky.addr));

    wait_until("flaky marked unhealthy", || !flaky_ep.is_healthy()).await;
    let replies = sequential(&support::client(), &proxy, 20).await;
    assert_eq!(count_by_backend(&replies)["good"], 20);
    assert!(good_ep.is_healthy());

    flaky.healthy.store(true, Ordering::SeqCst);
    wait_until("flaky back in rotation", || flaky_ep.is_healthy()).await;
    let replies = sequential(&support::client(), &proxy, 20).await;
    let counts = count_by_backend(&replies);
    assert_eq!((counts["good"], counts["flaky"]), (10, 10));
}
