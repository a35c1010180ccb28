//! [`Readiness`]: whether this node takes traffic — starting, ready, draining or stopping —
//! for the admin API's `/ready` (what an L4 balancer or Kubernetes probes) and for the
//! services' control links (a stopping node tells them to move their sessions elsewhere).

use tokio::sync::watch;

/// Where a node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Binding and loading: not serving yet.
    Starting,
    /// Serving.
    Ready,
    /// Drained by its operator: `/ready` fails so that balancers stop sending clients, and
    /// everything else goes on (sessions follow the demand, which falls), until resumed.
    Draining,
    /// Shutting down: in-flight work finishes, and the services move their sessions
    /// elsewhere (`DRAINING` on their control links).
    Stopping,
}

impl NodeState {
    /// `starting`, `ready` or `draining`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Draining => "draining",
            Self::Stopping => "stopping",
        }
    }
}

/// The node's state; clones share it.
#[derive(Debug, Clone)]
pub struct Readiness {
    tx: watch::Sender<NodeState>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            tx: watch::channel(NodeState::Starting).0,
        }
    }
}

impl Readiness {
    /// The state now.
    pub fn state(&self) -> NodeState {
        *self.tx.borrow()
    }

    /// Whether `/ready` should say yes.
    pub fn is_ready(&self) -> bool {
        self.state() == NodeState::Ready
    }

    /// Serving (a draining or stopping node stays so).
    pub fn ready(&self) {
        self.tx.send_if_modified(|s| {
            let starting = *s == NodeState::Starting;
            if starting {
                *s = NodeState::Ready;
            }
            starting
        });
    }

    /// Ready again after an operator's drain (`sluice ctl resume-node`); returns false when
    /// the node was not draining (a stopping node stays stopping).
    pub fn resume(&self) -> bool {
        self.tx.send_if_modified(|s| {
            let draining = *s == NodeState::Draining;
            if draining {
                *s = NodeState::Ready;
            }
            draining
        })
    }

    /// Draining until resumed (a stopping node stays stopping).
    pub fn drain(&self) {
        self.tx.send_if_modified(|s| {
            let changed = matches!(*s, NodeState::Starting | NodeState::Ready);
            if changed {
                *s = NodeState::Draining;
            }
            changed
        });
    }

    /// Stopping, for good.
    pub fn stop(&self) {
        self.tx.send_if_modified(|s| {
            let changed = *s != NodeState::Stopping;
            *s = NodeState::Stopping;
            changed
        });
    }

    /// Watches the state.
    pub fn subscribe(&self) -> watch::Receiver<NodeState> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_operators_drain_is_undone() {
        let r = Readiness::default();
        r.ready();
        r.drain();
        assert!(r.resume());
        assert_eq!(r.state(), NodeState::Ready);
        assert!(!r.resume(), "not draining: nothing to undo");
        r.stop();
        assert!(!r.resume());
        assert_eq!(r.state(), NodeState::Stopping);
    }

    #[test]
    fn a_draining_node_never_turns_ready_again() {
        let r = Readiness::default();
        assert_eq!(r.state(), NodeState::Starting);
        r.ready();
        assert_eq!(r.state(), NodeState::Ready);
        r.drain();
        r.ready();
        assert_eq!(r.state(), NodeState::Draining);
        r.stop();
        r.drain();
        assert_eq!(r.state(), NodeState::Stopping);
    }
}
