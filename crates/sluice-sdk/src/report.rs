//! [`Report`]: what an instance logs about one acceptor (`protocol/README.md`, "What SDKs
//! log"): per instance — or per node, with many — never per session slot or per attempt. An
//! outage is one warning and, once a session registers again, one info line with its length
//! and failed dials; a refusal that stops the slots is one error line; a drain hold (`410`) is
//! one warning and its end one info line.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use crate::error::Error;

/// The log lines of one instance dialing one acceptor (or node).
#[derive(Debug)]
pub(crate) struct Report {
    acceptor: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Bumped whenever an outage ends or a hold starts: a dial begun before that belongs to
    /// what ended, and its failure starts no new outage.
    epoch: u64,
    outage: Option<Outage>,
    held_since: Option<Instant>,
    /// A refusal stopped slots and was logged; cleared when the capacity is set again.
    refused: bool,
}

#[derive(Debug)]
struct Outage {
    since: Instant,
    failed: u64,
}

impl Report {
    /// A report for `acceptor`, as the logs name it.
    pub(crate) fn new(acceptor: impl Into<String>) -> Self {
        Self {
            acceptor: acceptor.into(),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The epoch a dial starts in; pass it to [`dial_failed`](Report::dial_failed).
    pub(crate) fn epoch(&self) -> u64 {
        self.state().epoch
    }

    /// A dial begun at `epoch` failed and will be retried: the first failure of an outage is
    /// a warning, the rest are counted.
    pub(crate) fn dial_failed(&self, error: &Error, epoch: u64) {
        let mut st = self.state();
        if epoch != st.epoch {
            return;
        }
        if let Some(outage) = &mut st.outage {
            outage.failed += 1;
            return;
        }
        st.outage = Some(Outage {
            since: Instant::now(),
            failed: 1,
        });
        drop(st);
        tracing::warn!(
            acceptor = %self.acceptor,
            error = %error,
            "cannot register with the acceptor; re-dialing with backoff (one line per outage)"
        );
    }

    /// A session registered (or a control link is up again): ends an outage or a hold, one
    /// info line each.
    pub(crate) fn registered(&self) {
        let mut st = self.state();
        if st.outage.is_none() && st.held_since.is_none() {
            return;
        }
        let held = st.held_since.take();
        let outage = st.outage.take();
        st.epoch += 1;
        drop(st);
        if let Some(since) = held {
            tracing::info!(
                acceptor = %self.acceptor,
                drained_for = ?since.elapsed(),
                "the instance was resumed: registered again"
            );
        }
        if let Some(outage) = outage {
            tracing::info!(
                acceptor = %self.acceptor,
                outage = ?outage.since.elapsed(),
                failed_dials = outage.failed,
                "registered with the acceptor again"
            );
        }
    }

    /// A refusal (400, 401, 404) stopped slots: one error line until the capacity is set again.
    pub(crate) fn refused(&self, error: &Error) {
        if std::mem::replace(&mut self.state().refused, true) {
            return;
        }
        tracing::error!(
            acceptor = %self.acceptor,
            error = %error,
            "the acceptor refused this instance; its sessions stop until the capacity is set again"
        );
    }

    /// `410`: an operator drained the instance. One warning; a probe's `410` again is silent.
    /// Ends an outage without a line: the acceptor answered.
    pub(crate) fn held(&self, error: &Error, probe_every: std::time::Duration) {
        let mut st = self.state();
        if st.held_since.is_some() {
            return;
        }
        st.held_since = Some(Instant::now());
        st.outage = None;
        st.epoch += 1;
        drop(st);
        tracing::warn!(
            acceptor = %self.acceptor,
            error = %error,
            probe_every = ?probe_every,
            "this instance is drained; its sessions stop and one registration probes until `sluice ctl resume`"
        );
    }

    /// The capacity was set again: a hold ends (the slots dial at once) and a refusal may be
    /// logged again.
    pub(crate) fn capacity_set(&self) {
        let mut st = self.state();
        st.refused = false;
        if st.held_since.take().is_some() {
            drop(st);
            tracing::info!(acceptor = %self.acceptor, "capacity set while drained: dialing again at once");
        }
    }
}
