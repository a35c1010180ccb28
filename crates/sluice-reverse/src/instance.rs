//! Instances (one service process, many sessions): a cluster's registry of them, session
//! limits, and the permit a live session holds.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use sluice_session::Rejection;
use tokio::sync::mpsc;

use crate::changes::Changes;

pub(super) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its map consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An owed retirement claimed by a returning session, and the link that asked for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim(Option<u64>);

/// A counter with an optional ceiling: sessions in total, per cluster, per instance.
#[derive(Debug, Default)]
pub struct Limit {
    count: AtomicUsize,
    max: Option<usize>,
}

impl Limit {
    /// A counter at zero that refuses to go above `max` (`None`: no ceiling).
    pub fn new(max: Option<usize>) -> Self {
        Self {
            count: AtomicUsize::new(0),
            max,
        }
    }

    /// Counts one more, unless that would pass the ceiling.
    pub fn try_take(&self) -> bool {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| match self.max {
                Some(max) if n >= max => None,
                _ => Some(n + 1),
            })
            .is_ok()
    }

    /// Counts one fewer.
    pub fn give(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }

    /// The current count.
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

/// One registered service instance: its id, whether it drains, and its live sessions.
#[derive(Debug)]
pub struct Instance {
    id: String,
    draining: AtomicBool,
    pub(super) sessions: Limit,
    /// Sessions an upgrade (WebSocket) took over, still bridged to their clients.
    pub(super) upgraded: AtomicUsize,
    /// Sessions its service asked to retire (`RETIRE` on a control link) that were busy then:
    /// each closes when it is next returned. The total of `owed`, read without its lock.
    retiring: AtomicUsize,
    /// Those retirements by the link that asked for them (`None`: no link, they never
    /// lapse), in the order the links first asked: what a link asked lapses with the link.
    owed: Mutex<Vec<(Option<u64>, usize)>>,
    /// The addresses its live sessions registered from, with how many from each: a control
    /// link or a drain request speaks for the instance only from one of them.
    addrs: Mutex<HashMap<IpAddr, usize>>,
    /// The capacity its latest session registration declared (`Sluice-Capacity`); 0: none
    /// did. With one acceptor there is no control link to declare it on.
    declared: AtomicU64,
    /// The registry that lists it (weak: the registry owns its instances).
    listed_in: Weak<Instances>,
}

impl Instance {
    fn new(id: String, max_sessions: Option<usize>, listed_in: Weak<Instances>) -> Self {
        Self {
            id,
            draining: AtomicBool::new(false),
            sessions: Limit::new(max_sessions),
            upgraded: AtomicUsize::new(0),
            retiring: AtomicUsize::new(0),
            owed: Mutex::default(),
            addrs: Mutex::default(),
            declared: AtomicU64::new(0),
            listed_in,
        }
    }

    /// The instance id (`Sluice-Instance`, or the peer's IP address).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the instance is draining: its sessions are never leased again.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub(super) fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// The sessions of this instance that are still connected.
    pub fn sessions(&self) -> usize {
        self.sessions.current()
    }

    /// Whether a control link or drain request from `from` may speak for this instance: an
    /// instance id is the service's choice, so only a peer at an address its sessions came
    /// from may retire or drain them (protocol/README.md, "Who may speak for an instance").
    /// An instance none of whose sessions has a known address (UNIX socket) is bound to none.
    pub fn answers_to(&self, from: Option<IpAddr>) -> bool {
        let addrs = locked(&self.addrs);
        addrs.is_empty() || from.is_some_and(|ip| addrs.contains_key(&ip.to_canonical()))
    }

    /// Sessions its service asked to retire that close as they come back (busy when asked).
    pub fn retiring(&self) -> usize {
        self.retiring.load(Ordering::Acquire)
    }

    /// `n` more sessions close as they come back, asked by `link` (`None`: by no link).
    pub(crate) fn owe_retirements(&self, link: Option<u64>, n: usize) {
        let mut owed = locked(&self.owed);
        match owed.iter_mut().find(|(l, _)| *l == link) {
            Some((_, k)) => *k += n,
            None => owed.push((link, n)),
        }
        self.retiring.fetch_add(n, Ordering::AcqRel);
    }

    /// Claims one owed retirement for a session that came back (the oldest link's first):
    /// the link it was owed to, `None` when none is owed.
    pub(crate) fn take_retirement(&self) -> Option<Claim> {
        if self.retiring.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut owed = locked(&self.owed);
        let (link, k) = owed.iter_mut().find(|(_, k)| *k > 0)?;
        *k -= 1;
        self.retiring.fetch_sub(1, Ordering::AcqRel);
        Some(Claim(*link))
    }

