//! [`SlicePool`]: the idle sessions of one (cluster, slice) and its admission queue.
//!
//! Idle sessions take turns as in a FIFO ring (docs/design.md §3): a returned session's turn goes to
//! the tail and a lease takes the turn at the head, which rotates load across instances in
//! proportion to their idle sessions. Within the instance whose turn it is, the session
//! returned last goes out first ([`Idle`]), so a service that registers hundreds of sessions
//! keeps the few it needs warm instead of cycling through all of them. When nothing is idle
//! the request waits in a bounded FIFO queue; a returned or newly registered session is
//! handed straight to the longest waiter.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::changes::Changes;
use crate::error::LeaseError;
use crate::handover::{Handed, Handover};
use crate::instance::{Instance, SessionPermit};
use crate::metrics::ReverseMetrics;
use crate::options::ReverseOptions;
use crate::protocol::Protocol;
use crate::session::Session;
use crate::slice_id::SliceId;
use crate::stream::SessionStream;
use sluice_net::log_limit::SharedTally;

/// The sessions and waiters of one slice.
#[derive(Debug)]
pub struct SlicePool<P: Protocol> {
    id: SliceId,
    pub(crate) opts: Arc<ReverseOptions>,
    /// The proxy's settings of the cluster.
    protocol: Arc<P::Options>,
    state: Mutex<State<P>>,
    /// Wakes observers whenever the idle ring or a session count changes.
    changed: Arc<Changes>,
    /// Where idle sessions go while the cluster hands over to another process.
    handover: Arc<Handover>,
    /// Sessions the lender recalled (`RECALL`): each leaves when it is next returned, before
    /// any waiter here gets it.
    owed: AtomicUsize,
    /// Waiters that gave up (expired or cancelled) since the queue was last purged of them.
    abandoned: AtomicUsize,
    /// Where queue waits are recorded, once the proxy sets it.
    metrics: ReverseMetrics,
    /// Sessions attached to this slice, idle or leased.
    registered: AtomicUsize,
    /// Sessions leased: each request's from its lease until it comes back or is dropped.
    in_flight: Arc<AtomicUsize>,
    /// Whether a shared session has joined ([`Self::multiplexed`]).
    multiplexed: AtomicBool,
    /// Sessions of this slice alive anywhere: attached here, or handed over or lent out with
    /// their permits still in this process (a standalone acceptor's). Counted by the permits.
    alive: Arc<AtomicUsize>,
    /// Non-zero while sessions may arrive from elsewhere (lent, or handed over).
    arriving: Arc<AtomicUsize>,
    /// The node is stopping for good (its control links say `DRAINING`): a returning
    /// session goes to the next waiter, and closes when nobody waits, but for one idle
    /// session per slice ([`ReverseCluster::stopping`](crate::ReverseCluster::stopping)).
    stopping: Arc<AtomicBool>,
    /// Until then (the node has just started: `startup_wait`), a request to this slice
    /// without sessions waits for the first one.
    starting_until: Option<Instant>,
    /// A request was refused for want of any session since the last one registered: logged
    /// once per such stretch, not per request.
    empty_logged: AtomicBool,
    /// 503s for want of capacity (queue full, wait expired), logged once per interval.
    refusals: SharedTally,
    /// Requests refused for want of capacity (no sessions, queue full, wait expired), ever:
    /// control links report the difference between two readings.
    refused: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct State<P: Protocol> {
    idle: Idle<P>,
    /// Each waiter's channel, and since when it waits.
    waiters: VecDeque<(Instant, oneshot::Sender<Session<P>>)>,
}

impl<P: Protocol> Default for State<P> {
    fn default() -> Self {
        Self {
            idle: Idle::default(),
            waiters: VecDeque::new(),
        }
    }
}

/// The idle sessions of a slice.
///
/// Which instance serves next follows a FIFO ring of *turns*, one per idle session, exactly as
/// a FIFO ring of the sessions themselves would. Which of that instance's sessions serves is
/// the one returned last. Cycling through every session made each request touch a cold
/// connection's buffers and task: with one service of 512 sessions at 64 concurrent requests,
/// this order took the proxy from 31.8 to 25.1 us of CPU per request (issue 7's note).
#[derive(Debug)]
struct Idle<P: Protocol> {
    /// The instance (the address of its `Arc`) of each idle session, in return order.
    turns: VecDeque<usize>,
    /// Each instance's idle sessions, the one returned last at the end.
    stacks: HashMap<usize, Vec<Session<P>>>,
}

impl<P: Protocol> Default for Idle<P> {
    fn default() -> Self {
        Self {
            turns: VecDeque::new(),
            stacks: HashMap::new(),
        }
    }
}

impl<P: Protocol> Idle<P> {
    fn key(session: &Session<P>) -> usize {
        Arc::as_ptr(session.instance()) as usize
    }

