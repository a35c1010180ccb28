//! [`ReverseCluster`]: a cluster's slices and instances, and its roles towards the acceptor,
//! the admin API, a hot restart and a standalone acceptor; [`ReverseSlice`]: what a route
//! forwards to.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sluice_session::{Rejection, Token};
use tokio::sync::{broadcast, mpsc};
use tracing::info;

use crate::changes::Changes;
use crate::error::AdoptError;
use crate::handover::{HandedSession, Handover};
use crate::instance::{locked, Instance, Instances, Lent, Limit, SessionPermit};
use crate::lease;
use crate::metrics::ReverseMetrics;
use crate::options::ReverseOptions;
use crate::pool::SlicePool;
use crate::protocol::Protocol;
use crate::slice_id::SliceId;
use crate::stream::{self, SessionStream};

/// A handle to a reverse cluster whose sessions speak `P`. Clones share it.
#[derive(Debug)]
pub struct ReverseCluster<P: Protocol> {
    inner: Arc<ClusterInner<P>>,
}

impl<P: Protocol> Clone for ReverseCluster<P> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct ClusterInner<P: Protocol> {
    name: String,
    opts: Arc<ReverseOptions>,
    /// The proxy's settings of the cluster.
    protocol: Arc<P::Options>,
    tokens: Vec<Token>,
    slices: Mutex<HashMap<String, Arc<SlicePool<P>>>>,
    instances: Arc<Instances>,
    changed: Arc<Changes>,
    handover: Arc<Handover>,
    drains: broadcast::Sender<String>,
    metrics: ReverseMetrics,
    /// Non-zero while sessions may arrive from elsewhere: a standalone acceptor lends them on
    /// demand, or a predecessor hands them over. A slice with none here is then not a slice
    /// without services.
    arriving: Arc<AtomicUsize>,
    /// Set once the node stops for good ([`ReverseCluster::stopping`]).
    stopping: Arc<AtomicBool>,
    /// Its sessions are lent by a standalone acceptor ([`ReverseCluster::lent`]).
    lent: AtomicBool,
    /// The services' control links open here.
    links: Arc<crate::links::Links>,
    /// The end of the start-up window (`startup_wait` from the cluster's making): until
    /// then a slice without sessions holds its requests, and the node is not ready.
    starting_until: Option<tokio::time::Instant>,
}

/// A handle to one slice of a reverse cluster: what a route forwards to.
#[derive(Debug)]
pub struct ReverseSlice<P: Protocol> {
    cluster: ReverseCluster<P>,
    pool: Arc<SlicePool<P>>,
}

impl<P: Protocol> Clone for ReverseSlice<P> {
    fn clone(&self) -> Self {
        Self {
            cluster: self.cluster.clone(),
            pool: Arc::clone(&self.pool),
        }
    }
}

impl<P: Protocol> ReverseCluster<P> {
    /// A cluster that accepts registrations bearing any of `tokens` (empty: no auth).
    pub fn new(name: impl Into<String>, tokens: Vec<Token>, opts: ReverseOptions) -> Self {
        Self::with_metrics(name, tokens, opts, &ReverseMetrics::default())
    }

    /// As [`new`](Self::new), recording admission-queue waits in `metrics`.
    pub fn with_metrics(
        name: impl Into<String>,
        tokens: Vec<Token>,
        opts: ReverseOptions,
        metrics: &ReverseMetrics,
    ) -> Self {
        Self::with_protocol_options(name, tokens, opts, metrics, P::Options::default())
    }

