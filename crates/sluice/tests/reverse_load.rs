//! Deterministic concurrency: overload queues instead of reaching the service, load rotates
//! across instances, and a drain under load loses nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use http::StatusCode;
use reverse_support::service::dial_raw;
use reverse_support::{get, start_proxy, Service, ServiceSpec, DEFAULT_ROUTE};
use sluice_session::Drain;

/// Sends `total` GETs of `path`, `concurrency` at a time; returns the statuses' bodies.
async fn load(
    addr: std::net::SocketAddr,
    path: &str,
    total: usize,
    concurrency: usize,
) -> Vec<(StatusCode, String)> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (next, path) = (Arc::clone(&next), path.to_owned());
            tokio::spawn(async move {
                let mut out = Vec::new();
                while next.fetch_add(1, Ordering::SeqCst) < total {
                    let res = get(addr, &path).await;
                    out.push((res.status, res.text()));
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_queues_and_never_exceeds_registered_sessions() {
    let proxy = start_proxy("queue_timeout = \"10s\"", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 4)).await;
    proxy.idle("default", 4).await;
    let results = load(proxy.http, "/delay/5", 40, 40).await;
    assert_eq!(results.len(), 40);
    assert!(
        results.iter().all(|(s, _)| *s == StatusCode::OK),
        "{results:?}"
    );
    assert_eq!(svc.requests(), 40);
    assert!(
        svc.max_in_flight() <= 4,
        "max in flight {}",
        svc.max_in_flight()
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_instances_share_load_within_ten_percent() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let a = Service::start(proxy.acceptor, ServiceSpec::new("a", 4)).await;
    let b = Service::start(proxy.acceptor, ServiceSpec::new("b", 4)).await;
    proxy.idle("default", 8).await;
    let results = load(proxy.http, "/delay/1", 400, 8).await;
    assert!(results.iter().all(|(s, _)| *s == StatusCode::OK));
    let (ra, rb) = (a.requests() as f64, b.requests() as f64);
    assert_eq!(ra + rb, 400.0);
    assert!((ra - 200.0).abs() <= 20.0, "a served {ra}, b served {rb}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_take_turns_by_idle_sessions_and_reuse_their_last_session() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let _a = Service::start(proxy.acceptor, ServiceSpec::new("a", 8)).await;
    let _b = Service::start(proxy.acceptor, ServiceSpec::new("b", 4)).await;
    proxy.idle("default", 12).await;
    let mut served = Vec::new();
    for _ in 0..120 {
        let res = get(proxy.http, "/session").await;
        assert_eq!(res.status, StatusCode::OK);
        served.push(res.text());
    }
    // Turns follow the idle ring, one per idle session: a with 8 gets twice b's share.
    let a = served.iter().filter(|s| s.starts_with("a:")).count();
    assert_eq!((a, served.len() - a), (80, 40), "{served:?}");
    // One request at a time: each instance reuses the session it got back last, so a single
    // session per instance carries all of its requests (warm, instead of cycling through 12).
    let mut sessions: Vec<&String> = served.iter().collect();
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_under_load_loses_no_request_and_closes_every_session() {
    let proxy = start_proxy("queue_timeout = \"10s\"", DEFAULT_ROUTE).await;
    let a = Service::start(proxy.acceptor, ServiceSpec::new("a", 3)).await;
    let b = Service::start(proxy.acceptor, ServiceSpec::new("b", 3)).await;
    proxy.idle("default", 6).await;
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (stop, addr) = (Arc::clone(&stop), proxy.http);
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    statuses.push(get(addr, "/delay/2").await.status);
                }
                statuses
            })
        })
        .collect();
    // Let the load reach both instances before draining one.
    while a.requests() < 10 {
        tokio::task::yield_now().await;
    }
    let drain = Drain {
        identity: ServiceSpec::new("a", 1).registration().identity,
    };
    assert_eq!(dial_raw(proxy.acceptor, &drain.encode()).await.1, 200);
    a.wait_live(0).await;
    let served_by_b = b.requests();
    while b.requests() < served_by_b + 20 {
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for c in clients {
        let statuses = c.await.unwrap();
        total += statuses.len();
        assert!(
            statuses.iter().all(|s| *s == StatusCode::OK),
            "{statuses:?}"
        );
    }
    proxy
        .cluster
        .wait_until(|c| c.instance_sessions("a") == 0)
        .await;
    assert_eq!(total, a.requests() + b.requests());
    proxy.stop().await;
}