    fn len(&self) -> usize {
        self.turns.len()
    }

    fn push(&mut self, session: Session<P>) {
        let key = Self::key(&session);
        self.turns.push_back(key);
        self.stacks.entry(key).or_default().push(session);
    }

    /// The session whose turn it is.
    fn pop(&mut self) -> Option<Session<P>> {
        // Every turn has its session (push, pop and remove_where keep them paired); a turn
        // without one would only be skipped.
        while let Some(key) = self.turns.pop_front() {
            let Some(stack) = self.stacks.get_mut(&key) else {
                continue;
            };
            let session = stack.pop();
            if stack.is_empty() {
                self.stacks.remove(&key);
            }
            if session.is_some() {
                return session;
            }
        }
        None
    }

    /// The next `n` sessions in turn.
    fn take(&mut self, n: usize) -> Vec<Session<P>> {
        std::iter::from_fn(|| self.pop()).take(n).collect()
    }

    /// Removes and returns the sessions `remove` picks; the others keep their turns.
    fn remove_where(&mut self, remove: impl Fn(&Session<P>) -> bool) -> Vec<Session<P>> {
        let mut gone = Vec::new();
        for stack in self.stacks.values_mut() {
            let (out, kept): (Vec<_>, Vec<_>) = stack.drain(..).partition(|s| remove(s));
            *stack = kept;
            gone.extend(out);
        }
        self.stacks.retain(|_, stack| !stack.is_empty());
        if !gone.is_empty() {
            // Each instance keeps its earliest turns, as many as it has sessions left.
            let mut left: HashMap<usize, usize> =
                self.stacks.iter().map(|(k, v)| (*k, v.len())).collect();
            self.turns.retain(|k| match left.get_mut(k) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            });
        }
        gone
    }
}

/// What a lease attempt found: an idle session, or a place in the queue.
enum Taken<P: Protocol> {
    Idle(Session<P>),
    Queued(Waiter<P>),
}

