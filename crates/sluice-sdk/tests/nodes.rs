//! Many nodes (`protocol/README.md`, "Many nodes"): the SDK keeps a control link to each fake
//! node, splits its capacity by their demand, moves sessions by `RETIRE` (not by closing them
//! itself) while a node is live, vacates nodes that drain, die or leave the name, and never
//! holds more sessions in all than its capacity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::gated;
use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gated::Gated;
use http::header::CONNECTION;
use sluice_sdk::{serve, Acceptor, Resolver, Sessions};
use sluice_session::control::{Demand, NodeLine, ServiceLine};
use sluice_session::SplitBy;
use support::{hello, many, nodes_until, registered, within, Event, Fake, Link, MaxHeld};

fn demand(in_flight: u64, queued: u64) -> NodeLine {
    NodeLine::Demand(Demand {
        in_flight,
        queued,
        refused: 0,
        sessions: 0,
    })
}

/// Takes a node's control link: it must say the capacity first; the node then reports no
/// demand, which makes it live.
async fn up(fake: &mut Fake, capacity: u64) -> Link {
    let mut link = fake.link().await;
    assert_eq!(link.registration.identity, support::identity());
    assert_eq!(link.registration.capacity, Some(capacity as u32));
    assert_eq!(link.split, SplitBy::Service);
    assert_eq!(link.next().await, ServiceLine::Capacity(capacity));
    link.send(demand(0, 0)).await;
    link
}

/// Two live nodes holding two sessions each of an instance with capacity 4.
struct Two {
    sessions: Sessions,
    max: MaxHeld,
    a: Fake,
    b: Fake,
    la: Link,
    lb: Link,
    at_a: Vec<support::Session>,
    at_b: Vec<support::Session>,
}

/// Starts at capacity 0 so that both links are up before any session is placed, then sets 4.
async fn two<S: sluice_sdk::SessionService>(service: S) -> Two {
    two_with(service, |_| {}).await
}

/// [`two`], with options of the test's own.
async fn two_with<S: sluice_sdk::SessionService>(
    service: S,
    options: impl FnOnce(&mut sluice_sdk::Options),
) -> Two {
    let (mut a, a_addr) = Fake::node().await;
    let (mut b, b_addr) = Fake::node().await;
    let mut opts = many(&[a_addr, b_addr], 0);
    options(&mut opts);
    let sessions = serve(opts, service).unwrap();
    let max = MaxHeld::watch(&sessions);
    let mut la = up(&mut a, 0).await;
    let mut lb = up(&mut b, 0).await;
    nodes_until(&sessions, |n| n.len() == 2 && n.iter().all(|n| n.live)).await;
    sessions.set_capacity(4);
    assert_eq!(la.next().await, ServiceLine::Capacity(4));
    assert_eq!(lb.next().await, ServiceLine::Capacity(4));
    let at_a = a.sessions(2).await;
    let at_b = b.sessions(2).await;
    registered(&sessions, 4).await;
    Two {
        sessions,
        max,
        a,
        b,
        la,
        lb,
        at_a,
        at_b,
    }
}

#[tokio::test]
async fn the_first_sessions_wait_until_every_node_answered() {
    let (mut a, a_addr) = Fake::node().await;
    let (mut b, b_addr) = Fake::node().await;
    let (mut c, c_addr) = Fake::node().await;
    let sessions = serve(many(&[a_addr, b_addr, c_addr], 6), tower::service_fn(hello)).unwrap();
    let max = MaxHeld::watch(&sessions);
    // The nodes answer one after another, each live before the next says anything: the
    // first split still covers all three, rather than all six going to the first.
    let _la = up(&mut a, 6).await;
    nodes_until(&sessions, |n| n[0].live).await;
    let _lb = up(&mut b, 6).await;
    nodes_until(&sessions, |n| n[1].live).await;
    let _lc = up(&mut c, 6).await;
    let _at = (
        a.sessions(2).await,
        b.sessions(2).await,
        c.sessions(2).await,
    );
    registered(&sessions, 6).await;
    assert_eq!(a.pending() + b.pending() + c.pending(), 0, "no more dials");
    assert!(max.get() <= 6, "held {} sessions", max.get());
}

