//! Unit tests where the engine's concurrency is: the idle ring's turns, the admission queue
//! (a waiter dropped as it is handed a session, a full queue purged of waiters that gave up),
//! and recall accounting; and in `lifecycle`, each edge of a session's life
//! (docs/architecture.md, "A session's life"). Real sessions over UNIX socket pairs, spoken
//! to by the [`Fake`] protocol; Tokio's paused clock for the timers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake;
mod lifecycle;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::LeaseError;
use crate::handover::HandedSession;
use crate::instance::Limit;
use crate::options::{AcceptorOptions, ReverseOptions};

pub(crate) use self::fake::Fake;

type ReverseCluster = crate::cluster::ReverseCluster<Fake>;
type ReverseSlice = crate::cluster::ReverseSlice<Fake>;
type SlicePool = crate::pool::SlicePool<Fake>;
type Session = crate::session::Session<Fake>;

/// A cluster with one slice and the service ends of its sessions (kept open, so the sessions
/// stay usable).
struct Bed {
    cluster: ReverseCluster,
    slice: ReverseSlice,
    total: Arc<Limit>,
    /// The service end of each session registered, in order (`None`: hung up).
    services: Vec<Option<UnixStream>>,
}

impl Bed {
    fn new(opts: ReverseOptions) -> Self {
        let cluster = ReverseCluster::new("api", Vec::new(), opts);
        let slice = cluster.slice("default");
        Self {
            cluster,
            slice,
            total: Arc::new(Limit::new(None)),
            services: Vec::new(),
        }
    }

    fn pool(&self) -> &Arc<SlicePool> {
        self.slice.pool()
    }

    /// Registers one session of `instance`; returns its number (for [`service`](Self::service)).
    async fn register(&mut self, instance: &str) -> usize {
        let (proxy_end, service_end) = UnixStream::pair().unwrap();
        let permit = self.cluster.reserve(instance, &self.total).unwrap();
        let io = Box::new(proxy_end);
        self.cluster
            .attach("default", io, permit, None)
            .await
            .unwrap();
        self.services.push(Some(service_end));
        self.services.len() - 1
    }

    /// The service end of session `n`.
    fn service(&mut self, n: usize) -> &mut UnixStream {
        self.services[n].as_mut().expect("not hung up")
    }

    /// The service of session `n` closes its connection.
    fn hang_up(&mut self, n: usize) {
        self.services[n] = None;
    }

    /// Whether the service of session `n` saw its connection close (EOF); waits for it.
    async fn closed_for_service(&mut self, n: usize) -> bool {
        let mut byte = [0u8; 1];
        let read = within(self.service(n).read(&mut byte)).await;
        matches!(read, Ok(0))
    }

    async fn lease(&self) -> Session {
        self.pool().lease().await.unwrap()
    }

    /// A request waiting in the queue (its task polled until it is in).
    async fn waiter(&self) -> JoinHandle<Result<Session, LeaseError>> {
        let before = self.pool().queued();
        let pool = Arc::clone(self.pool());
        let task = tokio::spawn(async move { pool.lease().await });
        while self.pool().queued() == before && !task.is_finished() {
            tokio::task::yield_now().await;
        }
        task
    }

    /// Waits until `done` holds of the cluster (checked at each change of it).
    async fn until(&self, done: impl Fn(&ReverseCluster) -> bool) {
        within(self.cluster.wait_until(done)).await;
    }
}

fn opts(queue_max: usize) -> ReverseOptions {
    ReverseOptions {
        queue_max,
        queue_timeout: Duration::from_secs(10),
        ..reverse_options()
    }
}

/// A reverse cluster's options with the configuration's defaults.
pub(crate) fn reverse_options() -> ReverseOptions {
    ReverseOptions {
        queue_max: 1024,
        queue_timeout: Duration::from_secs(2),
        no_sessions_wait: Duration::ZERO,
        startup_wait: Duration::ZERO,
        max_sessions_per_instance: None,
        max_sessions: None,
        response_timeout: Duration::from_secs(30),
        request_buffer: 64 * 1024,
        response_buffer: 64 * 1024,
    }
}

/// A plaintext acceptor on a free loopback port, with the configuration's defaults but for
/// the handshake rate (no limit).
pub(crate) fn acceptor_options() -> AcceptorOptions {
    AcceptorOptions {
        addr: ([127, 0, 0, 1], 0).into(),
        unix: None,
        handshake_timeout: Duration::from_secs(5),
        max_handshake_size: 8 * 1024,
        max_sessions: Some(10_000),
        handshakes_per_second: None,
        max_control_links: Some(4096),
        max_control_links_per_address: Some(256),
        max_slices: Some(64),
        tls: None,
        clients: Default::default(),
    }
}

/// `fut`'s output; fails after a while (of the paused clock: only once nothing else can
/// happen) without it.
async fn within<F: Future>(fut: F) -> F::Output {
    let out = tokio::time::timeout(Duration::from_secs(60), fut).await;
    out.expect("it happened")
}