impl<P: Protocol> SlicePool<P> {
    pub(crate) fn new(
        cluster: &str,
        slice: &str,
        (opts, protocol, starting_until): (Arc<ReverseOptions>, Arc<P::Options>, Option<Instant>),
        changed: Arc<Changes>,
        handover: Arc<Handover>,
        metrics: ReverseMetrics,
        (arriving, stopping): (Arc<AtomicUsize>, Arc<AtomicBool>),
    ) -> Self {
        Self {
            id: SliceId::new(cluster, slice),
            opts,
            protocol,
            state: Mutex::default(),
            changed,
            handover,
            owed: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
            metrics,
            registered: AtomicUsize::new(0),
            in_flight: Arc::default(),
            multiplexed: AtomicBool::new(false),
            alive: Arc::default(),
            arriving,
            stopping,
            starting_until,
            empty_logged: AtomicBool::new(false),
            refusals: SharedTally::new(),
            refused: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A session joined this slice with `units` of capacity (its streams); `shared`: its
    /// connection may carry several requests at once (HTTP/2, even of one stream).
    pub(crate) fn session_attached(&self, units: usize, shared: bool) {
        if shared {
            self.multiplexed.store(true, Ordering::Release);
        }
        self.registered.fetch_add(units, Ordering::AcqRel);
        self.empty_logged.store(false, Ordering::Relaxed);
    }

    /// A session of this slice ended (closed, consumed by an upgrade, or handed over). When
    /// it was the last one and none can arrive from elsewhere, the requests waiting for one
    /// are answered at once instead of at their queue timeout (unless `no_sessions_wait`
    /// lets them wait for services to come back).
    pub(crate) fn session_detached(&self, units: usize) {
        let left = self.registered.fetch_sub(units, Ordering::AcqRel) - units;
        let waits = !self.opts.no_sessions_wait.is_zero();
        if left == 0 && !waits && self.arriving.load(Ordering::Relaxed) == 0 {
            self.fail_waiters();
        }
    }

    /// Ends every waiter: each finds its channel closed and the slice empty.
    fn fail_waiters(&self) {
        let waiters = std::mem::take(&mut self.state().waiters);
        let waiting = waiters.iter().filter(|(_, w)| !w.is_closed()).count();
        if waiting > 0 {
            warn!(cluster = %self.id.cluster, slice = %self.id.slice, waiting, "the slice's last session closed: its waiting requests are answered 503 at once");
        }
        drop(waiters);
        self.changed.notify();
    }

    /// Whether a shared session (HTTP/2) has ever joined this slice: set before its streams
    /// join the ring, and never unset.
    pub fn multiplexed(&self) -> bool {
        self.multiplexed.load(Ordering::Acquire)
    }

    /// Units of capacity attached to this slice, idle or leased: one per session, one per
    /// stream of a session that takes several requests at once.
    pub(crate) fn registered(&self) -> usize {
        self.registered.load(Ordering::Acquire)
    }

    /// The count of this slice's sessions alive anywhere, which their permits keep.
    pub(crate) fn alive(&self) -> &Arc<AtomicUsize> {
        &self.alive
    }

    /// How long a request may wait for a session, from now: `no_sessions_wait` when the
    /// slice has none at all, or what is left of the start-up window if that is longer
    /// (`None`: refuse at once); else `queue_timeout`.
    fn wait_limit(&self) -> Option<std::time::Duration> {
        let empty = self.registered.load(Ordering::Acquire) == 0
            && self.arriving.load(Ordering::Relaxed) == 0;
        if !empty {
            return Some(self.opts.queue_timeout);
        }
        let starting = self.starting_until.map_or(std::time::Duration::ZERO, |t| {
            t.saturating_duration_since(Instant::now())
        });
        let wait = self
            .opts
            .no_sessions_wait
            .min(self.opts.queue_timeout)
            .max(starting);
        (!wait.is_zero()).then_some(wait)
    }

    fn no_sessions(&self) -> LeaseError {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .refused(&self.id.cluster, &self.id.slice, "no_sessions");
        if !self.empty_logged.swap(true, Ordering::Relaxed) {
            warn!(cluster = %self.id.cluster, slice = %self.id.slice, "no sessions registered: requests are refused with 503 until a service registers");
        }
        LeaseError::NoSessions {
            cluster: self.id.cluster.clone(),
            slice: self.id.slice.clone(),
        }
    }

    /// A 503 for want of capacity. Under overload there is one per request, so the log says
    /// so once per interval, with how many since the last line.
    fn refuse(&self, reason: &'static str, kind: &'static str) -> LeaseError {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.metrics.refused(&self.id.cluster, &self.id.slice, kind);
        if let Some(refused) = self.refusals.record() {
            warn!(cluster = %self.id.cluster, slice = %self.id.slice, refused, reason, "requests refused with 503 for want of capacity (count since the last such line)");
        }
        LeaseError::unavailable(reason)
    }

    /// The slice's name.
    pub fn slice(&self) -> &str {
        &self.id.slice
    }

    /// The cluster's name.
    pub fn cluster(&self) -> &str {
        &self.id.cluster
    }

    /// The cluster's options: queue, timeouts, buffers.
    pub fn options(&self) -> &ReverseOptions {
        &self.opts
    }

    /// The proxy's settings of the cluster ([`Protocol::Options`]).
    pub fn protocol_options(&self) -> &P::Options {
        &self.protocol
    }

    fn state(&self) -> MutexGuard<'_, State<P>> {
        // A panic while holding the lock leaves the ring consistent (no invariant spans two
        // fields), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Idle sessions in the ring (some may have died since they were returned).
    pub fn idle(&self) -> usize {
        self.state().idle.len()
    }

    /// What a control link reports of this slice here ([`Load`]), read under one lock.
    pub fn load(&self) -> Load {
        let queued = {
            let st = self.state();
            st.waiters.iter().filter(|(_, w)| !w.is_closed()).count()
        };
        Load {
            in_flight: self.in_flight.load(Ordering::Acquire),
            queued,
            refused: self.refused.load(Ordering::Relaxed),
            sessions: self.registered(),
        }
    }

    /// `instance`'s service asked for `n` sessions fewer: idle ones close now, the rest as they
    /// come back ([`checkin`](Self::checkin)); returns how many closed now. A session is its
    /// connection: the streams of one that takes several requests at once count once, and it
    /// closes once its busy streams are back.
    pub(crate) fn retire_idle(
        &self,
        instance: &Arc<Instance>,
        n: usize,
        link: Option<u64>,
    ) -> usize {
        let closed = std::cell::Cell::new(0);
        let mut st = self.state();
        // Owed under the lock that `checkin` claims under: a session coming back meanwhile is
        // either idle here or claims one of these as it comes back (never idle with one owed).
        instance.owe_retirements(link, n);
        let mut removed = st.idle.remove_where(|s| {
            if !Arc::ptr_eq(s.instance(), instance) {
                return false;
            }
            // A stream of a connection already ending goes without counting again.
            if s.is_shared() && s.is_closed() {
                return true;
            }
            let Some(claim) = instance.take_retirement() else {
                return false;
            };
            if s.end() {
                closed.set(closed.get() + 1);
            } else {
                // Ended meanwhile for another claim: this one is owed again.
                instance.owe_again(claim);
            }
            true
        });
        // Streams of the connections just ended that the pass had already gone by.
        removed.extend(st.idle.remove_where(|s| s.is_shared() && s.is_closed()));
        drop(st);
        let closed = closed.get();
        // Dropped outside the lock: each drop closes a connection.
        drop(removed);
        self.changed.notify();
        closed
    }

    /// Requests waiting for a session.
    pub fn queued(&self) -> usize {
        self.state()
            .waiters
            .iter()
            .filter(|(_, w)| !w.is_closed())
            .count()
    }

    /// How long the longest waiter still waiting has waited (zero with nobody waiting).
    pub fn oldest_wait(&self) -> std::time::Duration {
        let st = self.state();
        let oldest = st.waiters.iter().find(|(_, w)| !w.is_closed());
        oldest.map_or(std::time::Duration::ZERO, |(since, _)| since.elapsed())
    }

    /// Leases a live session exclusively: an idle one, or the next one returned or registered
    /// while this request waits in the queue (at most `queue_timeout`).
    pub async fn lease(self: &Arc<Self>) -> Result<Session<P>, LeaseError> {
        self.lease_waited().await.map(|(session, _)| session)
    }

    /// [`lease`](Self::lease), and how long the request waited in the queue (zero when a
    /// session was idle: such a lease reads no clock).
    pub async fn lease_waited(
        self: &Arc<Self>,
    ) -> Result<(Session<P>, std::time::Duration), LeaseError> {
        // Read only once the request has to wait: a lease of an idle session reads no clock.
        let mut started: Option<Instant> = None;
        loop {
            let mut session = match self.take()? {
                Taken::Idle(session) => session,
                Taken::Queued(mut waiter) => {
                    let empty = self.registered.load(Ordering::Acquire) == 0;
                    let Some(limit) = self.wait_limit() else {
                        return Err(self.no_sessions());
                    };
                    let queued = Instant::now();
                    let started = *started.get_or_insert(queued);
                    let waited = waiter.wait(started + limit).await;
                    let waited_for = queued.elapsed();
                    self.metrics
                        .queue_wait(&self.id.cluster, &self.id.slice, waited_for);
                    match waited {
                        Err(LeaseError::Unavailable { .. })
                            if empty && self.registered.load(Ordering::Acquire) == 0 =>
                        {
                            return Err(self.no_sessions());
                        }
                        waited => waited?,
                    }
                }
            };
            // `ready` waits out the moment between a body's end and hyper's dispatcher being
            // idle again, and fails for a session the service closed meanwhile. It is bounded:
            // a session still busy writing a slow upload the service answered early would
            // otherwise hold this request; such a session is closed (its SDK re-dials).
            let ready = match session.ready_now() {
                Poll::Ready(ready) => ready,
                Poll::Pending => {
                    let ready = tokio::time::timeout(self.opts.queue_timeout, session.ready());
                    matches!(ready.await, Ok(true))
                }
            };
            if ready && session.usable() {
                let waited = started.map_or(std::time::Duration::ZERO, |s| s.elapsed());
                return Ok((session, waited));
            }
            debug!(cluster = %self.id.cluster, slice = %self.id.slice, instance = %session.instance().id(), "discarded a dead idle session");
        }
    }

    fn take(self: &Arc<Self>) -> Result<Taken<P>, LeaseError> {
        let mut st = self.state();
        while let Some(mut session) = st.idle.pop() {
            if session.usable() {
                session.lend(&self.in_flight);
                drop(st);
                self.changed.notify();
                return Ok(Taken::Idle(session));
            }
        }
        if st.waiters.len() >= self.opts.queue_max {
            // Purge waiters that gave up only when some did: under overload the queue stays
            // full, and scanning all of it for every refused request cost more than the 503.
            if self.abandoned.swap(0, Ordering::AcqRel) > 0 {
                st.waiters.retain(|(_, w)| !w.is_closed());
            }
            if st.waiters.len() >= self.opts.queue_max {
                return Err(self.refuse("no capacity: admission queue full", "queue_full"));
            }
        }
        let (tx, rx) = oneshot::channel();
        st.waiters.push_back((Instant::now(), tx));
        drop(st);
        self.changed.notify();
        Ok(Taken::Queued(Waiter {
            rx,
            pool: Arc::clone(self),
            settled: false,
        }))
    }

    /// Returns a session: to the longest waiter if there is one, else to the ring's tail (or,
    /// while the cluster hands over, to the next process). Dead sessions and those of
    /// draining instances are dropped (which closes them).
    pub(crate) fn checkin(&self, mut session: Session<P>) {
        session.give_back();
        // Retirements and recalls are owed under this lock (`retire_idle`, `recall`), so a
        // session claims one here or is idle when they look: never idle with one owed.
        let mut st = self.state();
        if session.is_shared() && session.is_closed() {
            // A stream of a connection that ended or is ending: nothing more to count.
            drop(st);
            drop(session);
            self.changed.notify();
            return;
        }
        if let Some(claim) = session.instance().take_retirement() {
            // Its service asked for one session fewer while this one was busy. A connection
            // that another of its streams ended meanwhile counted already: owed again.
            if !session.end() {
                session.instance().owe_again(claim);
            }
            drop(st);
            drop(session);
            self.changed.notify();
            return;
        }
        if session.usable() && self.take_owed() {
            drop(st);
            self.let_go(session);
            self.changed.notify();
            return;
        }
        if session.usable() {
            loop {
                let Some((_, tx)) = st.waiters.pop_front() else {
                    if self.handover.takes(st.idle.len()) {
                        drop(st);
                        self.let_go(session);
                        break;
                    }
                    if self.stops(st.idle.len()) {
                        drop(st);
                        session.end();
                        drop(session);
                        break;
                    }
                    st.idle.push(session);
                    drop(st);
                    break;
                };
                session.lend(&self.in_flight);
                match tx.send(session) {
                    Ok(()) => {
                        drop(st);
                        break;
                    }
                    Err(mut back) => {
                        back.give_back();
                        session = back;
                    }
                }
            }
        } else {
            drop(st);
            drop(session);
        }
        self.changed.notify();
    }

    /// Whether a session returning to a slice with `idle` idle sessions and no waiter closes:
    /// the node is stopping, and the slice keeps one for requests that still arrive while
    /// its listeners close (the rest close when the proxy ends).
    fn stops(&self, idle: usize) -> bool {
        idle > 0 && self.stopping.load(Ordering::Acquire)
    }

    /// The node stops: every idle session closes now but one, so that its service dials it
    /// elsewhere (`DRAINING`). A request waiting here finds none idle: it gets the next one
    /// returned ([`checkin`](Self::checkin)).
    pub(crate) fn stop_idle(&self) {
        let closed: Vec<Session<P>> = {
            let mut st = self.state();
            drop(st.idle.remove_where(|s| !s.usable()));
            let n = st.idle.len().saturating_sub(1);
            st.idle.take(n)
        };
        for session in &closed {
            session.end();
        }
        // Dropped outside the lock: each drop closes a connection.
        drop(closed);
        self.changed.notify();
    }

    /// Hands over the idle sessions beyond what the hand-over keeps, unless a request waits
    /// here (it gets the next one returned instead).
    pub(crate) fn hand_over_idle(&self) {
        let handed: Vec<Session<P>> = {
            let mut st = self.state();
            if !self.handover.active() || st.waiters.iter().any(|(_, w)| !w.is_closed()) {
                return;
            }
            let n = st.idle.len().saturating_sub(self.handover.keeps());
            st.idle.take(n)
        };
        for session in handed {
            self.let_go(session);
        }
        self.changed.notify();
    }

    /// The lender wants `n` sessions back: idle ones leave now, the rest as they are returned.
    pub(crate) fn recall(&self, n: usize) {
        let handed: Vec<Session<P>> = {
            let mut st = self.state();
            drop(st.idle.remove_where(|s| !s.usable()));
            let now = n.min(st.idle.len());
            self.owed.fetch_add(n - now, Ordering::AcqRel);
            st.idle.take(now)
        };
        for session in handed {
            self.let_go(session);
        }
        self.changed.notify();
    }

    /// Forgets recalls (the lender they were owed to is gone).
    pub(crate) fn forgive(&self) {
        self.owed.store(0, Ordering::Release);
    }

    fn take_owed(&self) -> bool {
        self.handover.active()
            && self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
    }

    /// Hands over up to `n` idle sessions when nobody here waits for one; returns how many.
    pub(crate) fn hand_over_some(&self, n: usize) -> usize {
        let handed: Vec<Session<P>> = {
            let mut st = self.state();
            if !self.handover.active() || st.waiters.iter().any(|(_, w)| !w.is_closed()) {
                return 0;
            }
            drop(st.idle.remove_where(|s| !s.usable()));
            let n = n.min(st.idle.len());
            st.idle.take(n)
        };
        let count = handed.len();
        for session in handed {
            self.let_go(session);
        }
        // The lender counts every session that comes back against what it recalled.
        self.settle_owed(count);
        // Only a real change wakes observers: a standalone acceptor's pump calls this on
        // every change, and must not wake itself for nothing.
        if count > 0 {
            self.changed.notify();
        }
        count
    }

    /// Passes a parked session's socket to the hand-over's receiver.
    pub(crate) fn hand_off(&self, io: Box<dyn SessionStream>, permit: SessionPermit) {
        let handed = Handed::new(io, self.id.clone(), permit);
        self.handover.send(handed);
    }

    /// A session let go for the hand-over ended before it could be parked.
    pub(crate) fn hand_off_lost(&self) {
        self.handover.lost(&self.id);
    }

    /// Lets go of a session for the hand-over (see [`Session::hand_over`]).
    fn let_go(&self, session: Session<P>) {
        if !session.hand_over() {
            self.hand_off_lost();
        }
    }

    /// `n` lent sessions left this process without being asked for: that much less is owed.
    pub(crate) fn settle_owed(&self, n: usize) {
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                Some(o.saturating_sub(n))
            });
    }