    /// A claimed retirement that its session could not settle (it ended meanwhile for
    /// another claim): owed again, unless its link has lapsed since.
    pub(crate) fn owe_again(&self, claim: Claim) {
        let mut owed = locked(&self.owed);
        if let Some((_, k)) = owed.iter_mut().find(|(l, _)| *l == claim.0) {
            *k += 1;
            self.retiring.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// `link` ended: what it asked and was not done lapses (protocol/README.md, `RETIRE`).
    /// Returns how many retirements lapsed.
    pub(crate) fn lapse(&self, link: u64) -> usize {
        let mut owed = locked(&self.owed);
        let Some(at) = owed.iter().position(|(l, _)| *l == Some(link)) else {
            return 0;
        };
        let (_, k) = owed.remove(at);
        self.retiring.fetch_sub(k, Ordering::AcqRel);
        k
    }

    /// The capacity its sessions' registrations declared (`Sluice-Capacity`), the latest's;
    /// `None` when none did.
    pub fn declared(&self) -> Option<u64> {
        Some(self.declared.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// Former sessions of this instance that an upgrade (WebSocket) took over and that are
    /// still open. They no longer count as sessions (the service re-dials a replacement), but
    /// the instance is listed while any is open.
    pub fn upgraded(&self) -> usize {
        self.upgraded.load(Ordering::Acquire)
    }
}

/// A cluster's instances: who is registered, who an operator holds out, and the cluster's
/// session limit. Whoever changes them wakes `changed`.
#[derive(Debug)]
pub(crate) struct Instances {
    cluster: String,
    listed: Mutex<HashMap<String, Arc<Instance>>>,
    /// Instances an operator drained: their registrations are refused (410) until resumed.
    held: Mutex<BTreeSet<String>>,
    sessions: Limit,
    per_instance: Option<usize>,
    changed: Arc<Changes>,
}

impl Instances {
    /// No instances yet, for `cluster`, whose sessions in all are limited to `max` and per
    /// instance to `per_instance`.
    pub(super) fn new(
        cluster: &str,
        max: Option<usize>,
        per_instance: Option<usize>,
        changed: Arc<Changes>,
    ) -> Self {
        Self {
            cluster: cluster.to_owned(),
            listed: Mutex::default(),
            held: Mutex::default(),
            sessions: Limit::new(max),
            per_instance,
            changed,
        }
    }

    /// Connected sessions of all instances.
    pub(super) fn sessions(&self) -> usize {
        self.sessions.current()
    }

    /// The instance with this id, if it has sessions.
    pub(super) fn get(&self, id: &str) -> Option<Arc<Instance>> {
        locked(&self.listed).get(id).cloned()
    }

    /// Every listed instance, sorted by id.
    pub(super) fn sorted(&self) -> Vec<Arc<Instance>> {
        let mut all: Vec<_> = locked(&self.listed).values().cloned().collect();
        all.sort_by(|a, b| a.id().cmp(b.id()));
        all
    }

    /// Holds `id` out (its registrations are refused); false if it already was.
    pub(super) fn hold(&self, id: &str) -> bool {
        locked(&self.held).insert(id.to_owned())
    }

    /// Lets a held `id` register again; false if it was not held.
    pub(super) fn unhold(&self, id: &str) -> bool {
        locked(&self.held).remove(id)
    }

    /// The held ids, sorted.
    pub(super) fn held(&self) -> Vec<String> {
        locked(&self.held).iter().cloned().collect()
    }

    /// Whether an operator holds `id` out.
    pub(super) fn is_held(&self, id: &str) -> bool {
        locked(&self.held).contains(id)
    }

    /// Reserves a place for one more session of `instance`, within the total (`global`),
    /// cluster and instance limits. 410 for a held instance, 503 for a draining one, 429 at
    /// a limit.
    pub(super) fn reserve(
        self: &Arc<Self>,
        instance: &str,
        global: &Arc<Limit>,
    ) -> Result<SessionPermit, Rejection> {
        if locked(&self.held).contains(instance) {
            return Err(Rejection::drained(&self.cluster, instance));
        }
        let mut listed = locked(&self.listed);
        let inst = listed.entry(instance.to_owned()).or_insert_with(|| {
            let id = instance.to_owned();
            Arc::new(Instance::new(id, self.per_instance, Arc::downgrade(self)))
        });
        if inst.is_draining() {
            return Err(Rejection::unavailable("instance is draining"));
        }
        if !global.try_take() {
            return Err(Rejection::limited("sessions in total"));
        }
        if !self.sessions.try_take() {
            global.give();
            return Err(Rejection::limited("sessions of this cluster"));
        }
        if !inst.sessions.try_take() {
            global.give();
            self.sessions.give();
            return Err(Rejection::limited("sessions of this instance"));
        }
        Ok(SessionPermit {
            global: Arc::clone(global),
            instances: Arc::clone(self),
            instance: Arc::clone(inst),
            lent: None,
            slice: None,
            addr: None,
        })
    }

    /// A session of `instance` has closed; an instance without sessions is forgotten, so its
    /// id may register afresh (after a drain, say).
    fn release(&self, instance: &Arc<Instance>) {
        instance.sessions.give();
        self.sessions.give();
        self.forget_if_gone(instance);
    }

    /// Forgets `instance` once it has neither sessions nor upgraded ones open.
    fn forget_if_gone(&self, instance: &Arc<Instance>) {
        {
            let mut listed = locked(&self.listed);
            let gone = instance.sessions() == 0 && instance.upgraded() == 0;
            if gone
                && listed
                    .get(instance.id())
                    .is_some_and(|i| Arc::ptr_eq(i, instance))
            {
                listed.remove(instance.id());
                tracing::info!(cluster = %self.cluster, instance = %instance.id(), "instance has no sessions left");
            }
        }
        self.changed.notify();
    }
}

/// Held by a session's connection task: gives back the session's place in every limit when
/// the connection ends, and forgets an instance whose last session is gone.
#[derive(Debug)]
pub struct SessionPermit {
    global: Arc<Limit>,
    instances: Arc<Instances>,
    pub(super) instance: Arc<Instance>,
    /// A session a standalone acceptor lent this process: its id is reported `GONE` when the
    /// session ends here (not when it is returned).
    pub(super) lent: Option<Lent>,
    /// The count of its slice's live sessions, which it is in until it drops.
    slice: Option<Arc<AtomicUsize>>,
    /// The address the session registered from, which binds its instance while it lives.
    addr: Option<IpAddr>,
}

/// Where to report that a lent session is gone.
#[derive(Debug)]
pub(crate) struct Lent {
    pub(crate) id: u64,
    pub(crate) gone: mpsc::UnboundedSender<u64>,
}

impl SessionPermit {
    /// The session came from `addr` (`None`: unknown, as over a UNIX socket): its instance
    /// answers to that address while the session lives ([`Instance::answers_to`]).
    pub(crate) fn came_from(&mut self, addr: Option<IpAddr>) {
        let Some(ip) = addr.map(|ip| ip.to_canonical()) else {
            return;
        };
        if self.addr.replace(ip).is_none() {
            *locked(&self.instance.addrs).entry(ip).or_default() += 1;
        }
    }

    /// The session's registration declared `capacity` (`Sluice-Capacity`) for its instance.
    pub(crate) fn declares(&self, capacity: Option<u32>) {
        if let Some(n) = capacity.filter(|&n| n > 0) {
            self.instance
                .declared
                .store(u64::from(n), Ordering::Relaxed);
        }
    }

    /// What a lent session owes its lender; it is no longer reported gone when this permit
    /// drops (the session goes back instead).
    pub(crate) fn take_lent(&mut self) -> Option<Lent> {
        self.lent.take()
    }

    /// Puts back what [`take_lent`](Self::take_lent) took, when the session stays after all.
    pub(crate) fn restore_lent(&mut self, lent: Option<Lent>) {
        self.lent = lent;
    }

    /// Counts the session in `alive` (its slice's live sessions) until the permit drops; a
    /// permit already counted (a session that came back to its pool) stays as it is.
    pub(crate) fn count_in(&mut self, alive: &Arc<AtomicUsize>) {
        if self.slice.is_none() {
            alive.fetch_add(1, Ordering::AcqRel);
            self.slice = Some(Arc::clone(alive));
        }
    }
}

impl Drop for SessionPermit {
    fn drop(&mut self) {
        if let Some(lent) = self.lent.take() {
            let _ = lent.gone.send(lent.id);
        }
        if let Some(alive) = self.slice.take() {
            alive.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(ip) = self.addr.take() {
            let mut addrs = locked(&self.instance.addrs);
            if let Some(n) = addrs.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    addrs.remove(&ip);
                }
            }
        }
        self.global.give();
        self.instances.release(&self.instance);
    }
}

/// Keeps a session an upgrade (WebSocket) took over listed as `upgraded` under its instance
/// until the last clone drops: the proxy's bridge holds it while the upgraded connection is
/// open.
#[derive(Debug, Clone)]
pub struct UpgradedSession {
    _held: Arc<Upgraded>,
}

#[derive(Debug)]
struct Upgraded(Arc<Instance>);

impl UpgradedSession {
    /// Counts an upgraded session of `instance`. Its session may already have been released
    /// (hyper lets the connection go at the 101), and the instance forgotten with it: the
    /// instance listed under that id now counts it, re-listed if need be.
    pub fn new(instance: &Arc<Instance>) -> Self {
        let listed = match instance.listed_in.upgrade() {
            Some(instances) => {
                let mut listed = locked(&instances.listed);
                let listed = listed
                    .entry(instance.id().to_owned())
                    .or_insert_with(|| Arc::clone(instance));
                listed.upgraded.fetch_add(1, Ordering::AcqRel);
                Arc::clone(listed)
            }
            None => {
                instance.upgraded.fetch_add(1, Ordering::AcqRel);
                Arc::clone(instance)
            }
        };
        Self {
            _held: Arc::new(Upgraded(listed)),
        }
    }
}

impl Drop for Upgraded {
    fn drop(&mut self) {
        let instance = &self.0;
        instance.upgraded.fetch_sub(1, Ordering::AcqRel);
        if let Some(instances) = instance.listed_in.upgrade() {
            instances.forget_if_gone(instance);
        }
    }
}
