//! One node as the instance knows it: its control link's state, its smoothed demand, and the
//! sessions held there (registered, being dialed, asked to retire).

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_session::control::{Demand, ServiceLine};
use sluice_session::split::{smooth, NodeView};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use crate::report::Report;
use crate::state::NodeStatus;

/// A node: one `ip:port`.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) addr: SocketAddr,
    /// In the latest resolution; a node that left stays until it holds no session.
    pub(crate) listed: bool,
    /// The control link's writer while the link is up.
    pub(crate) link: Option<UnboundedSender<ServiceLine>>,
    /// The link has not yet said `DEMAND` since it came up.
    pub(crate) fresh_link: bool,
    /// A node of the first resolution whose link has neither said `DEMAND` nor failed: no
    /// slot dials until then, or until this instant ([`Nodes::update`](super::Nodes)).
    pub(crate) awaited: Option<Instant>,
    /// The acceptor answered the control request `400`: an old acceptor, live with demand 1.
    pub(crate) unsupported: bool,
    /// What the links made of the node: live from a link's first `DEMAND` (or a `400`) until
    /// `DRAINING`, [`node_grace`](crate::Options::node_grace) without a link, or a refused
    /// connect after its link ended.
    pub(crate) live_link: bool,
    pub(crate) draining: bool,
    pub(crate) down: bool,
    /// When the link was lost while the node was live (the grace runs from here; see
    /// [`Nodes::tick`](super::Nodes::tick)).
    pub(crate) lost_since: Option<Instant>,
    /// An operator drained the instance here (`410`): the next probe may dial at this instant.
    pub(crate) hold: Option<Instant>,
    pub(crate) probing: bool,
    /// Shutdown: the drain request failed here, so the SDK closes the sessions itself.
    pub(crate) closing: bool,
    pub(crate) demand: Option<f64>,
    /// The last `DEMAND`'s sample was above 0. While no live node's is, the instance is quiet:
    /// step 5 of the split moves sessions only to a node owed its floor that holds none.
    pub(crate) asking: bool,
    /// The node asks this instance for its floor of one session: its link's last `FLOOR`,
    /// `true` until the link says `FLOOR 0` (as an older node, which never says it).
    pub(crate) floor: bool,
    pub(crate) registered: usize,
    pub(crate) dialing: usize,
    /// Session dials here that failed (or sessions that ended unused, unasked) since one last
    /// registered: the node backs off, not the slot ([`Nodes::back_off`](super::Nodes)).
    pub(crate) failures: u32,
    /// No slot dials here before this instant, while `failures`.
    pub(crate) retry_at: Option<Instant>,
    /// Sessions asked to retire (by `RETIRE`, or owed SDK-side closes at an old acceptor)
    /// that have not closed yet.
    pub(crate) retiring: usize,
    /// SDK-side closes owed at an old acceptor (which cannot take `RETIRE`).
    pub(crate) evict: usize,
    pub(crate) target: usize,
    /// Its own outage lines.
    pub(crate) report: Arc<Report>,
}

impl Node {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            listed: true,
            link: None,
            fresh_link: false,
            awaited: None,
            unsupported: false,
            live_link: false,
            draining: false,
            down: false,
            lost_since: None,
            hold: None,
            probing: false,
            closing: false,
            demand: None,
            asking: false,
            floor: true,
            registered: 0,
            dialing: 0,
            failures: 0,
            retry_at: None,
            retiring: 0,
            evict: 0,
            target: 0,
            report: Arc::new(Report::new(addr.to_string())),
        }
    }

    /// Sessions here: registered or being dialed, retiring ones included.
    pub(crate) fn held(&self) -> usize {
        self.registered + self.dialing
    }

    /// The split's `h`: held, less those asked to retire.
    pub(crate) fn h(&self) -> usize {
        self.held() - self.retiring
    }

    /// The split's `live`.
    pub(crate) fn live(&self) -> bool {
        self.listed && self.live_link && self.hold.is_none() && !self.closing
    }

    pub(crate) fn view(&self) -> NodeView {
        NodeView {
            live: self.live(),
            demand: self.demand.unwrap_or(0.0),
            held: self.h(),
            floor: self.floor,
        }
    }

    /// Whether the SDK closes the sessions here itself (idle ones at once, busy ones after
    /// their response): the node is down, drained us, or left with its link down. A node
    /// that left with its link up is asked to `RETIRE` them instead, and one that said
    /// `DRAINING` closes them itself once the requests it queued are answered, until it is
    /// down.
    pub(crate) fn sdk_closes(&self) -> bool {
        self.closing
            || self.hold.is_some()
            || (!self.live_link && !self.stopping())
            || (!self.listed && self.link.is_none())
    }

    /// It said `DRAINING` and is not down yet: its sessions are its own to close.
    pub(crate) fn stopping(&self) -> bool {
        self.draining && !self.down
    }

    /// No slot dials here now: a dial failed less than its delay ago, or one has failed and
    /// a dial is under way (one at a time until a session registers).
    pub(crate) fn backing_off(&self, now: Instant) -> bool {
        self.failures > 0 && (self.retry_at.is_some_and(|at| at > now) || self.dialing > 0)
    }

    /// Reads a `DEMAND`; `true` if it made the node live (a link's first).
    pub(crate) fn heard(&mut self, demand: Demand) -> bool {
        self.demand = Some(smooth(self.demand, demand.sample()));
        self.asking = demand.sample() > 0.0;
        self.awaited = None;
        if !std::mem::take(&mut self.fresh_link) {
            return false;
        }
        self.lost_since = None;
        self.unsupported = false;
        // A new link is checked as a registration is: answered, so no longer drained here.
        let newly = !self.live_link || self.hold.take().is_some();
        self.live_link = true;
        self.draining = false;
        self.down = false;
        newly
    }

    /// Writes a line on the link; `false` if there is none.
    pub(crate) fn send(&self, line: ServiceLine) -> bool {
        self.link.as_ref().is_some_and(|l| l.send(line).is_ok())
    }

    pub(crate) fn status(&self) -> NodeStatus {
        NodeStatus {
            address: self.addr,
            live: self.live(),
            demand: self.demand.unwrap_or(0.0),
            floor: self.floor,
            held: self.held(),
            registered: self.registered,
            retiring: self.retiring,
            target: self.target,
            link: self.link_state(),
        }
    }

    fn link_state(&self) -> &'static str {
        match () {
            () if !self.listed => "left",
            () if self.hold.is_some() => "drained",
            () if self.draining => "draining",
            () if self.down => "down",
            () if self.unsupported => "unsupported",
            () if self.link.is_some() && !self.fresh_link => "up",
            () if self.lost_since.is_some() => "lost",
            () => "connecting",
        }
    }
}