    /// Drops idle sessions whose connection has ended.
    pub(crate) fn purge_closed(&self) {
        self.remove_idle(|s| s.is_closed());
    }

    /// Closes the idle sessions of a draining instance.
    pub(crate) fn evict(&self, instance: &Arc<Instance>) {
        self.remove_idle(|s| Arc::ptr_eq(s.instance(), instance));
    }

    /// Closes every idle session.
    pub(crate) fn evict_all(&self) {
        self.remove_idle(|_| true);
    }

    fn remove_idle(&self, remove: impl Fn(&Session<P>) -> bool) {
        let removed = self.state().idle.remove_where(remove);
        // Dropped outside the lock: each drop closes a connection.
        drop(removed);
        self.changed.notify();
    }
}

/// One slice's load here, as a control link reports it (`DEMAND`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Sessions leased (requests in flight on them).
    pub in_flight: usize,
    /// Requests waiting in the admission queue.
    pub queued: usize,
    /// Requests refused for want of capacity since the pool began (a running count).
    pub refused: u64,
    /// Sessions attached, idle or leased.
    pub sessions: usize,
}

/// A place in the admission queue. Dropped with a session already handed to it (the request
/// gave up at that very moment), it gives the session back instead of losing it; dropped
/// without one (expired, or the client went away), it counts as abandoned so that a full
/// queue is purged of it.
struct Waiter<P: Protocol> {
    rx: oneshot::Receiver<Session<P>>,
    pool: Arc<SlicePool<P>>,
    /// It got its session, or the slice closed: its queue entry is gone already.
    settled: bool,
}

impl<P: Protocol> Waiter<P> {
    async fn wait(&mut self, deadline: Instant) -> Result<Session<P>, LeaseError> {
        match tokio::time::timeout_at(deadline, &mut self.rx).await {
            Ok(Ok(session)) => {
                self.settled = true;
                Ok(session)
            }
            Ok(Err(_)) => {
                self.settled = true;
                Err(match self.pool.registered() {
                    0 => self.pool.no_sessions(),
                    _ => LeaseError::unavailable("no capacity: slice closed"),
                })
            }
            Err(_elapsed) => {
                self.rx.close();
                let session = self.rx.try_recv().map_err(|_| {
                    self.pool
                        .refuse("no capacity: queue wait expired", "wait_expired")
                })?;
                self.settled = true;
                Ok(session)
            }
        }
    }
}

impl<P: Protocol> Drop for Waiter<P> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        self.rx.close();
        match self.rx.try_recv() {
            Ok(session) => self.pool.checkin(session),
            Err(_) => {
                self.pool.abandoned.fetch_add(1, Ordering::AcqRel);
                // The queue is one shorter for its observers (`queued`, `wait_until`).
                self.pool.changed.notify();
            }
        }
    }
}
