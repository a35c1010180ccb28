//! A service's control link (many nodes, `protocol/README.md`): this node reports its demand
//! for the service's slice (`DEMAND`, every 100 ms while it changes and every second anyway,
//! `DRAINING` once the node drains) and retires the instance's sessions when asked (`RETIRE`).

use sluice_net::NodeState;
use sluice_session::control::{
    Demand, LineReader, NodeLine, ReadLineError, ServiceLine, HEARTBEAT, REPORT_INTERVAL,
};
use sluice_session::{Registration, SplitBy};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::cluster::{ReverseCluster, ReverseSlice};
use crate::protocol::Protocol;
use crate::stream::SessionStream;

/// Why a link ended.
#[derive(Debug, thiserror::Error)]
enum LinkEnd {
    #[error("{0}")]
    Read(#[from] ReadLineError),
    #[error("link I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(#[from] sluice_session::control::InvalidLine),
}

/// Serves one link (already answered `101`) until either side ends it.
pub(super) async fn serve<P: Protocol, T: SessionStream>(
    io: T,
    slice: ReverseSlice<P>,
    (reg, split): (Registration, SplitBy),
    (instance, from): (String, Option<std::net::IpAddr>),
    node: Option<watch::Receiver<NodeState>>,
) {
    let cluster = slice.cluster();
    let capacity = u64::from(reg.capacity.unwrap_or(0));
    let per_service = split == SplitBy::Service;
    let entry = cluster
        .links()
        .open(&instance, slice.slice(), capacity, per_service);
    info!(cluster = %cluster.name(), slice = %slice.slice(), %instance, capacity, "control link open");
    let link = Link {
        cluster,
        slice: &slice,
        instance: &instance,
        from,
        entry: &entry,
    };
    let ended = link.run(io, node).await;
    // What the link asked lapses with it: its SDK asks again on the next link.
    let lapsed = cluster.lapse(&instance, entry.id());
    info!(cluster = %cluster.name(), slice = %slice.slice(), %instance, reason = %ended, lapsed, "control link closed");
}

struct Link<'a, P: Protocol> {
    cluster: &'a ReverseCluster<P>,
    /// Held for the link's life, so the slice it reports on stays.
    slice: &'a ReverseSlice<P>,
    instance: &'a str,
    /// The link's source address; it speaks for the instance only where its sessions are.
    from: Option<std::net::IpAddr>,
    entry: &'a crate::links::LinkEntry,
}