/// The next session handed over; fails after a while (of the paused clock) without one.
async fn next(handed: &mut mpsc::UnboundedReceiver<HandedSession>) -> HandedSession {
    let next = tokio::time::timeout(Duration::from_secs(5), handed.recv()).await;
    next.expect("a session handed over")
        .expect("the hand-over open")
}

fn instance(session: &Session) -> &str {
    session.instance().id()
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_take_turns_by_instance_and_the_last_returned_goes_first() {
    let mut bed = Bed::new(opts(8));
    for id in ["a", "a", "b"] {
        bed.register(id).await;
    }
    // Turns in registration order: a, a, b.
    let (first, second, third) = (bed.lease().await, bed.lease().await, bed.lease().await);
    let order: Vec<&str> = [&first, &second, &third].map(instance).to_vec();
    assert_eq!(order, ["a", "a", "b"]);
    // Returned a, b, a: the turns follow the returns.
    let (first_id, second_id) = (first.id(), second.id());
    bed.pool().checkin(first);
    bed.pool().checkin(third);
    bed.pool().checkin(second);
    let again = [bed.lease().await, bed.lease().await, bed.lease().await];
    assert_eq!(again.each_ref().map(instance), ["a", "b", "a"]);
    // Within a's turns, the session returned last went out first.
    assert_eq!(again[0].id(), second_id);
    assert_eq!(again[2].id(), first_id);
    assert_eq!(bed.pool().idle(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_session_handed_to_a_waiter_that_just_gave_up_goes_to_the_next_one() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    let session = bed.lease().await;
    let gives_up = bed.waiter().await;
    let waits = bed.waiter().await;
    assert_eq!(bed.pool().queued(), 2);
    // The first waiter is handed the session and dropped before it runs again.
    bed.pool().checkin(session);
    gives_up.abort();
    assert!(gives_up.await.unwrap_err().is_cancelled());
    let got = tokio::time::timeout(Duration::from_secs(5), waits).await;
    let got = got
        .expect("the session reached the next waiter")
        .unwrap()
        .unwrap();
    assert_eq!(instance(&got), "a");
    assert_eq!((bed.pool().idle(), bed.pool().queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_is_purged_of_waiters_that_gave_up() {
    let mut bed = Bed::new(opts(2));
    bed.register("a").await;
    let _busy = bed.lease().await;
    let waiting = [bed.waiter().await, bed.waiter().await];
    // Full of live waiters: the next request is refused.
    let refused = bed.pool().lease().await.unwrap_err();
    assert!(
        matches!(refused, LeaseError::Unavailable { reason, .. } if reason.contains("queue full")),
        "{refused:?}"
    );
    for task in &waiting {
        task.abort();
    }
    for task in waiting {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    // Both gave up: the queue is purged and the next request waits instead.
    let waits = bed.waiter().await;
    assert_eq!(bed.pool().queued(), 1, "{:?}", waits.is_finished());
    tokio::time::sleep(Duration::from_secs(11)).await;
    let expired = waits.await.unwrap().unwrap_err();
    assert!(
        matches!(&expired, LeaseError::Unavailable { reason, .. } if reason.contains("expired")),
        "{expired:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn recalled_sessions_leave_as_they_are_returned_and_no_more() {
    let mut bed = Bed::new(opts(8));
    let (to, mut handed) = mpsc::unbounded_channel();
    bed.cluster.start_pull(to, None);
    bed.register("a").await;
    bed.register("a").await;
    let busy = [bed.lease().await, bed.lease().await];
    // Three recalled, none idle: all three are owed.
    bed.cluster.recall("default", 3);
    for session in busy {
        bed.pool().checkin(session);
    }
    for _ in 0..2 {
        let session = next(&mut handed).await;
        assert_eq!(
            (session.slice.slice.as_str(), session.instance.as_str()),
            ("default", "a")
        );
    }
    // The third owed one is the next session that joins; the one after stays.
    bed.register("b").await;
    assert_eq!(next(&mut handed).await.instance, "b");
    bed.register("c").await;
    assert_eq!(bed.pool().idle(), 1);
    // Recalled with one idle: that one leaves now, and only the rest is owed.
    bed.cluster.recall("default", 2);
    assert_eq!(next(&mut handed).await.instance, "c");
    bed.register("d").await;
    assert_eq!(next(&mut handed).await.instance, "d");
    bed.register("e").await;
    assert_eq!(bed.pool().idle(), 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(handed.try_recv().is_err(), "more left than were recalled");
}

/// A consumer that lost its acceptor stops the pull (handoff/consumer.rs): a recalled session
/// that comes back then stays, instead of leaving for a link that is gone (and closing).
#[tokio::test(start_paused = true)]
async fn nothing_owed_leaves_once_the_pull_stops() {
    let mut bed = Bed::new(opts(8));
    let (to, handed) = mpsc::unbounded_channel();
    bed.cluster.start_pull(to, None);
    bed.register("a").await;
    let busy = bed.lease().await;
    bed.cluster.recall("default", 1);
    drop(handed);
    bed.cluster.stop_handover();
    bed.pool().checkin(busy);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(bed.pool().idle(), 1, "the recalled session stayed");
    assert_eq!(bed.lease().await.instance().id(), "a");
}

/// Runs `meet` on this thread while another returns `busy` at the same moment.
fn coming_back<const N: usize>(bed: &Bed, busy: [Session; N], meet: impl FnOnce()) {
    let start = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            for session in busy {
                bed.pool().checkin(session);
            }
        });
        start.wait();
        meet();
    });
}

/// A `RETIRE` that meets sessions coming back at that very moment: each of them either is idle
/// when the retirement looks (and closes then) or claims what it owes as it comes back. None
/// stays idle with a retirement owed (many nodes: a node removed from DNS kept a session).
#[tokio::test]
async fn a_retirement_met_by_sessions_coming_back_closes_every_one_asked() {
    for round in 0..5_000 {
        let mut bed = Bed::new(opts(8));
        bed.register("a").await;
        bed.register("a").await;
        let busy = [bed.lease().await, bed.lease().await];
        let instance = Arc::clone(busy[0].instance());
        coming_back(&bed, busy, || {
            bed.cluster.retire("default", "a", 2);
        });
        assert_eq!(
            (bed.pool().idle(), instance.retiring()),
            (0, 0),
            "round {round}: a session stayed idle with a retirement owed"
        );
    }
}

/// A recall that meets sessions coming back at that very moment: as many leave as it asked
/// for, none stays idle with a recall owed.
#[tokio::test]
async fn a_recall_met_by_sessions_coming_back_gets_every_one_asked() {
    for round in 0..5_000 {
        let mut bed = Bed::new(opts(8));
        let (to, mut handed) = mpsc::unbounded_channel();
        bed.cluster.start_pull(to, None);
        bed.register("a").await;
        bed.register("a").await;
        let busy = [bed.lease().await, bed.lease().await];
        coming_back(&bed, busy, || bed.cluster.recall("default", 2));
        assert_eq!(
            bed.pool().idle(),
            0,
            "round {round}: a recalled session stayed idle"
        );
        for _ in 0..2 {
            next(&mut handed).await;
        }
    }
}

/// `DEMAND`'s `in_flight` counts the sessions requests hold: not an idle session that is
/// closing, nor one dropped by its request before its connection has ended (many nodes: such
/// phantom demand skewed the split of a service with no requests at all).
#[tokio::test(start_paused = true)]
async fn in_flight_counts_sessions_leased_and_nothing_else() {
    let mut bed = Bed::new(opts(8));
    bed.register("a").await;
    bed.register("a").await;
    let in_flight = |bed: &Bed| bed.pool().load().in_flight;
    assert_eq!(in_flight(&bed), 0);
    let leased = bed.lease().await;
    assert_eq!(in_flight(&bed), 1);
    // The idle one is retired: it closes, and was never in flight.
    assert_eq!(bed.cluster.retire("default", "a", 1), 1);
    assert_eq!(in_flight(&bed), 1);
    // The leased one is dropped (a response cut short): no longer in flight either.
    drop(leased);
    assert_eq!(in_flight(&bed), 0);
    // A waiter handed a session holds it in flight until it is back.
    bed.register("a").await;
    let busy = bed.lease().await;
    let waits = bed.waiter().await;
    bed.pool().checkin(busy);
    let got = within(waits).await.unwrap().unwrap();
    assert_eq!(in_flight(&bed), 1);
    bed.pool().checkin(got);
    assert_eq!((in_flight(&bed), bed.pool().idle()), (0, 1));
}

/// Issue 46: a node stopping for good (its links say `DRAINING`, and the services close
/// nothing there) answers the requests in its queue with the sessions it has: idle ones close
/// at once but one, and a session that comes back goes to the next waiter, closing only when
/// nobody waits (the slice keeps one idle for requests still arriving while it closes).
#[tokio::test(start_paused = true)]
async fn a_stopping_node_answers_its_queue_then_closes_its_sessions_but_one() {
    let mut bed = Bed::new(opts(8));
    for _ in 0..4 {
        bed.register("a").await;
    }
    let busy = [bed.lease().await, bed.lease().await];
    bed.cluster.stopping();
    bed.until(|c| c.sessions() == 3).await;
    assert_eq!(bed.pool().idle(), 1, "one idle session is kept");
    let third = bed.lease().await;
    let waiters = [bed.waiter().await, bed.waiter().await];
    assert_eq!(bed.pool().queued(), 2);
    for session in busy {
        bed.pool().checkin(session);
    }
    let mut served = Vec::new();
    for waiter in waiters {
        let got = within(waiter).await.unwrap();
        served.push(got.expect("a waiter got a session back, not a 503"));
    }
    assert_eq!(
        bed.cluster.sessions(),
        3,
        "nothing closed while requests waited"
    );
    // Nobody waits any more: the first back stays idle, the others close.
    bed.pool().checkin(third);
    for session in served {
        bed.pool().checkin(session);
    }
    bed.until(|c| c.sessions() == 1).await;
    assert_eq!(bed.pool().idle(), 1);
    let mut closed = 0;
    for n in 0..4 {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(1), bed.service(n).read(&mut byte));
        closed += usize::from(matches!(read.await, Ok(Ok(0))));
    }
    assert_eq!(
        closed, 3,
        "the services saw three of their four sessions close"
    );
}
