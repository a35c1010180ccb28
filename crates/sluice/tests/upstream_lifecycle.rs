//! Changes while requests flow: endpoints added and removed through the cluster handle, and
//! graceful shutdown with requests in flight (drained, or cut at the grace deadline).
#![allow(clippy::unwrap_used)]

use crate::support;

use support::upstream::{
    count_by_backend, endpoint, static_cluster, try_get, wait_until, within, ObservedBackend,
};
use support::{get, static_config, Backend, Client, Reply, TestProxy};
use tokio::net::TcpStream;

async fn sequential(client: &Client, proxy: &TestProxy, n: usize) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        replies.push(within("request", get(client, &proxy.url("/"))).await);
    }
    replies
}

/// Starts `n` `/wait` requests, each on its own client connection.
fn start_held(proxy: &TestProxy, n: usize) -> Vec<tokio::task::JoinHandle<Result<Reply, String>>> {
    (0..n)
        .map(|_| {
            let url = proxy.url("/wait");
            tokio::spawn(async move { try_get(&support::client(), &url).await })
        })
        .collect()
}

#[tokio::test]
async fn an_added_endpoint_gets_traffic_and_a_removed_one_finishes_in_flight_work() {
    let old = ObservedBackend::start("old").await;
    let new = Backend::start("new").await;
    let extra = r#"lb = "round_robin""#;
    let proxy = TestProxy::start(&static_config(&[old.addr], extra)).await;
    let cluster = static_cluster(&proxy);
    let client = support::client();
    assert_eq!(
        count_by_backend(&sequential(&client, &proxy, 4).await)["old"],
        4
    );
    let held = start_held(&proxy, 1);
    wait_until("request held by old", || old.in_flight() == 1).await;
    let old_ep = endpoint(&proxy, old.addr);

    assert!(cluster.add_endpoint(new.addr));
    let counts = count_by_backend(&sequential(&client, &proxy, 10).await);
    assert_eq!((counts["old"], counts["new"]), (5, 5));

    assert!(cluster.remove_endpoint(old.addr));
    assert!(!cluster.remove_endpoint(old.addr));
    let counts = count_by_backend(&sequential(&client, &proxy, 10).await);
    assert_eq!(counts["new"], 10, "{counts:?}");
    assert_eq!(old.requests(), 4 + 1 + 5);

    old.open_gate();
    let reply = within("held request", held.into_iter().next().unwrap()).await;
    let reply = reply.unwrap().unwrap();
    assert_eq!(
        (reply.status.as_u16(), reply.body.as_str()),
        (200, "old /wait")
    );
    // Nothing goes back into a removed endpoint's pool: its connections all close.
    wait_until("old's connections closed", || old.open_connections() == 0).await;
    assert_eq!(old_ep.idle_connections(), 0);
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests_and_refuses_new_connections() {
    let backend = ObservedBackend::start("a").await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;
    let held = start_held(&proxy, 4);
    wait_until("four requests held", || backend.in_flight() == 4).await;

    proxy.shutdown();
    within("listener closed", async {
        while TcpStream::connect(proxy.addr()).await.is_ok() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(backend.in_flight(), 4, "in-flight requests ended early");
    backend.open_gate();

    for h in held {
        let reply = within("held request", h).await.unwrap().unwrap();
        assert_eq!(
            (reply.status.as_u16(), reply.body.as_str()),
            (200, "a /wait")
        );
    }
    within("proxy task", proxy.task).await.unwrap();
}

#[tokio::test]
async fn shutdown_grace_expiry_cuts_requests_and_ends_the_proxy() {
    let backend = ObservedBackend::start("a").await;
    let toml = static_config(&[backend.addr], "")
        .replace(r#"shutdown_grace = "5s""#, r#"shutdown_grace = "200ms""#);
    let proxy = TestProxy::start(&toml).await;
    let held = start_held(&proxy, 1);
    wait_until("request held", || backend.in_flight() == 1).await;

    proxy.shutdown();

    within("proxy task past its grace", proxy.task)
        .await
        .unwrap();
    let outcome = within("cut request", held.into_iter().next().unwrap()).await;
    assert!(outcome.unwrap().is_err(), "the request outlived the grace");
}
