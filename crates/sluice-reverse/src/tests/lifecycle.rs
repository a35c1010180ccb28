//! Each edge of a session's life (docs/architecture.md, "A session's life"), with what a user
//! relies on at that edge: how many sessions are idle and leased, which request a session
//! serves, that no request is lost, and that requests in flight never exceed the sessions
//! registered.
//!
//! ```text
//! registered ─▶ IDLE ─▶ LEASED ─▶ IDLE (finished) | RETIRED | UPGRADED
//!               IDLE ─▶ DRAINED | HANDED OVER (─▶ adopted) | LENT (─▶ RETURN | GONE | RECALL)
//! ```

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{next, opts, within, Bed, Fake, ReverseCluster, Session};
use crate::error::LeaseError;
use crate::instance::{Lent, Limit, UpgradedSession};
use crate::pool::Load;

type Lease = crate::lease::Lease<Fake>;

impl Bed {
    /// The lease a response carries, of `session`.
    fn lease_of(&self, session: Session) -> Lease {
        Lease::new(Some(session), Arc::clone(self.pool()))
    }

    fn load(&self) -> Load {
        self.pool().load()
    }

    /// Whether the service of session `n` still has its connection: nothing to read, no EOF.
    fn open_for_service(&mut self, n: usize) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.service(n).try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

fn load(in_flight: usize, queued: usize, sessions: usize) -> Load {
    Load {
        in_flight,
        queued,
        refused: 0,
        sessions,
    }
}

/// A socket as another process hands it over: the proxy's end of a fresh pair.
fn socket_pair() -> (OwnedFd, UnixStream) {
    let (proxy_end, service_end) = UnixStream::pair().unwrap();
    (OwnedFd::from(proxy_end.into_std().unwrap()), service_end)
}

// registered ─▶ IDLE

#[tokio::test(start_paused = true)]
async fn a_registered_session_is_idle_and_counted_against_its_instance() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    assert_eq!(bed.pool().idle(), 1);
    assert_eq!(bed.load(), load(0, 0, 1));
    assert_eq!(bed.cluster.instance_sessions("a"), 1);
    assert_eq!(bed.cluster.alive_sessions("default"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_session_that_registers_while_requests_wait_serves_the_longest_waiter() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    let busy = bed.lease().await;
    let (first, second) = (bed.waiter().await, bed.waiter().await);
    bed.register("b").await;
    let served = within(first).await.unwrap().unwrap();
    assert_eq!(served.instance().id(), "b");
    assert_eq!((bed.pool().idle(), bed.pool().queued()), (0, 1));
    assert!(!second.is_finished());
    bed.lease_of(busy).finish();
    assert_eq!(within(second).await.unwrap().unwrap().instance().id(), "a");
}

// IDLE ─▶ LEASED

#[tokio::test(start_paused = true)]
async fn a_session_serves_one_request_at_a_time_and_the_rest_wait() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    bed.register("a").await;
    let (one, two) = (bed.lease().await, bed.lease().await);
    assert_ne!(one.id(), two.id(), "one request per session");
    let third = bed.waiter().await;
    assert_eq!(
        bed.load(),
        load(2, 1, 2),
        "in flight never exceeds the sessions"
    );
    bed.lease_of(one).finish();
    let third = within(third).await.unwrap().unwrap();
    assert_eq!(bed.load(), load(2, 0, 2));
    drop((two, third));
}

// LEASED ─▶ IDLE (Lease::finish)

#[tokio::test(start_paused = true)]
async fn a_finished_request_gives_its_session_to_the_longest_waiter_else_back_to_idle() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    let session = bed.lease().await;
    let id = session.id();
    let (first, second) = (bed.waiter().await, bed.waiter().await);
    bed.lease_of(session).finish();
    let session = within(first).await.unwrap().unwrap();
    assert_eq!(session.id(), id);
    assert_eq!((bed.pool().idle(), bed.pool().queued()), (0, 1));
    bed.lease_of(session).finish();
    let session = within(second).await.unwrap().unwrap();
    bed.lease_of(session).finish();
    assert_eq!(bed.load(), load(0, 0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_session_still_winding_down_is_waited_for_before_it_takes_the_next_request() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    let mut session = bed.lease().await;
    let (id, line) = (session.id(), session.client().line());
    line.busy();
    bed.lease_of(session).finish();
    let pool = Arc::clone(bed.pool());
    let next = tokio::spawn(async move { pool.lease().await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!next.is_finished(), "not ready yet: the request waits");
    line.ready();
    let session = within(next).await.unwrap().unwrap();
    assert_eq!(session.id(), id, "the same session, not a closed one");
    assert_eq!(bed.cluster.sessions(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_session_busy_past_the_queue_timeout_is_closed_and_the_request_takes_the_next_one() {
    let mut bed = Bed::new(opts(8));
    let stuck = bed.register("a").await;
    bed.register("b").await;
    let (mut a, b) = (bed.lease().await, bed.lease().await);
    assert_eq!((super::instance(&a), super::instance(&b)), ("a", "b"));
    a.client().line().busy();
    // Back in this order: a's turn comes first.
    bed.lease_of(a).finish();
    bed.lease_of(b).finish();
    let start = Instant::now();
    let got = bed.lease().await;
    assert_eq!(super::instance(&got), "b");
    let waited = start.elapsed();
    assert!(
        waited >= opts(8).queue_timeout,
        "a was waited for: {waited:?}"
    );
    assert!(
        bed.closed_for_service(stuck).await,
        "the stuck session closed"
    );
    bed.until(|c| c.instance_sessions("a") == 0).await;
}

// LEASED ─▶ RETIRED

#[tokio::test(start_paused = true)]
async fn a_request_that_ends_badly_closes_its_session_and_frees_its_place() {
    let mut bed = Bed::new(super::ReverseOptions {
        max_sessions: Some(1),
        ..opts(8)
    });
    let n = bed.register("a").await;
    let lease = bed.lease_of(bed.lease().await);
    // A body dropped early, `Connection: close`: the lease goes without `finish`.
    drop(lease);
    assert!(bed.closed_for_service(n).await);
    bed.until(|c| c.sessions() == 0).await;
    assert!(
        bed.cluster.instances().is_empty(),
        "its last session unlists it"
    );
    assert_eq!(bed.pool().idle(), 0);
    // Its place is free again.
    let total = Arc::new(Limit::new(None));
    assert!(bed.cluster.reserve("a", &total).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_connection_failed_during_its_request_is_dropped_when_it_comes_back() {
    let mut bed = Bed::new(opts(8));
    let n = bed.register("a").await;
    let mut session = bed.lease().await;
    session.client().line().fail();
    bed.lease_of(session).finish();
    assert_eq!(bed.pool().idle(), 0);
    assert!(bed.closed_for_service(n).await);
    bed.until(|c| c.sessions() == 0).await;
}

#[tokio::test(start_paused = true)]
async fn a_session_its_service_closed_while_leased_is_not_given_to_the_next_request() {
    let mut bed = Bed::new(opts(8));
    let a = bed.register("a").await;
    bed.register("b").await;
    let (sa, sb) = (bed.lease().await, bed.lease().await);
    assert_eq!(super::instance(&sa), "a");
    let waiting = bed.waiter().await;
    bed.hang_up(a);
    bed.until(|c| c.instance_sessions("a") == 0).await;
    bed.lease_of(sa).finish();
    assert_eq!(
        bed.pool().queued(),
        1,
        "the request still waits for a live session"
    );
    bed.lease_of(sb).finish();
    let got = within(waiting).await.unwrap().unwrap();
    assert_eq!(super::instance(&got), "b");
}

// LEASED ─▶ UPGRADED

#[tokio::test(start_paused = true)]
async fn an_upgraded_session_is_never_leased_again_but_keeps_its_instance_listed() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    let session = bed.lease().await;
    // A 101: the bridge takes the stream, the session is consumed.
    let upgraded = UpgradedSession::new(session.instance());
    drop(session);
    bed.until(|c| c.sessions() == 0).await;
    let listed = bed.cluster.instances();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].id(), listed[0].upgraded()), ("a", 1));
    assert_eq!((bed.pool().idle(), bed.load().sessions), (0, 0));
    drop(upgraded);
    assert!(bed.cluster.instances().is_empty());
}

// IDLE ─▶ DRAINED

#[tokio::test(start_paused = true)]
async fn a_drain_closes_idle_sessions_now_and_busy_ones_after_their_response() {
    let mut bed = Bed::new(opts(8));
    let busy_n = bed.register("a").await;
    let busy = bed.lease().await;
    let idle_n = bed.register("a").await;
    bed.register("b").await;
    assert!(bed.cluster.drain("a"));
    assert!(bed.closed_for_service(idle_n).await, "idle: closed now");
    assert_eq!(bed.pool().idle(), 1, "b's");
    assert!(bed.open_for_service(busy_n), "busy: its response goes on");
    // The next requests: one takes b, the other waits (never for a's drained session).
    let b = bed.lease().await;
    assert_eq!(super::instance(&b), "b");
    let waiting = bed.waiter().await;
    bed.lease_of(busy).finish();
    assert!(
        bed.closed_for_service(busy_n).await,
        "closed after its response"
    );
    bed.until(|c| c.instance_sessions("a") == 0).await;
    assert_eq!(bed.pool().queued(), 1);
    bed.lease_of(b).finish();
    assert_eq!(
        super::instance(&within(waiting).await.unwrap().unwrap()),
        "b"
    );
    assert_eq!(bed.cluster.instances().len(), 1, "a is unlisted");
}

#[tokio::test(start_paused = true)]
async fn a_held_instance_is_refused_until_resumed() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    assert!(bed.cluster.drain_and_hold("a"));
    bed.until(|c| c.sessions() == 0).await;
    let total = Arc::new(Limit::new(None));
    let refused = bed.cluster.reserve("a", &total).unwrap_err();
    assert_eq!(refused.status, 410);
    assert!(bed.cluster.resume("a"));
    bed.register("a").await;
    assert_eq!(bed.pool().idle(), 1);
}

// IDLE ─▶ HANDED OVER (a hot restart) ─▶ adopted by the successor

#[tokio::test(start_paused = true)]
async fn a_hot_restart_hands_over_idle_sessions_keeping_one_per_slice_until_finished() {
    let mut bed = Bed::new(opts(8));
    for _ in 0..3 {
        bed.register("a").await;
    }
    let (to, mut handed) = mpsc::unbounded_channel();
    bed.cluster.start_handover(to, true);
    let mut moved = vec![next(&mut handed).await, next(&mut handed).await];
    assert_eq!(
        bed.pool().idle(),
        1,
        "one kept for requests still arriving here"
    );
    assert!(handed.try_recv().is_err());
    bed.cluster.finish_handover();
    moved.push(next(&mut handed).await);
    assert_eq!(bed.pool().idle(), 0);
    for n in 0..3 {
        assert!(bed.open_for_service(n), "the service's connection lives on");
    }
    // The successor adopts them: the same sockets, served there.
    let successor = ReverseCluster::new("api", Vec::new(), opts(8));
    let total = Arc::new(Limit::new(None));
    for session in moved {
        assert_eq!(
            (session.slice.slice.as_str(), session.instance.as_str()),
            ("default", "a")
        );
        let fd = session.fd;
        successor.adopt("default", "a", fd, &total).await.unwrap();
    }
    assert_eq!(successor.idle_sessions("default"), 3);
    bed.until(|c| c.sessions() == 0).await;
    bed.hang_up(0);
    within(successor.wait_until(|c| c.sessions() == 2)).await;
}

#[tokio::test(start_paused = true)]
async fn during_a_hot_restart_a_returned_session_serves_a_waiting_request_before_it_leaves() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    let session = bed.lease().await;
    let (to, mut handed) = mpsc::unbounded_channel();
    bed.cluster.start_handover(to, false);
    let waiting = bed.waiter().await;
    bed.lease_of(session).finish();
    let session = within(waiting).await.unwrap().unwrap();
    assert!(handed.try_recv().is_err(), "the request here went first");
    bed.lease_of(session).finish();
    next(&mut handed).await;
    assert_eq!(bed.pool().idle(), 0);
}

// IDLE ─▶ LENT (a standalone acceptor), RETURN and GONE at the lender

#[tokio::test(start_paused = true)]
async fn a_lender_lets_sessions_go_only_as_asked_and_counts_them_until_gone() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    bed.register("a").await;
    let (to, mut lent) = mpsc::unbounded_channel();
    bed.cluster.start_pull(to, None);
    assert_eq!(bed.pool().idle(), 2, "nothing leaves unasked");
    assert_eq!(bed.cluster.hand_over_some("default", 1), 1);
    let out = next(&mut lent).await;
    bed.until(|c| c.idle_sessions("default") == 1).await;
    // Lent: no longer attached here, still counted in every limit.
    assert_eq!(bed.load().sessions, 1);
    assert_eq!(bed.cluster.sessions(), 2);
    assert_eq!(bed.cluster.alive_sessions("default"), 2);
    // A request waiting here keeps the last idle session from leaving.
    let held = bed.lease().await;
    let waiting = bed.waiter().await;
    assert_eq!(bed.cluster.hand_over_some("default", 1), 0);
    bed.lease_of(held).finish();
    drop(within(waiting).await.unwrap().unwrap());
    // GONE: the broker drops the permit it kept.
    drop(out);
    bed.until(|c| c.sessions() == 0).await;
    assert_eq!(bed.cluster.alive_sessions("default"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_returned_session_rejoins_its_pool_with_the_place_it_kept() {
    let mut bed = Bed::new(super::ReverseOptions {
        max_sessions: Some(1),
        ..opts(8)
    });
    let n = bed.register("a").await;
    let (to, mut lent) = mpsc::unbounded_channel();
    bed.cluster.start_pull(to, None);
    assert_eq!(bed.cluster.hand_over_some("default", 1), 1);
    let out = next(&mut lent).await;
    let total = Arc::new(Limit::new(None));
    assert!(
        bed.cluster.reserve("b", &total).is_err(),
        "lent, it still holds its place"
    );
    // RETURN: back into the pool with the permit it kept.
    bed.cluster
        .reattach("default", out.fd, out.permit)
        .await
        .unwrap();
    assert_eq!(bed.load(), load(0, 0, 1));
    assert_eq!(bed.cluster.sessions(), 1);
    assert_eq!(bed.cluster.alive_sessions("default"), 1, "counted once");
    assert!(bed.open_for_service(n));
    assert_eq!(super::instance(&bed.lease().await), "a");
}

// LENT, at the consumer: GONE, RETURN, RECALL

#[tokio::test(start_paused = true)]
async fn a_lent_session_that_ends_at_the_consumer_is_reported_gone_once() {
    let bed = Bed::new(opts(8));
    let (gone, mut reported) = mpsc::unbounded_channel();
    let (fd, service) = socket_pair();
    let lent = Lent { id: 7, gone };
    bed.cluster
        .adopt_lent("default", "a", fd, lent)
        .await
        .unwrap();
    assert_eq!(bed.pool().idle(), 1);
    drop(service);
    assert_eq!(within(reported.recv()).await, Some(7));
    bed.until(|c| c.sessions() == 0).await;
    assert!(reported.try_recv().is_err(), "once");
}

#[tokio::test(start_paused = true)]
async fn a_recalled_session_leaves_ahead_of_requests_waiting_at_the_consumer() {
    let mut bed = Bed::new(opts(8));
    let _arriving = bed.cluster.expect_sessions();
    let (to, mut back) = mpsc::unbounded_channel();
    bed.cluster.start_pull(to, None);
    bed.register("a").await;
    let busy = bed.lease().await;
    let waiting = bed.waiter().await;
    bed.cluster.recall("default", 1);
    bed.lease_of(busy).finish();
    let returned = next(&mut back).await;
    assert_eq!(returned.instance, "a");
    assert_eq!(bed.pool().queued(), 1, "the request here waits on");
    bed.register("b").await;
    assert_eq!(
        super::instance(&within(waiting).await.unwrap().unwrap()),
        "b"
    );
}

// Everything lent out: requests at a consumer wait for sessions to arrive

#[tokio::test(start_paused = true)]
async fn a_consumer_holding_no_session_keeps_requests_waiting_until_one_is_lent() {
    let bed = Bed::new(opts(8));
    let _arriving = bed.cluster.expect_sessions();
    let waiting = bed.waiter().await;
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(bed.pool().queued(), 1);
    let (gone, _reported) = mpsc::unbounded_channel();
    let (fd, _service) = socket_pair();
    let lent = Lent { id: 1, gone };
    bed.cluster
        .adopt_lent("default", "a", fd, lent)
        .await
        .unwrap();
    let got = within(waiting).await.unwrap().unwrap();
    assert_eq!(super::instance(&got), "a");
}

#[tokio::test(start_paused = true)]
async fn a_consumer_holding_no_session_answers_waiting_requests_503_at_the_queue_timeout() {
    let bed = Bed::new(opts(8));
    let _arriving = bed.cluster.expect_sessions();
    let start = Instant::now();
    let waiting = bed.waiter().await;
    let refused = within(waiting).await.unwrap().unwrap_err();
    // Still none when the wait ends: the 503 says so.
    assert!(
        matches!(refused, LeaseError::NoSessions { .. }),
        "{refused:?}"
    );
    let waited = start.elapsed();
    assert!(waited >= opts(8).queue_timeout, "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn when_a_consumers_last_session_closes_its_requests_wait_on() {
    let mut bed = Bed::new(opts(8));
    let _arriving = bed.cluster.expect_sessions();
    let n = bed.register("a").await;
    let busy = bed.lease().await;
    let waiting = bed.waiter().await;
    bed.hang_up(n);
    drop(busy);
    bed.until(|c| c.sessions() == 0).await;
    assert_eq!(bed.pool().queued(), 1, "more may be lent");
    let refused = within(waiting).await.unwrap().unwrap_err();
    assert!(
        matches!(refused, LeaseError::Unavailable { .. }),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn when_the_last_session_of_a_slice_closes_its_waiting_requests_are_answered_at_once() {
    let mut bed = Bed::new(opts(8));
    let n = bed.register("a").await;
    let busy = bed.lease().await;
    let start = Instant::now();
    let waiting = bed.waiter().await;
    bed.hang_up(n);
    drop(busy);
    let refused = within(waiting).await.unwrap().unwrap_err();
    assert!(
        matches!(refused, LeaseError::NoSessions { .. }),
        "{refused:?}"
    );
    assert!(start.elapsed() < opts(8).queue_timeout);
}

#[tokio::test(start_paused = true)]
async fn a_lent_sessions_socket_is_its_services_own_connection() {
    let mut bed = Bed::new(opts(8));
    let n = bed.register("a").await;
    let (to, mut lent) = mpsc::unbounded_channel();
    bed.cluster.start_pull(to, None);
    bed.cluster.hand_over_some("default", 1);
    let out = next(&mut lent).await;
    let std = std::os::unix::net::UnixStream::from(out.fd);
    std.set_nonblocking(true).unwrap();
    let mut moved = UnixStream::from_std(std).unwrap();
    moved.write_all(b"GET").await.unwrap();
    let mut got = [0u8; 3];
    bed.service(n).read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"GET");
}
