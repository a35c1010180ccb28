//! The bookkeeping shared by the [`Sessions`](crate::Sessions) handle and its slot tasks.
//!
//! A *slot* is a task that keeps one session registered, re-dialing when it ends. The handle
//! sets a target; growing spawns slots, shrinking owes *retirements*: the next slot to reach a
//! decision point (a response to send, a dial to start, a backoff to wait) claims one and ends.
//! An operator's drain (`410`) *holds* the slots: they wait, and one of them probes with a
//! single registration every `drained_probe` until one is answered `101`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::Error;
use crate::report::Report;

/// What an application can observe about its sessions.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Status {
    /// Sessions registered right now (handshake done, connection not yet ended); starts at 0.
    pub registered: usize,
    /// Registrations since start, re-dials included: with `registered` steady, a rising count
    /// means the proxy keeps closing sessions (churn).
    pub registrations: u64,
    /// The most recent dial, handshake or refusal error of any slot; `None` until one happens,
    /// and not cleared by later successes.
    pub last_error: Option<Error>,
    /// Many nodes: every node, in the order the split lists them; empty with one acceptor.
    pub nodes: Vec<NodeStatus>,
}

/// One node of a many-node acceptor, as the instance sees it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node's `ip:port`.
    pub address: std::net::SocketAddr,
    /// Whether the split gives it sessions: its control link is up (or was, within
    /// `node_grace`), it has not said `DRAINING`, it did not refuse the instance as drained,
    /// and it is still in the acceptor's name.
    pub live: bool,
    /// Its smoothed demand (`in_flight + queued + refused`, halved towards each sample).
    pub demand: f64,
    /// Whether it counts on this instance for its floor of one session: its last `FLOOR`
    /// (`true` until its link says `FLOOR 0`, as with a node that never says it).
    pub floor: bool,
    /// Sessions held there: registered or being dialed, retiring ones included.
    pub held: usize,
    /// Of those, registered.
    pub registered: usize,
    /// Of those, asked to retire and not closed yet.
    pub retiring: usize,
    /// What the split gives it.
    pub target: usize,
    /// The control link: `up`, `connecting`, `lost` (within `node_grace`), `down`, `draining`,
    /// `drained` (refused the instance with `410`), `unsupported` (an older acceptor), or
    /// `left` (gone from the name; it closes once it holds no session).
    pub link: &'static str,
}

/// The counters behind resizing. `slots - retire` is the capacity the slots will settle at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// The capacity asked for.
    pub(crate) target: usize,
    /// Live slot tasks that have not claimed a retirement.
    pub(crate) slots: usize,
    /// Retirements owed by surplus slots.
    pub(crate) retire: usize,
    /// Drain, shutdown or drop started: no slot dials again.
    pub(crate) stopping: bool,
    /// The proxy acknowledged the drain: HTTP/2 sessions send `GOAWAY` themselves, so they
    /// close once their streams end even if the proxy is slow to close them.
    pub(crate) drained: bool,
    /// An operator drained the instance (`410`): the slots wait, and the next probe may
    /// dial at this instant.
    pub(crate) hold: Option<Instant>,
}

/// What a slot does while the instance is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Not held: dial as usual.
    Dial,
    /// Held, and this slot dials the probe now.
    Mine,
    /// Held: wait for a change, or until this instant.
    Wait(Instant),
}

impl Counts {
    /// Sets the target; returns how many slots to spawn.
    pub(crate) fn resize(&mut self, target: usize) -> usize {
        self.target = target;
        // "Setting the capacity again dials at once" (protocol/README.md, 410).
        self.hold = None;
        let live = self.slots - self.retire;
        if target <= live {
            self.retire += live - target;
            return 0;
        }
        let cancelled = (target - live).min(self.retire);
        self.retire -= cancelled;
        let spawn = target - live - cancelled;
        self.slots += spawn;
        spawn
    }

    /// Takes one owed retirement for the calling slot, if any.
    pub(crate) fn claim_retirement(&mut self) -> bool {
        if self.retire == 0 {
            return false;
        }
        self.retire -= 1;
        self.slots -= 1;
        true
    }

