//! What the SDK logs (`protocol/README.md`, "What SDKs log"): per instance, never per session
//! slot or per attempt. Each test captures the lines of its own (current-thread) runtime.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_sdk::serve;
use sluice_session::{Hello, Rejection};
use support::{hello, options, registered, within, Event, Fake, Listener};
use tokio::net::TcpListener;

/// The formatted log lines, shared with the subscriber.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// Captures INFO and above on this thread until the guard drops.
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        // Callsites met on other threads with no subscriber may be cached as unwanted.
        tracing::callsite::rebuild_interest_cache();
        (lines, guard)
    }

    /// The captured lines at `level` that contain `text`.
    fn matching(&self, level: &str, text: &str) -> Vec<String> {
        let all = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        all.lines()
            .filter(|l| l.trim_start().starts_with(level) && l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

async fn fake(policy: support::Policy) -> (Fake, std::net::SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (Fake::start(Listener::Tcp(listener), None, policy), addr)
}

#[tokio::test]
async fn an_outage_is_one_warning_and_one_line_when_registered_again() {
    let (lines, _guard) = Lines::capture();
    // The first 12 dials are refused as by a proxy shutting down, then all are accepted.
    let refusals = Arc::new(AtomicUsize::new(12));
    let policy: support::Policy = Arc::new(move |_: &Hello| {
        let left = refusals.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        left.is_ok()
            .then(|| Rejection::unavailable("shutting down"))
    });
    let (mut fake, addr) = fake(policy).await;
    let sessions = serve(options(addr, 4), tower::service_fn(hello)).unwrap();
    for _ in 0..12 {
        assert!(matches!(fake.next().await, Event::Refused(_, 503)));
    }
    let _all = fake.sessions(4).await;
    registered(&sessions, 4).await;

    let warned = lines.matching("WARN", "");
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains(&addr.to_string()), "{}", warned[0]);
    assert!(warned[0].contains("shutting down"), "{}", warned[0]);
    let again = lines.matching("INFO", "registered with the acceptor again");
    assert_eq!(again.len(), 1, "{again:#?}");
    // Dials still in flight when the outage ended count in none.
    let failed: usize = again[0]
        .split("failed_dials=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=12).contains(&failed), "{}", again[0]);
}

#[tokio::test]
async fn a_refusal_that_stops_every_slot_is_one_error_line() {
    let (lines, _guard) = Lines::capture();
    let policy: support::Policy =
        Arc::new(|hello: &Hello| matches!(hello, Hello::Register(_)).then(Rejection::unauthorized));
    let (mut fake, addr) = fake(policy).await;
    let sessions = serve(options(addr, 3), tower::service_fn(hello)).unwrap();
    for _ in 0..3 {
        assert!(matches!(fake.next().await, Event::Refused(_, 401)));
    }
    // The drain is accepted, and shutdown returns once every slot has ended.
    within(sessions.shutdown()).await.unwrap();
    let errors = lines.matching("ERROR", "");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("missing or invalid bearer token"),
        "{}",
        errors[0]
    );
}

#[tokio::test]
async fn a_drain_hold_is_one_warning_and_a_resume_one_line() {
    let (lines, _guard) = Lines::capture();
    let drained = Arc::new(AtomicBool::new(true));
    let held = drained.clone();
    let policy: support::Policy = Arc::new(move |_: &Hello| {
        held.load(Ordering::SeqCst)
            .then(|| Rejection::drained("hello", "i-1"))
    });
    let (mut fake, addr) = fake(policy).await;
    let mut opts = options(addr, 3);
    opts.drained_probe = Duration::from_millis(20);
    let sessions = serve(opts, tower::service_fn(hello)).unwrap();
    // Three slots refused, then three probes refused: silent after the first.
    for _ in 0..6 {
        assert!(matches!(fake.next().await, Event::Refused(_, 410)));
    }
    drained.store(false, Ordering::SeqCst);
    let _all = fake.sessions(3).await;
    registered(&sessions, 3).await;

    let warned = lines.matching("WARN", "");
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains("drained"), "{}", warned[0]);
    assert_eq!(lines.matching("INFO", "resumed").len(), 1);
    assert!(lines.matching("ERROR", "").is_empty());
}

#[tokio::test]
async fn a_capacity_change_is_one_line_with_the_old_and_new_counts() {
    let (lines, _guard) = Lines::capture();
    let (mut fake, addr) = Fake::tcp().await;
    let sessions = serve(options(addr, 4), tower::service_fn(hello)).unwrap();
    let _all = fake.sessions(4).await;
    sessions.set_capacity(2);
    sessions.set_capacity(2);
    let changed = lines.matching("INFO", "capacity");
    assert_eq!(changed.len(), 2, "{changed:#?}");
    assert!(changed[0].contains("old=0 new=4"), "{}", changed[0]);
    assert!(changed[1].contains("old=4 new=2"), "{}", changed[1]);
}

