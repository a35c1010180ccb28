//! Static clusters under normal load: how requests spread over endpoints, and how upstream
//! connections are reused, capped and closed when idle.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use support::upstream::{
    count_by_backend, endpoint, static_cluster, wait_until, within, ObservedBackend,
};
use support::{get, static_config, Backend, Reply, TestProxy};

async fn three_backends() -> [Backend; 3] {
    [
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    ]
}

async fn sequential(proxy: &TestProxy, path: &str, n: usize) -> Vec<Reply> {
    let client = support::client();
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        replies.push(within("request", get(&client, &proxy.url(path))).await);
    }
    replies
}

#[tokio::test]
async fn round_robin_spreads_sequential_requests_exactly_evenly() {
    let backends = three_backends().await;
    let addrs = backends.each_ref().map(|b| b.addr);
    let proxy = TestProxy::start(&static_config(&addrs, r#"lb = "round_robin""#)).await;

    let counts = count_by_backend(&sequential(&proxy, "/", 300).await);

    let expected = [("a", 100), ("b", 100), ("c", 100)].map(|(n, c)| (n.to_owned(), c));
    assert_eq!(counts, expected.into_iter().collect());
}

#[tokio::test]
async fn random_p2c_and_least_request_use_every_endpoint() {
    for lb in ["random", "p2c", "least_request"] {
        let backends = three_backends().await;
        let addrs = backends.each_ref().map(|b| b.addr);
        let proxy = TestProxy::start(&static_config(&addrs, &format!("lb = \"{lb}\""))).await;

        let counts = count_by_backend(&sequential(&proxy, "/", 600).await);

        // A fair pick gives each endpoint Binomial(600, 1/3): mean 200, sd 11.5. Half the
        // mean is more than 8 sd away, so a correct balancer never fails this band.
        assert_eq!(counts.len(), 3, "{lb}: {counts:?}");
        for (name, &count) in &counts {
            assert!((100..=300).contains(&count), "{lb}: {name} got {count}");
        }
    }
}

/// An endpoint already holding requests gets none of the new ones while two idle endpoints
/// are available: least_request picks the minimum, and p2c compares two distinct endpoints,
/// of which at least one is idle.
#[tokio::test]
async fn least_request_and_p2c_route_around_a_busy_endpoint() {
    for lb in ["least_request", "p2c"] {
        let slow = ObservedBackend::start("slow").await;
        let (a, b) = (Backend::start("a").await, Backend::start("b").await);
        let proxy = TestProxy::start(&static_config(&[slow.addr], &format!("lb = \"{lb}\""))).await;
        let client = support::client();
        // Park three requests on the cluster's only endpoint, then add two idle ones.
        let held: Vec<_> = (0..3)
            .map(|_| tokio::spawn(get_owned(client.clone(), proxy.url("/wait"))))
            .collect();
        wait_until("three requests held", || slow.in_flight() == 3).await;
        let cluster = static_cluster(&proxy);
        assert!(cluster.add_endpoint(a.addr) && cluster.add_endpoint(b.addr));

        let counts = count_by_backend(&sequential(&proxy, "/", 100).await);

        assert_eq!(
            slow.requests(),
            3,
            "{lb}: the busy endpoint got new requests"
        );
        assert_eq!(counts.values().sum::<usize>(), 100, "{lb}: {counts:?}");
        assert!(counts["a"] > 0 && counts["b"] > 0, "{lb}: {counts:?}");
        slow.open_gate();
        for h in held {
            let reply = within("held request", h).await.unwrap();
            assert_eq!(
                (reply.status.as_u16(), reply.body.as_str()),
                (200, "slow /wait")
            );
        }
    }
}

async fn get_owned(client: support::Client, url: String) -> Reply {
    get(&client, &url).await
}

#[tokio::test]
async fn sequential_requests_reuse_one_upstream_connection() {
    let backend = Backend::start("a").await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;

    let replies = sequential(&proxy, "/", 200).await;

    assert_eq!(count_by_backend(&replies)["a"], 200);
    assert_eq!((backend.requests(), backend.connections()), (200, 1));
}

#[tokio::test]
async fn concurrent_requests_open_no_more_connections_than_the_concurrency() {
    let backend = Backend::start("a").await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;
    let client = support::client();

    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (client, url) = (client.clone(), proxy.url("/delay/1"));
            tokio::spawn(async move {
                for _ in 0..25 {
                    assert_eq!(get(&client, &url).await.status, 200);
                }
            })
        })
        .collect();
    for w in workers {
        within("worker", w).await.unwrap();
    }

    assert_eq!(backend.requests(), 200);
    let overlap = backend.stats.max_in_flight.load(Ordering::SeqCst);
    assert!(overlap > 1, "the requests never overlapped");
    assert!(
        backend.connections() <= 8,
        "{} upstream connections for 8 concurrent clients",
        backend.connections()
    );
}

#[tokio::test]
async fn max_requests_per_connection_retires_connections() {
    let backend = Backend::start("a").await;
    let extra = "pool = { max_requests_per_connection = 10 }";
    let proxy = TestProxy::start(&static_config(&[backend.addr], extra)).await;

    count_by_backend(&sequential(&proxy, "/", 100).await);

    assert_eq!((backend.requests(), backend.connections()), (100, 10));
}

#[tokio::test]
async fn max_idle_zero_opens_a_connection_per_request() {
    let backend = Backend::start("a").await;
    let extra = "pool = { max_idle_per_endpoint = 0 }";
    let proxy = TestProxy::start(&static_config(&[backend.addr], extra)).await;

    count_by_backend(&sequential(&proxy, "/", 20).await);

    assert_eq!((backend.requests(), backend.connections()), (20, 20));
}

/// Time is paused only between requests: while requests run, paused time would jump to the
/// next timer whenever the runtime waits for loopback I/O.
#[tokio::test]
async fn idle_pooled_connections_close_after_the_idle_timeout() {
    let backend = ObservedBackend::start("a").await;
    let extra = r#"pool = { idle_timeout = "2s" }"#;
    let proxy = TestProxy::start(&static_config(&[backend.addr], extra)).await;
    let ep = endpoint(&proxy, backend.addr);
    assert_eq!(sequential(&proxy, "/", 1).await[0].status, 200);
    assert_eq!((ep.idle_connections(), backend.open_connections()), (1, 1));

    tokio::time::pause();
    tokio::time::advance(Duration::from_millis(1900)).await;
    settle().await;
    assert_eq!(ep.idle_connections(), 1, "reaped before the idle timeout");
    tokio::time::advance(Duration::from_secs(2)).await;
    tokio::time::resume();

    wait_until("idle connection reaped", || ep.idle_connections() == 0).await;
    wait_until("backend sees the close", || backend.open_connections() == 0).await;
    assert_eq!(sequential(&proxy, "/", 1).await[0].status, 200);
    assert_eq!(backend.connections(), 2);
}

/// Gives woken tasks (the idle reaper) a chance to run without letting paused time move.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}
