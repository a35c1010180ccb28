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
        let current: Vec<(SocketAddr, usize)> = nodes.iter().map(|n| (n.addr, n.target)).collect();
        let moved = current.iter().any(|&(a, t)| self.was(a) != t)
            || self
                .logged
                .iter()
                .any(|&(a, t)| t > 0 && !current.iter().any(|c| c.0 == a));
        if !moved {
            // Nodes that came or went holding nothing: no line, but remember them.
            self.logged = current;
            return;
        }
        if self.at.is_some_and(|at| now < at + EVERY) {
            return;
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
        tracing::info!(capacity, targets = %moves, "sessions rebalanced across nodes");
        self.logged = current;
        self.at = Some(now);
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
    #![allow(clippy::unwrap_used)]
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn node(i: u8, target: usize, demand: f64) -> Node {
        let mut n = Node::new(SocketAddr::from(([10, 0, 0, i], 7070)));
        n.live_link = true;
        n.target = target;
        n.demand = Some(demand);
        n
    }

    #[test]
    fn one_line_per_rebalance_at_most_one_a_second_folding_what_came_between() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            // Other tests on other threads may have met these callsites with no subscriber
            // and cached that nobody wants them: ask again now that this one is in place.
            tracing::callsite::rebuild_interest_cache();
            let mut log = Rebalance::default();
            let t0 = Instant::now();
            log.note(t0, 4, &[node(1, 2, 0.0), node(2, 2, 0.0)]);
            log.note(t0, 4, &[node(1, 2, 0.0), node(2, 2, 0.0)]);
            log.note(t0, 4, &[node(1, 1, 0.0), node(2, 3, 6.0)]);
            log.note(t0 + EVERY / 2, 4, &[node(1, 0, 0.0), node(2, 4, 9.0)]);
            log.note(t0 + EVERY, 4, &[node(1, 0, 0.0), node(2, 4, 9.5)]);
            // Node 1 had nothing: its leaving is no move; node 2 leaves holding 4.
            log.note(t0 + EVERY * 2, 4, &[node(2, 4, 9.5)]);
            log.note(t0 + EVERY * 4, 4, &[node(3, 4, 1.0)]);
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let all: Vec<&str> = text.lines().collect();
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
