//! [`Nodes`]: every node of a many-node acceptor and the rules that keep the instance's
//! sessions split among them by demand (`protocol/README.md`, "Many nodes"), without I/O: the
//! fleet task and the slots call it under one lock, so every state it passes through holds at
//! most `capacity` sessions in all.

use std::net::SocketAddr;
use std::time::Duration;

use sluice_session::control::{Demand, ServiceLine};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use super::node::Node;
use super::rebalance::Rebalance;
use crate::options::Backoff;
use crate::state::NodeStatus;
use sluice_session::split::targets;

/// What a slot does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// Dial this node (counted as being dialed there from now); `probe`: a drained node's
    /// one probe.
    Dial { addr: SocketAddr, probe: bool },
    /// No room: wait for a change, or until this instant (a probe falls due).
    Wait(Option<Instant>),
    /// Stopping: the slot ends.
    End,
}

/// How a dial ended, for the books.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialed {
    Registered,
    /// `410`: the instance is drained at this node.
    Drained,
    Failed,
}

/// How long step 5 of the split is held after a plan that moved a session by it: an
/// instance moves sessions for demand at most once a second, however often `DEMAND` comes.
const MOVE_HOLD: Duration = Duration::from_secs(1);

/// The durations the rules wait for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// A drained node's probe interval ([`Options::drained_probe`](crate::Options)).
    pub(crate) probe_every: Duration,
    /// How long a live node may be without a link before it is down
    /// ([`Options::node_grace`](crate::Options)).
    pub(crate) node_grace: Duration,
    /// How long the first resolution's nodes may hold the first dials back
    /// ([`Options::handshake_timeout`](crate::Options): a link dial answers or fails by then).
    pub(crate) first_wait: Duration,
    /// The delays a node backs off by after failed session dials
    /// ([`Options::backoff`](crate::Options)).
    pub(crate) backoff: Backoff,
}

/// Every node, in the order the SDK lists them.
#[derive(Debug)]
pub(crate) struct Nodes {
    nodes: Vec<Node>,
    capacity: usize,
    stopping: bool,
    probe_every: Duration,
    node_grace: Duration,
    first_wait: Duration,
    backoff: Backoff,
    rebalance: Rebalance,
    /// When a plan last moved a session by step 5 (see [`MOVE_HOLD`]).
    moved_at: Option<Instant>,
    /// Nodes joined or removed since the fleet last looked: it starts and stops their links.
    joined: Vec<SocketAddr>,
    removed: Vec<SocketAddr>,
    /// Bumped when liveness changes (join, leave, live, down, hold): slots backing off
    /// look again.
    pub(crate) topology: u64,
    /// A node was lost (its up link ended, or it went down) since the fleet last looked:
    /// the resolver looks at the names again soon.
    pub(crate) suspect: bool,
}

impl Nodes {
    pub(crate) fn new(timing: Timing) -> Self {
        Self {
            nodes: Vec::new(),
            capacity: 0,
            stopping: false,
            probe_every: timing.probe_every,
            node_grace: timing.node_grace,
            first_wait: timing.first_wait,
            backoff: timing.backoff,
            rebalance: Rebalance::default(),
            moved_at: None,
            joined: Vec::new(),
            removed: Vec::new(),
            topology: 0,
            suspect: false,
        }
    }

    pub(crate) fn get(&self, addr: SocketAddr) -> Option<&Node> {
        self.nodes.iter().find(|n| n.addr == addr)
    }

