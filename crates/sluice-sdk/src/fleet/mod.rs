//! Many nodes (`protocol/README.md`, "Many nodes: one capacity, split by demand"): the
//! [`Fleet`] resolves the acceptor's names into nodes, keeps a control link to each
//! ([`link`]), and lends the slots a node to dial ([`Lease`]) so that the sessions follow the
//! demand and never number more than the capacity in all.
//!
//! * [`nodes`]: the bookkeeping and the rules, without I/O (unit-tested on its own).
//! * [`node`]: one node's state.
//! * [`link`]: one node's control link task.
//! * [`rebalance`]: the rate-limited rebalance log line.
//!
//! The targets a plan gives each node are `sluice_session::split`'s, the one split of the
//! Rust side.

mod link;
mod node;
mod nodes;
mod rebalance;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::Error;
use crate::options::Options;
use crate::report::Report;
use crate::state::Shared;
use crate::{dial, resolve};
pub(crate) use nodes::{Dialed, Nodes, Pick, Timing};

/// The nodes of one instance and the tasks that watch them.
#[derive(Debug)]
pub(crate) struct Fleet {
    nodes: Mutex<Nodes>,
    /// Bumped on every change: sessions look whether they should close.
    changed: watch::Sender<u64>,
    /// Mirrors [`Nodes::topology`]: slots backing off look again when liveness changes.
    topology: watch::Sender<u64>,
    /// Mirrors [`Nodes::next_timer`]: when the timer task ticks the rules next.
    timer: watch::Sender<Option<Instant>>,
    /// Mirrors [`Nodes::suspect`]: a node was lost, so the resolver looks again soon.
    resolve_soon: Notify,
    options: Arc<Options>,
    shared: Arc<Shared>,
    runtime: Handle,
    /// The link task of each node.
    links: Mutex<HashMap<SocketAddr, AbortHandle>>,
    /// The resolver and the timer.
    background: Mutex<Vec<AbortHandle>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Fleet {
    /// Starts resolving the acceptor's names; nodes join as they resolve.
    pub(crate) fn start(options: Arc<Options>, shared: Arc<Shared>, runtime: Handle) -> Arc<Self> {
        let timing = Timing {
            probe_every: options.drained_probe,
            node_grace: options.node_grace,
            first_wait: options.handshake_timeout,
            backoff: options.backoff,
        };
        let fleet = Arc::new(Self {
            nodes: Mutex::new(Nodes::new(timing)),
            changed: watch::Sender::new(0),
            topology: watch::Sender::new(0),
            timer: watch::Sender::new(None),
            resolve_soon: Notify::new(),
            options,
            shared,
            runtime,
            links: Mutex::default(),
            background: Mutex::default(),
        });
        let resolver = fleet.runtime.spawn(resolve_loop(fleet.clone()));
        let timer = fleet.runtime.spawn(timer_loop(fleet.clone()));
        *lock(&fleet.background) = vec![resolver.abort_handle(), timer.abort_handle()];
        fleet
    }

    /// Runs `f` on the nodes under the lock, then publishes what changed: the status (still
    /// under the lock, so every published state is one the rules passed through), the
    /// change signals, and links to start or stop.
    pub(crate) fn with<R>(self: &Arc<Self>, f: impl FnOnce(&mut Nodes, Instant) -> R) -> R {
        let mut nodes = lock(&self.nodes);
        let out = f(&mut nodes, Instant::now());
        let changed = self.shared.publish_nodes(nodes.status());
        let (joined, removed) = nodes.take_changes();
        let topology = nodes.topology;
        let timer = nodes.next_timer();
        let suspect = std::mem::take(&mut nodes.suspect);
        drop(nodes);
        if suspect {
            self.resolve_soon.notify_one();
        }
        self.topology
            .send_if_modified(|t| std::mem::replace(t, topology) != topology);
        self.timer
            .send_if_modified(|t| std::mem::replace(t, timer) != timer);
        if changed {
            self.changed.send_modify(|g| *g += 1);
        }
        let mut links = lock(&self.links);
        for addr in removed {
            if let Some(task) = links.remove(&addr) {
                task.abort();
            }
        }
        for addr in joined {
            let task = self.runtime.spawn(link::run(self.clone(), addr));
            links.insert(addr, task.abort_handle());
        }
        out
    }

    pub(crate) fn options(&self) -> &Options {
        &self.options
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The report of the node at `addr` (a fresh one for a node already gone).
    pub(crate) fn report(&self, addr: SocketAddr) -> Arc<Report> {
        let nodes = lock(&self.nodes);
        nodes.get(addr).map_or_else(
            || Arc::new(Report::new(addr.to_string())),
            |n| n.report.clone(),
        )
    }

    pub(crate) fn set_capacity(self: &Arc<Self>, capacity: usize) {
        self.with(|n, now| n.set_capacity(capacity, now));
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(crate) fn subscribe_topology(&self) -> watch::Receiver<u64> {
        self.topology.subscribe()
    }

    /// Waits until the calling slot may dial a node; `None` when it should end instead
    /// (stopping, or a shrink's retirement claimed).
    pub(crate) async fn pick(self: &Arc<Self>) -> Option<Lease> {
        let mut changed = self.subscribe();
        // A first-resolution node whose link fails changes no status, only the topology.
        let mut topology = self.subscribe_topology();
        let mut counts = self.shared.subscribe_counts();
        loop {
            if self.shared.should_end() {
                return None;
            }
            changed.mark_unchanged();
            topology.mark_unchanged();
            let until = match self.with(|n, now| n.pick(now)) {
                Pick::End => return None,
                Pick::Dial { addr, probe } => return Some(self.lease(addr, probe)),
                Pick::Wait(until) => until,
            };
            let probe_due = async {
                match until {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = probe_due => {}
                r = changed.changed() => if r.is_err() { return None },
                r = topology.changed() => if r.is_err() { return None },
                r = counts.changed() => if r.is_err() { return None },
            }
        }
    }

    fn lease(self: &Arc<Self>, addr: SocketAddr, probe: bool) -> Lease {
        Lease {
            fleet: self.clone(),
            addr,
            probe,
            report: self.report(addr),
            state: Mutex::new(LeaseState::Dialing),
        }
    }

    /// Shutdown: no more dials or plans; every node holding sessions (or with a link) gets
    /// the drain request, and the sessions of a node whose drain fails close from this side.
    /// Returns the first failure once every drain has been answered.
    pub(crate) async fn drain(self: &Arc<Self>) -> Result<(), Error> {
        let addrs: Vec<SocketAddr> = self.with(|n, _| {
            n.stop();
            n.status()
                .iter()
                .filter(|s| s.held > 0 || s.link == "up")
                .map(|s| s.address)
                .collect()
        });
        let mut drains = tokio::task::JoinSet::new();
        for addr in addrs {
            let options = self.options.clone();
            drains.spawn(async move {
                (
                    addr,
                    dial::drain(&options, dial::Endpoint::Node(addr)).await,
                )
            });
        }
        let mut first = None;
        while let Some(Ok((addr, result))) = drains.join_next().await {
            if let Err(e) = result {
                tracing::warn!(node = %addr, error = %e, "drain request failed; closing the sessions there from this side");
                self.with(|n, _| n.close_all(addr));
                first.get_or_insert(e);
            }
        }
        self.stop();
        first.map_or(Ok(()), Err)
    }

    /// Stops resolving and timing, and closes every control link.
    pub(crate) fn stop(&self) {
        lock(&self.nodes).stop();
        let background = std::mem::take(&mut *lock(&self.background));
        let links = std::mem::take(&mut *lock(&self.links));
        for task in background.into_iter().chain(links.into_values()) {
            task.abort();
        }
    }
}

/// Ticks the rules when a timer of theirs falls due ([`Nodes::next_timer`]).
async fn timer_loop(fleet: Arc<Fleet>) {
    let mut next = fleet.timer.subscribe();
    loop {
        let at = *next.borrow_and_update();
        let due = async {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = due => fleet.with(|n, now| n.tick(now)),
            changed = next.changed() => if changed.is_err() { return },
        }
    }
}

/// How long after a node is lost the names are resolved again: the first of the follow-ups
/// that double up to `resolve_interval` (`protocol/README.md`, "The acceptor address").
const RESOLVE_SOON: Duration = Duration::from_secs(1);

/// The many-node resolver: the acceptor's names every `resolve_interval`. A name that fails
/// to resolve keeps the nodes it had (one warning per failing streak). A node lost makes it
/// resolve again [`RESOLVE_SOON`] later, then after twice as long each time until the pause
/// reaches `resolve_interval`, so that a node back under a new address (a restarted pod) is
/// found within seconds.
async fn resolve_loop(fleet: Arc<Fleet>) {
    let options = fleet.options.clone();
    let Some(names) = options.acceptor.names() else {
        return;
    };
    let mut last: Vec<Vec<SocketAddr>> = vec![Vec::new(); names.len()];
    let mut failing = vec![false; names.len()];
    let interval = options.resolve_interval;
    let mut follow = Duration::ZERO;
    loop {
        for (i, (host, port)) in names.iter().enumerate() {
            let lookup = options.resolver.resolve(host, *port);
            match tokio::time::timeout(options.handshake_timeout, lookup).await {
                Ok(Ok(addrs)) => {
                    last[i] = addrs;
                    failing[i] = false;
                }
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => e,
                        _ => std::io::ErrorKind::TimedOut.into(),
                    };
                    if !std::mem::replace(&mut failing[i], true) {
                        tracing::warn!(name = %host, port, error = %error, "cannot resolve the acceptor's name; keeping its nodes");
                    }
                    fleet.shared.record(Error::Resolve {
                        name: host.clone(),
                        source: Arc::new(error),
                    });
                }
            }
        }
        let listed = resolve::listed(&last);
        fleet.with(|n, now| n.update(&listed, now));
        let mut pause = interval;
        if !follow.is_zero() {
            pause = pause.min(follow);
            follow = Some(follow * 2)
                .filter(|&next| next < interval)
                .unwrap_or_default();
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = fleet.resolve_soon.notified() => {
                follow = RESOLVE_SOON * 2;
                tokio::time::sleep(RESOLVE_SOON.min(interval)).await;
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseState {
    Dialing,
    Registered,
    Done,
}

/// One slot's claim on a node: counted as being dialed there, then as registered, until it
/// is settled (or dropped).
#[derive(Debug)]
pub(crate) struct Lease {
    fleet: Arc<Fleet>,
    addr: SocketAddr,
    probe: bool,
    report: Arc<Report>,
    state: Mutex<LeaseState>,
}

impl Lease {
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// The node's report: dial failures count there.
    pub(crate) fn report(&self) -> &Report {
        &self.report
    }

    /// Whether this lease is a drained node's probe.
    pub(crate) fn is_probe(&self) -> bool {
        self.probe
    }

    fn settle(&self, to: LeaseState) -> LeaseState {
        std::mem::replace(&mut *lock(&self.state), to)
    }

    /// The dial registered a session.
    pub(crate) fn registered(&self) {
        self.dialed(Dialed::Registered, LeaseState::Registered);
    }

    /// The dial failed (and will be retried): the node's outage report counts it, and a
    /// refused connect may show that the node is gone ([`Nodes::refused`]).
    pub(crate) fn failed(&self, error: &Error, epoch: u64) {
        self.report.dial_failed(error, epoch);
        // The node backs off, not the slot (protocol/README.md, "Back-off").
        let addr = self.addr;
        self.fleet.with(|n, now| n.back_off(addr, now));
        self.dialed(Dialed::Failed, LeaseState::Done);
        if error.is_connection_refused() {
            let addr = self.addr;
            self.fleet.with(|n, now| n.refused(addr, now));
        }
    }

    /// The dial was refused for good (400, 401, 404): the slot ends.
    pub(crate) fn gave_up(&self) {
        self.dialed(Dialed::Failed, LeaseState::Done);
    }

    /// `410`: the instance is drained at this node; its share moves, and one registration
    /// probes it every `drained_probe` (one warning, then silent).
    pub(crate) fn drained(&self, error: &Error) {
        self.report.held(error, self.fleet.options.drained_probe);
        self.dialed(Dialed::Drained, LeaseState::Done);
    }

    fn dialed(&self, how: Dialed, next: LeaseState) {
        if self.settle(next) == LeaseState::Dialing {
            let (addr, probe) = (self.addr, self.probe);
            self.fleet.with(|n, now| n.dialed(addr, probe, how, now));
        }
    }

    /// The session ended before serving anything, unasked: its node backs off (a proxy that
    /// accepts and drops sessions is not re-dialed in a tight loop).
    pub(crate) fn unused(&self) {
        let addr = self.addr;
        self.fleet.with(|n, now| n.back_off(addr, now));
    }

    /// The session ended; whether it was moved (its slot dials elsewhere at once).
    pub(crate) fn ended(&self) -> bool {
        let mut state = lock(&self.state);
        if *state != LeaseState::Registered {
            return false;
        }
        *state = LeaseState::Done;
        drop(state);
        self.fleet.with(|n, _| n.ended(self.addr))
    }

    /// Whether this session closes now (or after its response) because its node is not live.
    pub(crate) fn claim_close(&self) -> bool {
        self.fleet.with(|n, _| n.claim_close(self.addr))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        match self.settle(LeaseState::Done) {
            LeaseState::Dialing => {
                let (addr, probe) = (self.addr, self.probe);
                self.fleet
                    .with(|n, now| n.dialed(addr, probe, Dialed::Failed, now));
            }
            LeaseState::Registered => {
                let addr = self.addr;
                self.fleet.with(|n, _| n.ended(addr));
            }
            LeaseState::Done => {}
        }
    }
}