#[tokio::test]
async fn a_node_that_never_answers_holds_the_first_sessions_back_no_longer_than_a_handshake() {
    let (mut a, a_addr) = Fake::node().await;
    let (mut b, b_addr) = Fake::node().await;
    let (c, c_addr) = Fake::node().await;
    c.hold();
    let mut options = many(&[a_addr, b_addr, c_addr], 6);
    options.handshake_timeout = Duration::from_millis(200);
    let sessions = serve(options, tower::service_fn(hello)).unwrap();
    let _la = up(&mut a, 6).await;
    nodes_until(&sessions, |n| n[0].live).await;
    let _lb = up(&mut b, 6).await;
    // C's link dial times out; then the first split covers A and B.
    let _at = (a.sessions(3).await, b.sessions(3).await);
    registered(&sessions, 6).await;
    let nodes = sessions.nodes();
    assert_eq!((nodes[2].live, nodes[2].held), (false, 0));
}

#[tokio::test]
async fn a_node_that_counts_on_another_instance_for_its_floor_gets_none_from_this_one() {
    let (mut a, a_addr) = Fake::node().await;
    let (mut b, b_addr) = Fake::node().await;
    let sessions = serve(many(&[a_addr, b_addr], 4), tower::service_fn(hello)).unwrap();
    let mut la = a.link().await;
    let mut lb = b.link().await;
    assert_eq!((la.split, lb.split), (SplitBy::Service, SplitBy::Service));
    // A is busy; B is idle and holds its floor of another instance (FLOOR 0, before its
    // first DEMAND as a node sends it): all four sessions go to A.
    la.send(demand(3, 1)).await;
    lb.send(NodeLine::Floor(false)).await;
    lb.send(demand(0, 0)).await;
    let _at_a = a.sessions(4).await;
    registered(&sessions, 4).await;
    let nodes = sessions.nodes();
    assert_eq!((nodes[0].target, nodes[1].target), (4, 0));
    assert!(nodes[0].floor && !nodes[1].floor, "{nodes:?}");
    assert_eq!(b.pending(), 0);
}

#[tokio::test]
async fn sessions_follow_the_demand_by_retire_at_the_other_node() {
    let mut t = two(tower::service_fn(hello)).await;
    // Node B queues: it should hold more, and node A is asked to give one up.
    t.lb.send(demand(2, 10)).await;
    assert_eq!(t.la.retire().await, 1);
    // RETIRE, not SDK-side closes: both sessions at A still serve, without Connection: close.
    for s in &mut t.at_a {
        let reply = s.get("/still").await;
        assert!(reply.headers.get(CONNECTION).is_none());
    }
    let nodes = nodes_until(&t.sessions, |n| n[0].retiring == 1).await;
    assert_eq!((nodes[0].target, nodes[1].target), (1, 3));
    assert!(nodes[1].demand > nodes[0].demand);
    // The node closes one; its slot dials B at once.
    t.at_a.pop();
    t.at_b.push(t.b.session().await);
    nodes_until(&t.sessions, |n| n[0].held == 1 && n[1].held == 3).await;
    registered(&t.sessions, 4).await;
    assert_eq!(t.a.pending(), 0, "no new session at A");
    assert!(t.max.get() <= 4, "held {} sessions", t.max.get());
}