    fn node(&mut self, addr: SocketAddr) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.addr == addr)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sessions held everywhere: registered, being dialed, or asked to retire.
    pub(crate) fn held(&self) -> usize {
        self.nodes.iter().map(Node::held).sum()
    }

    pub(crate) fn status(&self) -> Vec<NodeStatus> {
        self.nodes.iter().map(Node::status).collect()
    }

    /// The nodes joined and removed since the last call.
    pub(crate) fn take_changes(&mut self) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
        (
            std::mem::take(&mut self.joined),
            std::mem::take(&mut self.removed),
        )
    }

    /// A new resolution: nodes not known yet join (at their place in `listed`); known ones
    /// missing from it leave, and go once they hold no session. Until some node has said
    /// `DEMAND`, those that join are the first resolution's: each holds the first dials
    /// back until its link says `DEMAND` or fails, at most `first_wait` — so that the
    /// first split covers every node, not only the first to answer.
    pub(crate) fn update(&mut self, listed: &[SocketAddr], now: Instant) {
        let first = self.nodes.iter().all(|n| n.demand.is_none());
        let mut old = std::mem::take(&mut self.nodes);
        for &addr in listed {
            match old.iter().position(|n| n.addr == addr) {
                Some(i) => {
                    let mut node = old.remove(i);
                    node.listed = true;
                    self.nodes.push(node);
                }
                None => {
                    let mut node = Node::new(addr);
                    if first {
                        node.awaited = Some(now + self.first_wait);
                    }
                    self.nodes.push(node);
                    self.joined.push(addr);
                    self.topology += 1;
                }
            }
        }
        for mut node in old {
            if node.listed {
                node.listed = false;
                self.topology += 1;
                tracing::info!(node = %node.addr, held = node.held(), "node left the acceptor's name");
            }
            self.nodes.push(node);
        }
        self.sweep();
        self.plan(now);
    }

    /// Removes nodes that left and hold no session (closing their links).
    fn sweep(&mut self) {
        let removed = &mut self.removed;
        self.nodes.retain(|n| {
            let gone = !n.listed && n.held() == 0;
            if gone {
                removed.push(n.addr);
            }
            !gone
        });
    }

    /// The capacity changed: every link hears `CAPACITY`, a hold ends (the slots dial at
    /// once), and the split is planned again.
    pub(crate) fn set_capacity(&mut self, capacity: usize, now: Instant) {
        self.capacity = capacity;
        for node in &mut self.nodes {
            node.send(ServiceLine::Capacity(capacity as u64));
            if node.hold.take().is_some() {
                self.topology += 1;
            }
        }
        self.plan(now);
    }

    pub(crate) fn stop(&mut self) {
        self.stopping = true;
    }

    /// A control link came up (`101`): it says the capacity at once.
    pub(crate) fn connected(&mut self, addr: SocketAddr, link: UnboundedSender<ServiceLine>) {
        let capacity = self.capacity as u64;
        if let Some(node) = self.node(addr) {
            let _ = link.send(ServiceLine::Capacity(capacity));
            node.link = Some(link);
            node.fresh_link = true;
            // A new link asks for the floor until it says otherwise.
            node.floor = true;
            // What the last link asked lapsed with it (the node owes it no more): the sessions
            // count as held again, and the next plan asks this link for what is still surplus.
            // SDK-side closes owed at an old acceptor are this side's own, and stay.
            node.retiring = node.evict;
        }
    }

    /// `FLOOR`: whether the node asks this instance for its floor. It plans nothing by
    /// itself; the node's next `DEMAND`, within a second, plans with it.
    pub(crate) fn floor(&mut self, addr: SocketAddr, asks: bool) {
        if let Some(node) = self.node(addr) {
            node.floor = asks;
        }
    }

    pub(crate) fn demand(&mut self, addr: SocketAddr, demand: Demand, now: Instant) {
        let Some(node) = self.node(addr) else { return };
        if node.heard(demand) {
            node.report.registered();
            tracing::info!(node = %addr, "node is live");
            self.topology += 1;
        }
        self.plan(now);
    }

    /// `DRAINING`: not live at once; its share moves as the node closes its sessions (the SDK
    /// closes none there: they answer the requests the node queued).
    pub(crate) fn draining(&mut self, addr: SocketAddr, now: Instant) {
        let Some(node) = self.node(addr) else { return };
        node.draining = true;
        node.live_link = false;
        tracing::info!(node = %addr, held = node.held(), "node is draining; moving its share");
        self.topology += 1;
        self.plan(now);
    }

    /// The link ended, or a dial of it failed without being refused: a live node keeps its
    /// share for `node_grace` (silence, a timeout, a partition or a hot restart may end
    /// within it; [`tick`](Nodes::tick) takes it down after). Returns whether the failure
    /// is an outage to report: a node that said `DRAINING` is expected to go.
    pub(crate) fn link_lost(&mut self, addr: SocketAddr, now: Instant) -> bool {
        let stopping = self.stopping;
        let Some(node) = self.node(addr) else {
            return false;
        };
        let was_up = node.link.take().is_some();
        node.fresh_link = false;
        node.awaited = None;
        // A link this side closed (shutdown) is no loss. A draining node's grace ends with
        // the SDK closing what is left there (a node gone silent before it closed them).
        if (node.live_link || node.stopping()) && node.lost_since.is_none() && !stopping {
            node.lost_since = Some(now);
        }
        let outage = !node.draining;
        // An up link that ended may be a node gone away, or back at another address.
        self.suspect |= was_up && !stopping;
        // A node that left with its link up was asked to retire; now the SDK closes instead.
        self.sweep();
        self.topology += 1;
        outage
    }

    /// A dial of the link failed (it is retried with backoff); `refused`: its connect was
    /// refused (`ECONNREFUSED`). Returns whether that is an outage to report.
    pub(crate) fn link_failed(&mut self, addr: SocketAddr, refused: bool, now: Instant) -> bool {
        let outage = self.link_lost(addr, now);
        if refused {
            self.refused(addr, now);
        }
        outage
    }

    /// A connect to `addr` was refused (`ECONNREFUSED`, a link's or a session's dial):
    /// nothing listens there. A node whose link has ended is gone, so it is down at once —
    /// a hot restart passes the listening socket on, and its connects queue instead.
    pub(crate) fn refused(&mut self, addr: SocketAddr, now: Instant) {
        let stopping = self.stopping;
        let Some(node) = self.node(addr) else { return };
        if node.link.is_some() || node.down || stopping {
            return;
        }
        if node.draining {
            // Expected: no warning (its share moved when it said so); what is left there the
            // SDK closes now.
            node.down = true;
            node.lost_since = None;
            tracing::info!(node = %addr, "the draining node is gone");
            self.topology += 1;
            return;
        }
        if node.live_link {
            self.down(
                addr,
                "its control link ended and it refuses connections",
                now,
            );
        }
    }

    /// Fires what fell due by `now`: a node without a link for the whole grace is down.
    pub(crate) fn tick(&mut self, now: Instant) {
        if self.stopping {
            return;
        }
        let grace = self.node_grace;
        let due: Vec<SocketAddr> = self
            .nodes
            .iter()
            .filter(|n| n.live_link || n.stopping())
            .filter(|n| n.lost_since.is_some_and(|at| at + grace <= now))
            .map(|n| n.addr)
            .collect();
        for addr in due {
            self.down(addr, "no control link within node_grace", now);
        }
    }

    /// When [`tick`](Nodes::tick) has something to do next; `None`: nothing is pending.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        if self.stopping {
            return None;
        }
        self.nodes
            .iter()
            .filter(|n| n.live_link || n.stopping())
            .filter_map(|n| n.lost_since)
            .min()
            .map(|at| at + self.node_grace)
    }

    /// The node is down: not live, its share moves, and the SDK closes its sessions.
    fn down(&mut self, addr: SocketAddr, why: &str, now: Instant) {
        self.suspect = true;
        let Some(node) = self.node(addr) else { return };
        node.live_link = false;
        node.down = true;
        node.lost_since = None;
        if node.draining {
            tracing::info!(node = %addr, held = node.held(), reason = why, "the draining node is gone");
        } else {
            tracing::warn!(node = %addr, held = node.held(), reason = why, "node is down; moving its share");
        }
        self.topology += 1;
        self.plan(now);
    }

    /// `400` to the control request: an acceptor without control links, live with demand 1.
    pub(crate) fn unsupported(&mut self, addr: SocketAddr, now: Instant) {
        let Some(node) = self.node(addr) else { return };
        node.awaited = None;
        node.link = None;
        node.lost_since = None;
        node.demand = Some(1.0);
        node.floor = true;
        if !node.unsupported || !node.live_link {
            node.unsupported = true;
            node.live_link = true;
            node.draining = false;
            node.down = false;
            node.report.registered();
            tracing::info!(node = %addr, "node has no control links (an older acceptor): counting it live with demand 1");
            self.topology += 1;
        }
        self.plan(now);
    }

    /// `410` here: the instance is drained at this node. It is not live, and one probe
    /// dials it every `drained_probe`.
    pub(crate) fn hold(&mut self, addr: SocketAddr, now: Instant) {
        let probe_every = self.probe_every;
        let Some(node) = self.node(addr) else { return };
        node.awaited = None;
        if node.hold.is_none() {
            node.hold = Some(now + probe_every);
            self.topology += 1;
            self.plan(now);
        }
    }

    /// What the calling slot does: dial a drained node's probe when one is due, else the
    /// live node with the largest `target - h` (ties: the first listed) — but only while the
    /// sessions held everywhere number fewer than the capacity.
    pub(crate) fn pick(&mut self, now: Instant) -> Pick {
        if self.stopping {
            return Pick::End;
        }
        if self.held() >= self.capacity {
            return Pick::Wait(None);
        }
        if let Some(until) = self.awaited(now) {
            return Pick::Wait(Some(until));
        }
        let probe_every = self.probe_every;
        let due = self
            .nodes
            .iter_mut()
            .find(|n| n.listed && !n.probing && n.hold.is_some_and(|at| at <= now));
        if let Some(node) = due {
            node.hold = Some(now + probe_every);
            node.probing = true;
            node.dialing += 1;
            return Pick::Dial {
                addr: node.addr,
                probe: true,
            };
        }
        let room = |n: &Node| n.target as i64 - n.h() as i64;
        let wanted = |n: &Node| n.live() && room(n) > 0;
        let mut best: Option<&mut Node> = None;
        for node in self
            .nodes
            .iter_mut()
            .filter(|n| wanted(n) && !n.backing_off(now))
        {
            if best.as_ref().is_none_or(|b| room(node) > room(b)) {
                best = Some(node);
            }
        }
        match best {
            Some(node) => {
                node.dialing += 1;
                Pick::Dial {
                    addr: node.addr,
                    probe: false,
                }
            }
            None => {
                // A node with room backing off wakes the slots when its delay has passed (one
                // whose dial is under way, when that dial ends: a change of its books).
                let retries = self.nodes.iter().filter(|n| wanted(n));
                let retries = retries.filter_map(|n| n.retry_at.filter(|&at| at > now));
                let holds = self.nodes.iter().filter_map(|n| n.hold);
                Pick::Wait(holds.chain(retries).min())
            }
        }
    }

    /// A session dial at `addr` failed (it is retried), or its session ended before serving
    /// anything, unasked: the node backs off for the next delay, unless it is backing off
    /// already (the other failures of one burst extend nothing); the slots dial other nodes
    /// meanwhile, and then this one a dial at a time until a session registers there
    /// (protocol/README.md, "Back-off").
    pub(crate) fn back_off(&mut self, addr: SocketAddr, now: Instant) {
        let backoff = self.backoff;
        let Some(node) = self.node(addr) else { return };
        if node.failures > 0 && node.retry_at.is_some_and(|at| at > now) {
            return;
        }
        node.retry_at = Some(now + backoff.delay(node.failures));
        node.failures = node.failures.saturating_add(1);
    }

    /// Until when a node of the first resolution holds the first dials back, if one does.
    fn awaited(&self, now: Instant) -> Option<Instant> {
        self.nodes
            .iter()
            .filter(|n| n.listed)
            .filter_map(|n| n.awaited)
            .filter(|&until| until > now)
            .max()
    }

    /// A dial picked at `addr` ended.
    pub(crate) fn dialed(&mut self, addr: SocketAddr, probe: bool, how: Dialed, now: Instant) {
        let probe_every = self.probe_every;
        let Some(node) = self.node(addr) else { return };
        node.dialing -= 1;
        if probe {
            node.probing = false;
        }
        match how {
            Dialed::Registered => {
                node.registered += 1;
                node.failures = 0;
                node.retry_at = None;
                node.report.registered();
                if node.hold.take().is_some() {
                    self.topology += 1;
                    self.plan(now);
                    return;
                }
                self.apply();
            }
            Dialed::Drained => {
                if node.hold.is_none() {
                    node.hold = Some(now + probe_every);
                    self.topology += 1;
                    self.plan(now);
                }
            }
            Dialed::Failed => {}
        }
        self.sweep();
    }

    /// A registered session at `addr` ended. Returns whether it was moved (retired or closed
    /// by the SDK for a node that is not live): its slot dials elsewhere at once.
    pub(crate) fn ended(&mut self, addr: SocketAddr) -> bool {
        let Some(node) = self.node(addr) else {
            return false;
        };
        node.registered -= 1;
        let moved = if node.retiring > 0 {
            node.retiring -= 1;
            node.evict = node.evict.min(node.retiring);
            true
        } else {
            // One the SDK closed, or one a draining node closed: it moves.
            node.sdk_closes() || node.draining
        };
        self.sweep();
        moved
    }

    /// Whether a session at `addr` closes now (idle) or after its response (busy): the SDK
    /// closes every session at a node that is not live, and owed ones at an old acceptor.
    pub(crate) fn claim_close(&mut self, addr: SocketAddr) -> bool {
        let Some(node) = self.node(addr) else {
            return false;
        };
        if node.sdk_closes() {
            return true;
        }
        if node.evict > 0 {
            node.evict -= 1;
            return true;
        }
        false
    }

    /// Shutdown: the drain request failed at `addr`, so its sessions close from this side.
    pub(crate) fn close_all(&mut self, addr: SocketAddr) {
        if let Some(node) = self.node(addr) {
            node.closing = true;
        }
    }

    /// Plans the split again (`protocol/README.md`, "The split") and asks for what it moves.
    pub(crate) fn plan(&mut self, now: Instant) {
        if self.stopping {
            return;
        }
        let views: Vec<_> = self.nodes.iter().map(Node::view).collect();
        let held = self.moved_at.is_some_and(|at| now < at + MOVE_HOLD);
        let quiet = !self.nodes.iter().any(|n| n.asking && n.live());
        let (targets, moved) = targets(self.capacity, &views, !held, quiet);
        if moved {
            self.moved_at = Some(now);
        }
        for (node, target) in self.nodes.iter_mut().zip(targets) {
            node.target = target;
        }
        self.apply();
        self.rebalance.note(now, self.capacity, &self.nodes);
    }

    /// Asks each node holding more than its target to retire the surplus: `RETIRE` over a
    /// live link (sessions being dialed are asked for once registered); SDK-side closes at an
    /// old acceptor; everything at a node that left with its link up. The SDK closes the
    /// sessions of nodes that are not live by itself ([`Node::sdk_closes`]).
    fn apply(&mut self) {
        if self.stopping {
            return;
        }
        for node in &mut self.nodes {
            let left_with_link = !node.listed && node.link.is_some();
            if !node.live() && !left_with_link {
                continue;
            }
            let surplus = node.h().saturating_sub(node.target);
            let ask = surplus.min(node.registered - node.retiring);
            if ask == 0 {
                continue;
            }
            if node.unsupported {
                node.evict += ask;
                node.retiring += ask;
            } else if node.send(ServiceLine::Retire(ask as u64)) {
                node.retiring += ask;
                tracing::debug!(node = %node.addr, n = ask, "asked the node to retire sessions");
            }
        }
    }
}

#[cfg(test)]
mod replay;
#[cfg(test)]
mod tests;