    /// A slot gave up for good; it settles an owed retirement when there is one.
    pub(crate) fn slot_failed(&mut self) {
        self.retire = self.retire.saturating_sub(1);
        self.slots -= 1;
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    counts: watch::Sender<Counts>,
    status: watch::Sender<Status>,
    /// The log lines about the acceptor (a single one; nodes have their own).
    pub(crate) report: Report,
}

impl Shared {
    pub(crate) fn new(acceptor: String) -> Self {
        Self {
            counts: watch::Sender::default(),
            status: watch::Sender::default(),
            report: Report::new(acceptor),
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        *self.counts.borrow()
    }

    pub(crate) fn subscribe_counts(&self) -> watch::Receiver<Counts> {
        self.counts.subscribe()
    }

    pub(crate) fn subscribe_status(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    pub(crate) fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Sets the target unless stopping; returns the old target and how many slots to spawn.
    pub(crate) fn resize(&self, target: usize) -> (usize, usize) {
        let (mut old, mut spawn) = (target, 0);
        self.counts.send_modify(|c| {
            if !c.stopping {
                old = c.target;
                spawn = c.resize(target);
            }
        });
        self.report.capacity_set();
        (old, spawn)
    }

    /// Holds the slots after a `410`; the first probe dials `probe_every` from now. Silent
    /// while already held (a probe's `410`).
    pub(crate) fn hold(&self, error: Error, probe_every: Duration) {
        self.report.held(&error, probe_every);
        self.counts.send_if_modified(|c| {
            let newly = c.hold.is_none();
            if newly {
                c.hold = Some(Instant::now() + probe_every);
            }
            newly
        });
        self.record(error);
    }

    /// Whether the calling slot dials, probes, or waits; a probe claimed moves the next one
    /// `probe_every` later.
    pub(crate) fn claim_probe(&self, probe_every: Duration) -> Probe {
        let mut probe = Probe::Dial;
        self.counts.send_if_modified(|c| {
            let Some(at) = c.hold else { return false };
            let now = Instant::now();
            if now < at {
                probe = Probe::Wait(at);
                return false;
            }
            c.hold = Some(now + probe_every);
            probe = Probe::Mine;
            false
        });
        probe
    }

    pub(crate) fn stop(&self) {
        self.counts
            .send_if_modified(|c| !std::mem::replace(&mut c.stopping, true));
    }

    /// The proxy acknowledged the instance's drain.
    pub(crate) fn drained(&self) {
        self.counts
            .send_if_modified(|c| !std::mem::replace(&mut c.drained, true));
    }

    /// Whether a slot should end instead of dialing: stopping, or a retirement is owed.
    pub(crate) fn should_end(&self) -> bool {
        self.counts().stopping || self.claim_retirement()
    }

    pub(crate) fn claim_retirement(&self) -> bool {
        self.counts.send_if_modified(Counts::claim_retirement)
    }

    /// Publishes the nodes' state; `true` if it changed.
    pub(crate) fn publish_nodes(&self, nodes: Vec<NodeStatus>) -> bool {
        self.status.send_if_modified(|s| {
            let changed = s.nodes != nodes;
            s.nodes = nodes;
            changed
        })
    }

    pub(crate) fn record(&self, error: Error) {
        self.status.send_modify(|s| s.last_error = Some(error));
    }

    pub(crate) fn slot_failed(&self, error: Error) {
        self.report.refused(&error);
        self.record(error);
        self.counts.send_modify(Counts::slot_failed);
    }

    /// A retryable dial begun at the report's `epoch` failed.
    pub(crate) fn dial_failed(&self, error: Error, epoch: u64) {
        if !self.counts().stopping {
            self.report.dial_failed(&error, epoch);
        }
        self.record(error);
    }

    /// Counts a session as registered until the guard drops. A registration ends a hold: a
    /// probe came through, so every other slot dials at once.
    pub(crate) fn registered(self: &Arc<Self>) -> RegisteredGuard {
        self.report.registered();
        self.counts.send_if_modified(|c| c.hold.take().is_some());
        self.status.send_modify(|s| {
            s.registered += 1;
            s.registrations += 1;
        });
        RegisteredGuard(self.clone())
    }
}

/// Keeps one session counted in [`Status::registered`].
#[derive(Debug)]
pub(crate) struct RegisteredGuard(Arc<Shared>);

impl Drop for RegisteredGuard {
    fn drop(&mut self) {
        self.0.status.send_modify(|s| s.registered -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(target: usize) -> Counts {
        let mut c = Counts::default();
        assert_eq!(c.resize(target), target);
        c
    }

    #[test]
    fn shrinking_owes_retirements_that_growing_cancels_first() {
        let mut c = counts(4);
        assert_eq!(c.resize(2), 0);
        assert_eq!((c.slots, c.retire), (4, 2));
        assert!(c.claim_retirement());
        assert_eq!(c.resize(5), 2);
        assert_eq!((c.slots, c.retire, c.target), (5, 0, 5));
        assert!(!c.claim_retirement());
    }

    #[test]
    fn a_failed_slot_settles_an_owed_retirement() {
        let mut c = counts(3);
        c.resize(2);
        c.slot_failed();
        assert_eq!((c.slots, c.retire), (2, 0));
        c.slot_failed();
        assert_eq!((c.slots, c.retire), (1, 0));
        assert_eq!(c.resize(3), 2);
    }
}