#[tokio::test]
async fn shrinking_retires_at_the_nodes_and_growing_dials_again() {
    let mut t = two(tower::service_fn(hello)).await;
    t.sessions.set_capacity(2);
    assert_eq!(t.la.next().await, ServiceLine::Capacity(2));
    assert_eq!(t.la.retire().await, 1);
    assert_eq!(t.lb.next().await, ServiceLine::Capacity(2));
    assert_eq!(t.lb.retire().await, 1);
    t.at_a.pop();
    t.at_b.pop();
    registered(&t.sessions, 2).await;
    nodes_until(&t.sessions, |n| n.iter().all(|n| n.held == 1)).await;
    assert_eq!(t.a.pending() + t.b.pending(), 0, "a shrink dials nothing");

    t.sessions.set_capacity(4);
    t.at_a.push(t.a.session().await);
    t.at_b.push(t.b.session().await);
    registered(&t.sessions, 4).await;
    assert!(t.max.get() <= 4, "held {} sessions", t.max.get());
}

/// Issue 46: the SDK closes nothing at a node that said `DRAINING`: its sessions answer what
/// the node queued (a busy one without `Connection: close`), and each one the node closes
/// moves to the other node, never more held in all than the capacity.
#[tokio::test]
async fn a_draining_node_closes_its_sessions_itself_and_each_one_moves() {
    let service = Gated::new(false, Some("/slow"), "done");
    let mut t = two(service.clone()).await;
    let mut busy = t.at_a.pop().unwrap();
    let slow = tokio::spawn(async move {
        let reply = busy.get("/slow").await;
        (reply, busy)
    });
    within(async {
        while service.in_flight.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    t.la.send(NodeLine::Draining).await;
    let nodes = nodes_until(&t.sessions, |n| !n[0].live).await;
    assert_eq!((nodes[0].target, nodes[1].target), (0, 4));
    assert_eq!(nodes[0].link, "draining");
    // The idle one answers a request the node had queued, and stays.
    let reply = t.at_a[0].get("/").await;
    assert_eq!(reply.body, "done");
    assert!(
        reply.headers.get(CONNECTION).is_none(),
        "{:?}",
        reply.headers
    );
    service.gate.add_permits(1);
    let (reply, busy) = within(slow).await.unwrap();
    assert_eq!(reply.body, "done");
    assert!(
        reply.headers.get(CONNECTION).is_none(),
        "{:?}",
        reply.headers
    );
    assert_eq!(
        t.a.pending() + t.b.pending(),
        0,
        "a dial beyond the capacity"
    );
    // The node closes them as nobody waits: each moves to B.
    drop(busy);
    t.at_b.push(t.b.session().await);
    drop(t.at_a.pop());
    t.at_b.push(t.b.session().await);
    nodes_until(&t.sessions, |n| n[0].held == 0 && n[1].held == 4).await;
    assert!(t.max.get() <= 4, "held {} sessions", t.max.get());
    assert!(service.max() <= 4);
}

/// A grace no test waits for: whatever happens, happens without it.
const FOREVER: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_node_that_dies_is_down_at_once_as_its_redial_is_refused() {
    let t = two_with(tower::service_fn(hello), |o| o.node_grace = FOREVER).await;
    let Two {
        sessions,
        max,
        a,
        mut b,
        la,
        lb: _lb,
        at_a,
        at_b: _at_b,
    } = t;
    // The node's process ends: its listener, link and sessions go at once, and the link's
    // redial is refused. Nothing listens there: no grace to wait for.
    drop((a, la, at_a));
    let _moved = b.sessions(2).await;
    let nodes = nodes_until(&sessions, |n| n[1].held == 4).await;
    assert_eq!(nodes[0].link, "down");
    assert!(!nodes[0].live);
    assert_eq!((nodes[0].target, nodes[1].target), (0, 4));
    assert!(max.get() <= 4, "held {} sessions", max.get());
}

#[tokio::test]
async fn a_silent_node_keeps_its_share() {
    let mut t = two_with(tower::service_fn(hello), |o| o.node_grace = FOREVER).await;
    // The node hangs: its link stays open but says nothing, and it takes connections
    // without answering them. The SDK gives up on the link after three missed heartbeats
    // and dials it again; a hung node is no dead one, so nothing moves.
    t.a.hold();
    t.la.silence();
    t.a.held().await;
    let nodes = t.sessions.nodes();
    assert!(nodes[0].live, "{nodes:?}");
    assert_eq!(nodes[0].link, "lost");
    assert_eq!((nodes[0].held, nodes[0].target), (2, 2));
    assert_eq!(t.b.pending(), 0);
}

#[tokio::test]
async fn a_node_without_a_link_for_the_grace_is_down_and_its_share_moves() {
    let mut t = two(tower::service_fn(hello)).await;
    // The link ends and its redials hang: not refused, so down only when the grace ends.
    t.a.hold();
    drop(t.la);
    t.a.held().await;
    let _moved = t.b.sessions(2).await;
    let nodes = nodes_until(&t.sessions, |n| n[1].held == 4).await;
    assert_eq!(nodes[0].link, "down");
    for s in &mut t.at_a {
        s.wait_closed().await;
    }
    assert!(t.max.get() <= 4, "held {} sessions", t.max.get());
}

#[tokio::test]
async fn a_hot_restart_is_never_down() {
    let mut t = two_with(tower::service_fn(hello), |o| o.node_grace = FOREVER).await;
    let mut status = t.sessions.subscribe();
    let watch = tokio::spawn(async move {
        // Every state the SDK publishes until the restart is over.
        let mut seen = Vec::new();
        loop {
            let nodes = status.borrow_and_update().nodes.clone();
            let back = nodes[0].link == "up" && !seen.is_empty();
            seen.push(nodes);
            if back || status.changed().await.is_err() {
                return seen;
            }
        }
    });
    // The old process hands its listening socket over and goes: its link ends, and the
    // redial queues (taken, not answered) until the new process answers it.
    t.a.hold();
    drop(t.la);
    t.a.held().await;
    assert_eq!(t.sessions.nodes()[0].link, "lost");
    t.a.answer();
    let mut again = t.a.link().await;
    assert_eq!(again.next().await, ServiceLine::Capacity(4));
    again.send(demand(0, 0)).await;
    let seen = within(watch).await.unwrap();
    for nodes in &seen {
        assert!(nodes[0].live && nodes[0].link != "down", "{nodes:?}");
        assert_eq!(nodes[0].held, 2, "{nodes:?}");
    }
    for s in &mut t.at_a {
        assert_eq!(s.get("/x").await.body, "hello /x");
    }
    assert_eq!(t.a.pending() + t.b.pending(), 0, "no session moved");
}

#[tokio::test]
async fn a_lost_link_within_the_grace_keeps_the_split() {
    let mut t = two(tower::service_fn(hello)).await;
    // The link drops but the sessions stay; the link comes back.
    drop(t.la);
    let mut again = t.a.link().await;
    assert_eq!(again.next().await, ServiceLine::Capacity(4));
    again.send(demand(0, 0)).await;
    let nodes = nodes_until(&t.sessions, |n| n[0].link == "up").await;
    assert!(nodes[0].live);
    assert_eq!((nodes[0].held, nodes[1].held), (2, 2));
    for s in &mut t.at_a {
        assert_eq!(s.get("/x").await.body, "hello /x");
    }
    assert_eq!(t.a.pending(), 0);
}

#[tokio::test]
async fn dns_re_resolution_joins_and_leaves_nodes() {
    let (mut a, a_addr) = Fake::node().await;
    let (mut b, b_addr) = Fake::node().await;
    let table = Arc::new(Mutex::new(vec![a_addr]));
    let names = table.clone();
    let mut options = many(&[], 2);
    options.acceptor = Acceptor::Dns {
        name: "nodes.test".into(),
        port: 7070,
    };
    options.resolve_interval = Duration::from_millis(20);
    options.resolver = Resolver::new(move |host, port| {
        assert_eq!((host.as_str(), port), ("nodes.test", 7070));
        let addrs: Vec<SocketAddr> = names.lock().unwrap().clone();
        async move { Ok(addrs) }
    });
    let sessions = serve(options, tower::service_fn(hello)).unwrap();
    let max = MaxHeld::watch(&sessions);
    let mut la = up(&mut a, 2).await;
    let mut at_a = a.sessions(2).await;

    // B joins: it gets its share, by a RETIRE at A.
    table.lock().unwrap().push(b_addr);
    let _lb = up(&mut b, 2).await;
    assert_eq!(la.retire().await, 1);
    at_a.pop();
    let mut at_b = vec![b.session().await];

    // A leaves the name: it is asked to retire everything it holds, then its link closes.
    table.lock().unwrap().retain(|&x| x == b_addr);
    assert_eq!(la.retire().await, 1);
    at_a.pop();
    at_b.push(b.session().await);
    la.closed().await;
    let nodes = nodes_until(&sessions, |n| n.len() == 1).await;
    assert_eq!((nodes[0].address, nodes[0].held), (b_addr, 2));
    assert!(max.get() <= 2, "held {} sessions", max.get());
}

/// Issue 46: a node back under a new address (a restarted pod) was found only at the next
/// `resolve_interval`. A node lost is a change suspected: the names are resolved again within
/// seconds, however long the interval.
#[tokio::test]
async fn a_lost_node_makes_the_name_resolve_again_soon() {
    let (mut a, a_addr) = Fake::node().await;
    let (mut b, b_addr) = Fake::node().await;
    let table = Arc::new(Mutex::new(vec![a_addr]));
    let names = table.clone();
    let mut options = many(&[], 2);
    options.acceptor = Acceptor::Dns {
        name: "nodes.test".into(),
        port: 7070,
    };
    options.resolve_interval = Duration::from_secs(3600);
    options.resolver = Resolver::new(move |_, _| {
        let addrs: Vec<SocketAddr> = names.lock().unwrap().clone();
        async move { Ok(addrs) }
    });
    let sessions = serve(options, tower::service_fn(hello)).unwrap();
    let max = MaxHeld::watch(&sessions);
    let la = up(&mut a, 2).await;
    let at_a = a.sessions(2).await;

    // A's replacement comes up at another address, and A's process ends.
    *table.lock().unwrap() = vec![b_addr];
    drop((a, la, at_a));
    let _lb = up(&mut b, 2).await;
    let _at_b = b.sessions(2).await;
    let nodes = nodes_until(&sessions, |n| n.len() == 1 && n[0].held == 2).await;
    assert_eq!(nodes[0].address, b_addr);
    assert!(max.get() <= 2, "held {} sessions", max.get());
}

#[tokio::test]
async fn an_acceptor_without_control_links_counts_live_with_demand_one() {
    let (mut fake, addr) = Fake::tcp().await;
    let sessions = serve(many(&[addr], 2), tower::service_fn(hello)).unwrap();
    let _all = fake.sessions(2).await;
    registered(&sessions, 2).await;
    let nodes = nodes_until(&sessions, |n| n.first().is_some_and(|n| n.held == 2)).await;
    assert_eq!(nodes[0].link, "unsupported");
    assert!(nodes[0].live);
    assert_eq!(nodes[0].demand, 1.0);
}

#[tokio::test]
async fn shutdown_drains_every_node_and_waits_for_their_sessions() {
    let t = two(tower::service_fn(hello)).await;
    let Two {
        sessions,
        mut a,
        mut b,
        at_a,
        at_b,
        ..
    } = t;
    let shutdown = tokio::spawn(sessions.shutdown());
    assert!(matches!(a.next().await, Event::Drain(_)));
    assert!(matches!(b.next().await, Event::Drain(_)));
    drop(at_a);
    assert!(!shutdown.is_finished());
    drop(at_b);
    within(shutdown).await.unwrap().unwrap();
    assert_eq!(a.pending() + b.pending(), 0);
}
