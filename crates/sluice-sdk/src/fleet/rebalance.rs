//! [`Rebalance`]: one info line per rebalance — what moved where, with the demands — at most
//! one a second; changes within the second are folded into the next line.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::node::Node;

/// The least time between two rebalance lines.
const EVERY: Duration = Duration::from_secs(1);

/// The targets as last logged.
#[derive(Debug, Default)]
pub(crate) struct Rebalance {
    logged: Vec<(SocketAddr, usize)>,
    at: Option<Instant>,
}

impl Rebalance {
    /// Logs the targets if they changed since the last line and that line is a second old.
    pub(crate) fn note(&mut self, now: Instant, capacity: usize, nodes: &[Node]) {
        if let Some(moves) = self.moves(now, nodes) {
            tracing::info!(capacity, targets = %moves, "sessions rebalanced across nodes");
        }
    }

    /// The moves a line shows now (`None`: no line), remembered as logged.
    fn moves(&mut self, now: Instant, nodes: &[Node]) -> Option<String> {
        let current: Vec<(SocketAddr, usize)> = nodes.iter().map(|n| (n.addr, n.target)).collect();
        let moved = current.iter().any(|&(a, t)| self.was(a) != t)
            || self
                .logged
                .iter()
                .any(|&(a, t)| t > 0 && !current.iter().any(|c| c.0 == a));
        if !moved {
            // Nodes that came or went holding nothing: no line, but remember them.
            self.logged = current;
            return None;
        }
        if self.at.is_some_and(|at| now < at + EVERY) {
            return None;
        }
        let mut moves = String::new();
        for node in nodes
            .iter()
            .filter(|n| n.target > 0 || self.was(n.addr) > 0)
        {
            let was = self.was(node.addr);
            let _ = write!(
                moves,
                "{}{}: {was}->{} (demand {:.1}{}), ",
                node.addr,
                if node.live() { "" } else { " not live" },
                node.target,
                node.demand.unwrap_or(0.0),
                if node.listed { "" } else { ", left" },
            );
        }
        for (addr, was) in &self.logged {
            if *was > 0 && !current.iter().any(|(a, _)| a == addr) {
                let _ = write!(moves, "{addr}: {was}->gone, ");
            }
        }
        moves.truncate(moves.trim_end_matches([',', ' ']).len());
        self.logged = current;
        self.at = Some(now);
        Some(moves)
    }

    fn was(&self, addr: SocketAddr) -> usize {
        self.logged
            .iter()
            .find(|(a, _)| *a == addr)
            .map_or(0, |(_, t)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: u8, target: usize, demand: f64) -> Node {
        let mut n = Node::new(SocketAddr::from(([10, 0, 0, i], 7070)));
        n.live_link = true;
        n.target = target;
        n.demand = Some(demand);
        n
    }

    /// The lines themselves, not tracing's output: a test that captured it with a scoped
    /// subscriber lost lines now and then while other tests ran on other threads.
    #[test]
    fn one_line_per_rebalance_at_most_one_a_second_folding_what_came_between() {
        let mut log = Rebalance::default();
        let t0 = Instant::now();
        let mut all = Vec::new();
        let mut note = |at, nodes: &[Node]| all.extend(log.moves(at, nodes));
        note(t0, &[node(1, 2, 0.0), node(2, 2, 0.0)]);
        note(t0, &[node(1, 2, 0.0), node(2, 2, 0.0)]);
        note(t0, &[node(1, 1, 0.0), node(2, 3, 6.0)]);
        note(t0 + EVERY / 2, &[node(1, 0, 0.0), node(2, 4, 9.0)]);
        note(t0 + EVERY, &[node(1, 0, 0.0), node(2, 4, 9.5)]);
        // Node 1 had nothing: its leaving is no move; node 2 leaves holding 4.
        note(t0 + EVERY * 2, &[node(2, 4, 9.5)]);
        note(t0 + EVERY * 4, &[node(3, 4, 1.0)]);
        assert_eq!(all.len(), 3, "{all:#?}");
        assert!(
            all[0].contains("10.0.0.1:7070: 0->2 (demand 0.0)"),
            "{}",
            all[0]
        );
        // The changes within the second come out as one move, 2 -> 0, with the demands now.
        assert!(
            all[1].contains("10.0.0.1:7070: 2->0 (demand 0.0)"),
            "{}",
            all[1]
        );
        assert!(
            all[1].contains("10.0.0.2:7070: 2->4 (demand 9.5)"),
            "{}",
            all[1]
        );
        assert!(all[2].contains("10.0.0.3:7070: 0->4"), "{}", all[2]);
        assert!(all[2].contains("10.0.0.2:7070: 4->gone"), "{}", all[2]);
        assert!(!all[2].contains("10.0.0.1"), "{}", all[2]);
    }
}