impl<P: Protocol> Link<'_, P> {
    async fn run<T: SessionStream>(
        &self,
        io: T,
        mut node: Option<watch::Receiver<NodeState>>,
    ) -> LinkEnd {
        let (read, mut write) = tokio::io::split(io);
        let mut lines = LineReader::new(read, b"");
        let mut reporter = Reporter::new(self.slice.pool().load().refused);
        let mut tick = tokio::time::interval(REPORT_INTERVAL);
        let mut stopping = node
            .as_ref()
            .is_some_and(|n| *n.borrow() == NodeState::Stopping);
        let mut said_draining = false;
        // The floor last told (`FLOOR`), to links that keep it per service.
        let mut floor_told: Option<bool> = None;
        loop {
            tokio::select! {
                read = lines.next_line() => {
                    let heard = read.map_err(LinkEnd::from).and_then(|line| self.heard(&line));
                    if let Err(end) = heard {
                        return end;
                    }
                }
                _ = tick.tick() => {
                    if let Some(line) = self.floor_change(&mut floor_told).filter(|_| !stopping) {
                        if let Err(e) = write.write_all(&line.encode()).await {
                            return e.into();
                        }
                    }
                    let out = match (stopping, said_draining) {
                        (true, false) => Some(NodeLine::Draining),
                        (true, true) => None,
                        (false, _) => reporter.next(self.slice.pool().load()),
                    };
                    if let Some(out) = out {
                        if let Err(e) = write.write_all(&out.encode()).await {
                            return e.into();
                        }
                    }
                    if stopping && !said_draining {
                        said_draining = true;
                        self.entry.said_draining();
                    }
                }
                state = next_state(&mut node), if !stopping => {
                    stopping = state == NodeState::Stopping;
                    tick.reset_immediately();
                }
            }
        }
    }

    /// `FLOOR` when whether this node counts on the instance for its floor has changed since
    /// `told` (or was never told); only to links that keep the floor per service.
    fn floor_change(&self, told: &mut Option<bool>) -> Option<NodeLine> {
        if !self.entry.info.per_service {
            return None;
        }
        let holder = self.cluster.links().floor_holder(self.slice.slice());
        let floor = holder.as_deref() == Some(self.instance);
        if *told == Some(floor) {
            return None;
        }
        *told = Some(floor);
        Some(NodeLine::Floor(floor))
    }

    /// Acts on one line from the service.
    fn heard(&self, line: &str) -> Result<(), LinkEnd> {
        match ServiceLine::parse(line)? {
            ServiceLine::Retire(_) if !self.cluster.answers_to(self.instance, self.from) => {
                warn!(instance = %self.instance, from = ?self.from, "RETIRE ignored: the instance's sessions registered from another address");
            }
            ServiceLine::Retire(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                self.entry.info.count_retired(n as u64);
                self.cluster
                    .retire_on(self.slice.slice(), self.instance, n, self.entry.id());
            }
            ServiceLine::Capacity(n) => {
                debug!(instance = %self.instance, capacity = n, "declared capacity");
                self.entry.declared(n);
            }
        }
        Ok(())
    }
}

/// The node's next state. A node whose state has gone (its process is ending) is stopping.
async fn next_state(node: &mut Option<watch::Receiver<NodeState>>) -> NodeState {
    let Some(rx) = node else {
        return std::future::pending().await;
    };
    match rx.changed().await {
        Ok(()) => *rx.borrow_and_update(),
        Err(_) => {
            *node = None;
            NodeState::Stopping
        }
    }
}

/// Decides when a `DEMAND` goes out: when what it says changed (at most every tick), and at
/// least every [`HEARTBEAT`].
struct Reporter {
    last: Option<Demand>,
    sent_at: Instant,
    /// The pool's running count of refusals at the last report.
    refused_at: u64,
}

impl Reporter {
    fn new(refused: u64) -> Self {
        Self {
            last: None,
            sent_at: Instant::now(),
            refused_at: refused,
        }
    }

    fn next(&mut self, load: crate::pool::Load) -> Option<NodeLine> {
        let demand = Demand {
            in_flight: load.in_flight as u64,
            queued: load.queued as u64,
            refused: load.refused.saturating_sub(self.refused_at),
            sessions: load.sessions as u64,
        };
        let due = self.last != Some(demand) || self.sent_at.elapsed() >= HEARTBEAT;
        if !due {
            return None;
        }
        self.refused_at = load.refused;
        self.last = Some(demand);
        self.sent_at = Instant::now();
        Some(NodeLine::Demand(demand))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(in_flight: usize, refused: u64) -> crate::pool::Load {
        crate::pool::Load {
            in_flight,
            queued: 0,
            refused,
            sessions: 4,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reports_changes_at_once_and_the_same_only_as_a_heartbeat() {
        let mut r = Reporter::new(0);
        assert!(r.next(load(1, 0)).is_some(), "the first report");
        assert!(r.next(load(1, 0)).is_none(), "nothing changed");
        let Some(NodeLine::Demand(d)) = r.next(load(1, 5)) else {
            panic!("refusals are a change");
        };
        assert_eq!(d.refused, 5);
        let Some(NodeLine::Demand(d)) = r.next(load(1, 5)) else {
            panic!("the refusal count went back to 0: a change");
        };
        assert_eq!(d.refused, 0);
        assert!(r.next(load(1, 5)).is_none());
        tokio::time::advance(HEARTBEAT).await;
        assert!(r.next(load(1, 5)).is_some(), "the heartbeat");
    }
}
