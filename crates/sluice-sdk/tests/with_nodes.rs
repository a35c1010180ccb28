//! Many nodes, for real: three `sluice` proxies in-process (each on its own thread and
//! runtime, listener and acceptor on 127.0.0.1:0), one instance dialing all three with an
//! acceptor list. Its sessions follow the queue, leave a node that stops or dies, and the
//! requests in flight at the service never exceed its capacity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::gated;
use crate::proxy;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gated::Gated;
use http::StatusCode;
use proxy::{get, options_for, registered, within, RunningProxy};
use sluice_sdk::{serve, Acceptor, NodeStatus, Sessions};
use tokio::sync::Semaphore;

/// Three nodes, and an instance `a` of `api` with `capacity` sessions dialing all of them.
async fn three(capacity: usize, service: Gated) -> (Vec<RunningProxy>, Sessions) {
    three_with(capacity, service, Duration::from_millis(300)).await
}

/// [`three`], with this `node_grace`.
async fn three_with(
    capacity: usize,
    service: Gated,
    node_grace: Duration,
) -> (Vec<RunningProxy>, Sessions) {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(RunningProxy::any_port().await);
    }
    let list = nodes.iter().map(|n| n.acceptor.to_string()).collect();
    let mut options = options_for(Acceptor::List(list), "a", capacity);
    options.node_grace = node_grace;
    let sessions = serve(options, service).unwrap();
    (nodes, sessions)
}

/// Waits until node `i` holds `n` sessions of instance `a`.
async fn holds(node: &RunningProxy, n: usize) {
    within(node.cluster.wait_until(|c| c.instance_sessions("a") == n)).await;
}

async fn nodes_until(sessions: &Sessions, ready: impl Fn(&[NodeStatus]) -> bool) {
    let mut status = sessions.subscribe();
    let waited = tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| ready(&s.nodes)));
    if waited.await.is_err() {
        panic!("the test hung; nodes: {:#?}", sessions.nodes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_move_to_the_node_whose_requests_queue() {
    let service = Gated::new(false, None, "hello from a");
    let (nodes, sessions) = three(6, service.clone()).await;
    registered(&sessions, 6).await;
    for node in &nodes {
        holds(node, 2).await;
    }
    // Ten requests at node 0, which holds two sessions: two in flight, eight queued.
    let http = nodes[0].http;
    let clients: Vec<_> = (0..10).map(|_| tokio::spawn(get(http))).collect();
    // The others are asked to retire sessions (idle, so at once), and the instance dials
    // node 0 instead: the target there is 4 (one each elsewhere, by the split).
    holds(&nodes[0], 4).await;
    holds(&nodes[1], 1).await;
    holds(&nodes[2], 1).await;
    within(async {
        while service.in_flight.load(Ordering::SeqCst) < 4 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    service.gate.add_permits(Semaphore::MAX_PERMITS);
    for client in clients {
        assert_eq!(
            within(client).await.unwrap(),
            (StatusCode::OK, "hello from a".into())
        );
    }
    assert!(
        service.max() <= 6,
        "{} requests in flight at once",
        service.max()
    );
    within(sessions.shutdown()).await.unwrap();
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_says_draining_and_its_share_moves() {
    let (mut nodes, sessions) = three(6, Gated::new(true, None, "hello from a")).await;
    registered(&sessions, 6).await;
    for node in &nodes {
        holds(node, 2).await;
    }
    let stopped = nodes.pop().unwrap();
    stopped.stop().await;
    holds(&nodes[0], 3).await;
    holds(&nodes[1], 3).await;
    nodes_until(&sessions, |n| n.len() == 3 && !n[2].live && n[2].held == 0).await;
    for node in &nodes {
        assert_eq!(get(node.http).await.0, StatusCode::OK);
    }
    within(sessions.shutdown()).await.unwrap();
    for node in nodes {
        node.stop().await;
    }
}

/// Issue 46: a node stopped gracefully (SIGTERM: its links say `DRAINING`) while requests
/// wait in its admission queue answers every one of them, and its share then moves. The SDK
/// used to close its sessions there at `DRAINING` (busy ones after their response), so the
/// queued requests found none left and were answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_with_requests_queued_answers_every_one() {
    let service = Gated::new(false, None, "hello from a");
    let mut nodes = Vec::new();
    for _ in 0..3 {
        // A grace no machine's load outlasts: the requests need not hurry once it stops.
        nodes.push(RunningProxy::with_grace("20s").await);
    }
    let list = nodes.iter().map(|n| n.acceptor.to_string()).collect();
    let sessions = serve(options_for(Acceptor::List(list), "a", 6), service.clone()).unwrap();
    registered(&sessions, 6).await;
    let stopping = nodes.pop().unwrap();
    let clients: Vec<_> = (0..8).map(|_| tokio::spawn(get(stopping.http))).collect();
    // Every request is in the handler or queued: at most 6 sessions, so 2 or more queue. (The
    // handler's count moves without telling the cluster: polled.)
    within(async {
        loop {
            let queued = stopping.cluster.queued("default");
            if queued >= 2 && queued + service.in_flight.load(Ordering::SeqCst) == 8 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let stopped = tokio::spawn(stopping.stop());
    nodes_until(&sessions, |n| n.len() == 3 && n[2].link == "draining").await;
    service.gate.add_permits(1_000);
    for client in clients {
        let (status, body) = within(client).await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "hello from a"));
    }
    within(stopped).await.unwrap();
    // Its share moved as it closed its sessions.
    registered(&sessions, 6).await;
    nodes_until(&sessions, |n| n[2].held == 0 && n[0].held + n[1].held == 6).await;
    assert!(
        service.max() <= 6,
        "{} requests in flight at once",
        service.max()
    );
    within(sessions.shutdown()).await.unwrap();
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_dies_is_down_at_once_and_its_share_moves() {
    // No grace to wait for: the dead node's acceptor refuses the link's redial.
    let forever = Duration::from_secs(3600);
    let service = Gated::new(true, None, "hello from a");
    let (mut nodes, sessions) = three_with(6, service, forever).await;
    registered(&sessions, 6).await;
    for node in &nodes {
        holds(node, 2).await;
    }
    let dead: SocketAddr = nodes[2].acceptor;
    nodes.pop().unwrap().kill().await;
    holds(&nodes[0], 3).await;
    holds(&nodes[1], 3).await;
    nodes_until(&sessions, |n| {
        n.iter().any(|n| n.address == dead && n.link == "down")
    })
    .await;
    registered(&sessions, 6).await;
    within(sessions.shutdown()).await.unwrap();
    for node in nodes {
        node.stop().await;
    }
}