    /// As [`with_metrics`](Self::with_metrics), keeping the proxy's own settings of the
    /// cluster (`protocol`) for it.
    pub fn with_protocol_options(
        name: impl Into<String>,
        tokens: Vec<Token>,
        opts: ReverseOptions,
        metrics: &ReverseMetrics,
        protocol: P::Options,
    ) -> Self {
        let name = name.into();
        let changed = Arc::new(Changes::default());
        let (max, per_instance) = (opts.max_sessions, opts.max_sessions_per_instance);
        let instances = Instances::new(&name, max, per_instance, Arc::clone(&changed));
        let wait = opts.startup_wait;
        let starting_until = (!wait.is_zero()).then(|| tokio::time::Instant::now() + wait);
        let inner = ClusterInner {
            name,
            opts: Arc::new(opts),
            protocol: Arc::new(protocol),
            tokens,
            slices: Mutex::default(),
            instances: Arc::new(instances),
            changed,
            handover: Arc::default(),
            drains: broadcast::channel(64).0,
            metrics: metrics.clone(),
            arriving: Arc::default(),
            stopping: Arc::default(),
            lent: AtomicBool::new(false),
            links: Arc::default(),
            starting_until,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The cluster's sessions are lent by a standalone acceptor: as under
    /// [`expect_sessions`](Self::expect_sessions), for as long as the cluster lives, a slice
    /// with none here is not a slice without services.
    pub fn lent(self) -> Self {
        self.inner.arriving.fetch_add(1, Ordering::Relaxed);
        self.inner.lent.store(true, Ordering::Relaxed);
        self
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The handle to one slice, created empty on first use (a route's: never refused).
    pub fn slice(&self, slice: &str) -> ReverseSlice<P> {
        let mut slices = locked(&self.inner.slices);
        let pool = slices
            .entry(slice.to_owned())
            .or_insert_with(|| self.new_pool(slice));
        ReverseSlice {
            cluster: self.clone(),
            pool: Arc::clone(pool),
        }
    }

    /// The handle to `slice` for a service's registration or control link. The name is the
    /// service's choice, so a new slice is made only while the cluster holds fewer than `max`
    /// (`None`: no limit), counted after slices nobody uses any more are let go; else 429.
    pub fn admit_slice(
        &self,
        slice: &str,
        max: Option<usize>,
    ) -> Result<ReverseSlice<P>, Rejection> {
        // One lock for the count and the making, so that racing names cannot pass `max`.
        let mut slices = locked(&self.inner.slices);
        if !slices.contains_key(slice) {
            prune(&mut slices);
            if max.is_some_and(|max| slices.len() >= max) {
                return Err(Rejection::limited("slices in this cluster"));
            }
        }
        let pool = slices
            .entry(slice.to_owned())
            .or_insert_with(|| self.new_pool(slice));
        Ok(ReverseSlice {
            cluster: self.clone(),
            pool: Arc::clone(pool),
        })
    }

    /// Lets go of the slices nobody uses any more: no route, link or request holds them and
    /// no session of theirs is alive.
    pub fn prune_slices(&self) {
        prune(&mut locked(&self.inner.slices));
    }

    fn new_pool(&self, slice: &str) -> Arc<SlicePool<P>> {
        let i = &self.inner;
        Arc::new(SlicePool::new(
            &i.name,
            slice,
            (
                Arc::clone(&i.opts),
                Arc::clone(&i.protocol),
                i.starting_until,
            ),
            Arc::clone(&i.changed),
            Arc::clone(&i.handover),
            i.metrics.clone(),
            (Arc::clone(&i.arriving), Arc::clone(&i.stopping)),
        ))
    }

    /// The slices in use (registered for, linked to, or routed to), sorted.
    pub fn slice_names(&self) -> Vec<String> {
        let mut slices = locked(&self.inner.slices);
        prune(&mut slices);
        let mut names: Vec<String> = slices.keys().cloned().collect();
        names.sort();
        names
    }

    /// The instances with sessions, sorted by id.
    pub fn instances(&self) -> Vec<Arc<Instance>> {
        self.inner.instances.sorted()
    }

    /// Sessions of `slice` alive anywhere: attached here, or handed over or lent out with
    /// their permits here (0 for a slice nobody registered for).
    pub(crate) fn alive_sessions(&self, slice: &str) -> usize {
        locked(&self.inner.slices)
            .get(slice)
            .map_or(0, |p| p.alive().load(Ordering::Acquire))
    }

    /// Idle sessions in `slice` (0 for a slice nobody registered for).
    pub fn idle_sessions(&self, slice: &str) -> usize {
        locked(&self.inner.slices)
            .get(slice)
            .map_or(0, |p| p.idle())
    }

    /// How long the longest request waiting in `slice`'s queue has waited.
    pub fn oldest_wait(&self, slice: &str) -> std::time::Duration {
        locked(&self.inner.slices)
            .get(slice)
            .map_or(std::time::Duration::ZERO, |p| p.oldest_wait())
    }

    /// Requests waiting in `slice`'s admission queue.
    pub fn queued(&self, slice: &str) -> usize {
        locked(&self.inner.slices)
            .get(slice)
            .map_or(0, |p| p.queued())
    }

    /// How long the node's start-up window still holds this cluster's requests for its
    /// first session: `Some` while the window is open and no session has arrived (the node is
    /// not ready for clients), `None` once either has happened.
    pub fn awaiting_sessions(&self) -> Option<std::time::Duration> {
        let until = self.inner.starting_until?;
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        (!left.is_zero()
            && self.sessions() == 0
            && self.inner.arriving.load(Ordering::Relaxed) == 0)
            .then_some(left)
    }

    /// Connected sessions across all slices and instances.
    pub fn sessions(&self) -> usize {
        self.inner.instances.sessions()
    }

    /// How many more sessions the cluster's `max_sessions` allows (`usize::MAX`: no limit).
    pub fn room(&self) -> usize {
        self.inner
            .opts
            .max_sessions
            .map_or(usize::MAX, |max| max.saturating_sub(self.sessions()))
    }

    /// Connected sessions of one instance.
    pub fn instance_sessions(&self, instance: &str) -> usize {
        self.inner
            .instances
            .get(instance)
            .map_or(0, |i| i.sessions())
    }

    /// Waits until `done` holds; it is re-checked whenever sessions come, go or return.
    pub async fn wait_until(&self, done: impl Fn(&Self) -> bool) {
        self.inner.changed.wait_until(|| done(self)).await;
    }

    /// Drains an instance: it is never leased again, its idle sessions close now and its
    /// busy ones after their responses. Returns false when no such instance is registered.
    pub fn drain(&self, instance: &str) -> bool {
        let Some(inst) = self.inner.instances.get(instance) else {
            // Lent sessions of it may be out at consumers: they hear of it all the same.
            let _ = self.inner.drains.send(instance.to_owned());
            return false;
        };
        inst.start_draining();
        info!(cluster = %self.inner.name, instance = %instance, sessions = inst.sessions(), "draining instance");
        let _ = self.inner.drains.send(instance.to_owned());
        let pools: Vec<_> = locked(&self.inner.slices).values().cloned().collect();
        for pool in pools {
            pool.evict(&inst);
        }
        true
    }

    /// Drains an instance as [`drain`](Self::drain) does and keeps it out: its registrations
    /// are refused with `410 Gone` until [`resume`](Self::resume), so SDKs stop re-dialing.
    /// An operator's drain; a service's own drain request (its shutdown) is not held. Returns
    /// false when the instance is neither registered nor already held.
    pub fn drain_and_hold(&self, instance: &str) -> bool {
        let newly = self.inner.instances.hold(instance);
        let known = self.drain(instance);
        if newly && !known {
            self.inner.instances.unhold(instance);
        }
        known || !newly
    }

    /// Its service asked for `n` sessions of `instance` fewer in `slice`: idle ones close
    /// now, the rest as they come back. Returns how many closed now. What is owed never
    /// lapses; a control link's `RETIRE` is [`retire_on`](Self::retire_on).
    pub fn retire(&self, slice: &str, instance: &str, n: usize) -> usize {
        self.retire_for(slice, instance, n, None)
    }

    /// [`retire`](Self::retire) asked on the control link `link`: what it owes when the link
    /// ends lapses ([`lapse`](Self::lapse); protocol/README.md, `RETIRE`).
    pub fn retire_on(&self, slice: &str, instance: &str, n: usize, link: u64) -> usize {
        self.retire_for(slice, instance, n, Some(link))
    }

    fn retire_for(&self, slice: &str, instance: &str, n: usize, link: Option<u64>) -> usize {
        let Some(inst) = self.inner.instances.get(instance) else {
            return 0;
        };
        let Some(pool) = locked(&self.inner.slices).get(slice).cloned() else {
            return 0;
        };
        let closed = pool.retire_idle(&inst, n, link);
        info!(cluster = %self.inner.name, slice, instance, asked = n, closed_now = closed, "service retires sessions here");
        closed
    }

    /// The control link `link` of `instance` ended: the retirements it asked that are still
    /// owed lapse (its SDK asks again on its next link, for what is still surplus then).
    /// Returns how many lapsed.
    pub fn lapse(&self, instance: &str, link: u64) -> usize {
        self.inner
            .instances
            .get(instance)
            .map_or(0, |inst| inst.lapse(link))
    }

    /// What a control link reports of `slice` here (all zero for a slice not in use).
    pub fn load(&self, slice: &str) -> crate::pool::Load {
        let pool = locked(&self.inner.slices).get(slice).cloned();
        pool.map_or_else(Default::default, |p| p.load())
    }

    /// Whether a peer at `from` may retire or drain `instance`'s sessions: it is at an
    /// address one of them came from (see [`Instance::answers_to`]); any peer may speak for
    /// an instance not registered here.
    pub fn answers_to(&self, instance: &str, from: Option<std::net::IpAddr>) -> bool {
        let inst = self.inner.instances.get(instance);
        inst.is_none_or(|i| i.answers_to(from))
    }

    /// Whether an operator holds `instance` out (its registrations get `410`).
    pub fn is_held(&self, instance: &str) -> bool {
        self.inner.instances.is_held(instance)
    }

    /// The control links of this cluster's services (many nodes).
    pub fn links(&self) -> &Arc<crate::links::Links> {
        &self.inner.links
    }

    /// Lets a held instance register again. Returns false when it was not held. Sessions it
    /// still has (draining) close as they would have; new ones are accepted once they have.
    pub fn resume(&self, instance: &str) -> bool {
        let resumed = self.inner.instances.unhold(instance);
        if resumed {
            info!(cluster = %self.inner.name, instance = %instance, "instance resumed");
        }
        resumed
    }

    /// The instances an operator drained and has not resumed, sorted.
    pub fn held(&self) -> Vec<String> {
        self.inner.instances.held()
    }

    /// The node stops for good (not a hot restart), as its control links say `DRAINING`: the
    /// services dial their sessions elsewhere, but do not close those here, which still
    /// answer the requests queued here. So each slice closes its idle sessions now but one
    /// (for requests that still arrive while the listeners close), and a session that
    /// comes back goes to the next request waiting in its slice, and closes when none
    /// waits. [`close`](Self::close) ends the rest when the proxy has stopped. Sessions lent
    /// by a standalone acceptor ([`lent`](Self::lent)) are not this node's to close: they go
    /// back to it (`RETURN`) when the proxy has stopped, and their services hear nothing here.
    pub fn stopping(&self) {
        if self.inner.lent.load(Ordering::Relaxed) {
            return;
        }
        self.inner.stopping.store(true, Ordering::Release);
        let pools: Vec<_> = locked(&self.inner.slices).values().cloned().collect();
        for pool in pools {
            pool.stop_idle();
        }
    }

    /// Closes every session: idle ones now, busy ones when their responses end. The proxy
    /// calls this when it stops.
    pub fn close(&self) {
        for inst in &self.inner.instances.sorted() {
            inst.start_draining();
        }
        let pools: Vec<_> = locked(&self.inner.slices).values().cloned().collect();
        for pool in pools {
            pool.evict_all();
        }
    }

    /// Whether registering needs a bearer token.
    pub fn has_tokens(&self) -> bool {
        !self.inner.tokens.is_empty()
    }

    /// Whether `token` opens this cluster. Every configured token is compared in full, so
    /// the time taken does not say which one (or how much of one) matched.
    pub fn authorize(&self, token: Option<&str>) -> bool {
        if self.inner.tokens.is_empty() {
            return true;
        }
        let given = token.unwrap_or("").as_bytes();
        Token::any_matches(&self.inner.tokens, given) && token.is_some()
    }

    /// Reserves a place for one more session of `instance`, within the total (`global`),
    /// cluster and instance limits. 410 for a held instance, 503 for a draining one, 429 at
    /// a limit.
    pub fn reserve(&self, instance: &str, global: &Arc<Limit>) -> Result<SessionPermit, Rejection> {
        self.inner.instances.reserve(instance, global)
    }

    /// Makes `io` (already answered `101`) an idle session of `slice`, taking `streams`
    /// requests at once when it speaks HTTP/2 (`None`: one at a time, HTTP/1.1).
    pub async fn attach(
        &self,
        slice: &str,
        io: Box<dyn SessionStream>,
        permit: SessionPermit,
        streams: Option<u32>,
    ) -> Result<(), P::Error> {
        self.slice(slice).attach(io, permit, streams).await
    }

    /// Keeps requests to slices without sessions waiting (as by `no_sessions_wait`) until the
    /// guard drops: sessions are about to arrive (a hot restart's predecessor hands its over).
    pub fn expect_sessions(&self) -> ExpectSessions {
        self.inner.arriving.fetch_add(1, Ordering::Relaxed);
        ExpectSessions(Arc::clone(&self.inner.arriving))
    }

    /// Takes in a session that registered elsewhere and was handed to this process (a hot
    /// restart's predecessor, docs/design.md §4): it counts against the same limits as one that
    /// registered here (`total` is the acceptor's), then joins `slice` as idle.
    pub async fn adopt(
        &self,
        slice: &str,
        instance: &str,
        fd: OwnedFd,
        total: &Arc<Limit>,
    ) -> Result<(), AdoptError> {
        let mut permit = self.reserve(instance, total).map_err(AdoptError::Refused)?;
        permit.came_from(peer_ip(&fd));
        let io = stream::from_fd(fd).map_err(AdoptError::Socket)?;
        self.attach(slice, io, permit, None)
            .await
            .map_err(|e| AdoptError::Client(Box::new(e)))
    }

    /// Takes in a session a standalone acceptor lent this process (a consumer): when it ends
    /// here, `lent.gone` reports its id. Counted against this cluster's limits only.
    pub(crate) async fn adopt_lent(
        &self,
        slice: &str,
        instance: &str,
        fd: OwnedFd,
        lent: Lent,
    ) -> Result<(), AdoptError> {
        let unlimited = Arc::new(Limit::new(None));
        let mut permit = match self.reserve(instance, &unlimited) {
            Ok(permit) => permit,
            Err(rejection) => {
                // No permit carries the id: report it here, or the lender would count the
                // session (its limits, its `out` entry) until this consumer disconnects.
                let _ = lent.gone.send(lent.id);
                return Err(AdoptError::Refused(rejection));
            }
        };
        permit.lent = Some(lent);
        let io = stream::from_fd(fd).map_err(AdoptError::Socket)?;
        self.attach(slice, io, permit, None)
            .await
            .map_err(|e| AdoptError::Client(Box::new(e)))
    }

    /// Puts a session that came back (a consumer's `RETURN`) into `slice` again, with the
    /// permit it kept while it was away.
    pub(crate) async fn reattach(
        &self,
        slice: &str,
        fd: OwnedFd,
        permit: SessionPermit,
    ) -> Result<(), AdoptError> {
        let io = stream::from_fd(fd).map_err(AdoptError::Socket)?;
        self.attach(slice, io, permit, None)
            .await
            .map_err(|e| AdoptError::Client(Box::new(e)))
    }

    /// Lets idle sessions leave only when [`hand_over_some`](Self::hand_over_some) asks,
    /// each to `to` with its permit (a standalone acceptor lending them, a consumer returning
    /// them). `lost`, if given, hears the slice of each session let go that will
    /// never reach `to` (its connection ended first, or it cannot move).
    pub(crate) fn start_pull(
        &self,
        to: mpsc::UnboundedSender<HandedSession>,
        lost: Option<mpsc::UnboundedSender<SliceId>>,
    ) {
        self.inner.handover.start_pull(to, lost);
        for pool in locked(&self.inner.slices).values() {
            pool.forgive();
        }
    }

    /// The lender wants `n` sessions of `slice` back (`RECALL`): idle ones go now, the rest
    /// as their responses end, ahead of requests waiting here.
    pub(crate) fn recall(&self, slice: &str, n: usize) {
        if let Some(pool) = locked(&self.inner.slices).get(slice).cloned() {
            pool.recall(n);
        }
    }

    /// The lender wants every session back (this process stops): idle ones go now, the rest
    /// as their responses end.
    pub(crate) fn recall_all(&self) {
        let pools: Vec<_> = locked(&self.inner.slices).values().cloned().collect();
        for pool in pools {
            pool.recall(pool.registered());
        }
    }

    /// Hands up to `n` idle sessions of `slice` over (see [`start_pull`](Self::start_pull));
    /// returns how many left.
    pub(crate) fn hand_over_some(&self, slice: &str, n: usize) -> usize {
        let pool = locked(&self.inner.slices).get(slice).cloned();
        pool.map_or(0, |p| p.hand_over_some(n))
    }

    /// Resolves at the next change of sessions, idle rings or queues.
    pub(crate) async fn changed(&self) {
        self.inner.changed.next().await;
    }

    /// The instance ids drained from now on, as they are drained.
    pub fn subscribe_drains(&self) -> broadcast::Receiver<String> {
        self.inner.drains.subscribe()
    }

    /// Starts handing idle sessions to `to` (each as it becomes idle while nobody here waits
    /// for one); with `keep_one`, every slice keeps its last idle session until
    /// [`finish_handover`](Self::finish_handover).
    pub fn start_handover(&self, to: mpsc::UnboundedSender<HandedSession>, keep_one: bool) {
        self.inner.handover.start(to, keep_one);
        self.hand_over_idle();
    }

    /// Hands over every idle session, the kept ones included.
    pub fn finish_handover(&self) {
        self.inner.handover.keep_none();
        self.hand_over_idle();
    }

    /// Ends the hand-over: sessions that become idle from now on stay in this process.
    pub fn stop_handover(&self) {
        self.inner.handover.stop();
    }

    fn hand_over_idle(&self) {
        let pools: Vec<_> = locked(&self.inner.slices).values().cloned().collect();
        for pool in pools {
            pool.hand_over_idle();
        }
    }
}

/// The address at the other end of a session handed over from another process (`None`: a
/// UNIX socket), so that its instance stays bound to it here.
fn peer_ip(fd: &OwnedFd) -> Option<std::net::IpAddr> {
    let addr = socket2::SockRef::from(fd).peer_addr().ok()?;
    addr.as_socket().map(|a| a.ip())
}

/// Keeps the slices something uses: a handle (a route, a control link, a request), a session
/// alive (here, handed over or lent out) or a request waiting.
fn prune<P: Protocol>(slices: &mut HashMap<String, Arc<SlicePool<P>>>) {
    slices.retain(|_, pool| {
        Arc::strong_count(pool) > 1 || pool.alive().load(Ordering::Acquire) > 0 || pool.queued() > 0
    });
}

/// While it lives, sessions are expected to arrive; see [`ReverseCluster::expect_sessions`].
#[derive(Debug)]
pub struct ExpectSessions(Arc<AtomicUsize>);

impl Drop for ExpectSessions {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<P: Protocol> ReverseSlice<P> {
    /// The cluster's name.
    pub fn name(&self) -> &str {
        self.cluster.name()
    }

    /// The slice's name.
    pub fn slice(&self) -> &str {
        self.pool.slice()
    }

    /// The cluster this slice belongs to.
    pub fn cluster(&self) -> &ReverseCluster<P> {
        &self.cluster
    }

    /// The slice's pool, to lease sessions from.
    pub fn pool(&self) -> &Arc<SlicePool<P>> {
        &self.pool
    }

    /// Makes `io` (already answered `101`) an idle session of this slice, taking `streams`
    /// requests at once when it speaks HTTP/2 (`None`: one at a time, HTTP/1.1).
    pub async fn attach(
        &self,
        io: Box<dyn SessionStream>,
        permit: SessionPermit,
        streams: Option<u32>,
    ) -> Result<(), P::Error> {
        lease::attach(io, &self.pool, permit, streams).await
    }
}