#[tokio::test]
async fn a_node_that_dies_is_one_outage_warning_and_one_down_line_not_one_per_slot() {
    use sluice_session::control::{Demand, NodeLine};
    let (lines, _guard) = Lines::capture();
    let (mut a, a_addr) = Fake::node().await;
    let (mut b, b_addr) = Fake::node().await;
    let sessions = serve(
        support::many(&[a_addr, b_addr], 0),
        tower::service_fn(hello),
    )
    .unwrap();
    let idle = NodeLine::Demand(Demand::default());
    let mut la = a.link().await;
    let mut lb = b.link().await;
    la.send(idle).await;
    lb.send(idle).await;
    support::nodes_until(&sessions, |n| n.len() == 2 && n.iter().all(|n| n.live)).await;
    sessions.set_capacity(6);
    let at_a = a.sessions(3).await;
    let _at_b = b.sessions(3).await;
    // A's process ends: its three slots and its link fail to dial it, again and again.
    drop((a, la, at_a));
    let _moved = b.sessions(3).await;
    support::nodes_until(&sessions, |n| n[0].link == "down").await;
    let about_a = |level| lines.matching(level, &a_addr.to_string());
    let warned = about_a("WARN");
    assert_eq!(warned.len(), 2, "{warned:#?}");
    assert!(
        warned.iter().any(|l| l.contains("cannot register")),
        "{warned:#?}"
    );
    assert!(
        warned.iter().any(|l| l.contains("node is down")),
        "{warned:#?}"
    );
    let rebalanced = lines.matching("INFO", "rebalanced");
    assert!(
        !rebalanced.is_empty() && rebalanced.len() <= 3,
        "{rebalanced:#?}"
    );
}

/// Two live nodes with idle control links, holding `capacity / 2` sessions each.
struct TwoNodes {
    sessions: sluice_sdk::Sessions,
    a: Fake,
    b: Fake,
    a_addr: std::net::SocketAddr,
    la: support::Link,
    lb: support::Link,
    at_a: Vec<support::Session>,
    at_b: Vec<support::Session>,
}

async fn two_nodes(capacity: usize) -> TwoNodes {
    use sluice_session::control::{Demand, NodeLine};
    let (mut a, a_addr) = Fake::node().await;
    let (mut b, b_addr) = Fake::node().await;
    let sessions = serve(
        support::many(&[a_addr, b_addr], 0),
        tower::service_fn(hello),
    )
    .unwrap();
    let idle = NodeLine::Demand(Demand::default());
    let mut la = a.link().await;
    let mut lb = b.link().await;
    la.send(idle).await;
    lb.send(idle).await;
    support::nodes_until(&sessions, |n| n.len() == 2 && n.iter().all(|n| n.live)).await;
    sessions.set_capacity(capacity);
    let at_a = a.sessions(capacity / 2).await;
    let at_b = b.sessions(capacity / 2).await;
    TwoNodes {
        sessions,
        a,
        b,
        a_addr,
        la,
        lb,
        at_a,
        at_b,
    }
}

#[tokio::test]
async fn a_node_that_said_draining_and_goes_away_is_no_warning() {
    use sluice_session::control::NodeLine;
    let (lines, _guard) = Lines::capture();
    let mut t = two_nodes(4).await;
    let mut status = t.sessions.subscribe();
    t.la.send(NodeLine::Draining).await;
    let draining = |s: &sluice_sdk::Status| s.nodes.iter().any(|n| n.link == "draining");
    within(status.wait_for(draining)).await.unwrap();
    // Then its process ends: its sessions close (the SDK closes none at a draining node, issue
    // 46) and move, the link closes, and its redial is refused.
    let a_addr = t.a_addr.to_string();
    drop((t.a, t.la, t.at_a));
    let _moved = t.b.sessions(2).await;
    let refused = |s: &sluice_sdk::Status| matches!(&s.last_error, Some(sluice_sdk::Error::Connect { acceptor, .. }) if *acceptor == a_addr);
    within(status.wait_for(refused)).await.unwrap();
    // It said it would go: neither an outage nor a node down.
    let warned = lines.matching("WARN", "");
    assert!(warned.is_empty(), "{warned:#?}");
    assert_eq!(lines.matching("INFO", "draining node is gone").len(), 1);
}

#[tokio::test]
async fn a_link_lost_while_shutting_down_is_no_node_down() {
    let (lines, _guard) = Lines::capture();
    let mut t = two_nodes(2).await;
    let mut status = t.sessions.subscribe();
    // The drain requests wait for their answers while the nodes close the links.
    t.a.hold();
    t.b.hold();
    let shutdown = tokio::spawn(t.sessions.shutdown());
    t.a.held().await;
    t.b.held().await;
    drop((t.la, t.lb));
    let links_gone = |s: &sluice_sdk::Status| s.nodes.iter().all(|n| n.link != "up");
    within(status.wait_for(links_gone)).await.unwrap();
    t.a.answer();
    t.b.answer();
    assert!(matches!(t.a.next().await, Event::Drain(_)));
    assert!(matches!(t.b.next().await, Event::Drain(_)));
    drop((t.at_a, t.at_b));
    within(shutdown).await.unwrap().unwrap();
    // Long past node_grace, on the test's clock (which runs through every timer left, in
    // order, now that it is paused): the instance was closing those links itself, so
    // nothing was lost.
    tokio::time::pause();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let down = lines.matching("WARN", "down");
    assert!(down.is_empty(), "{down:#?}");
}
