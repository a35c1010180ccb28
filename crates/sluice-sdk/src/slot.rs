//! One slot: a task that keeps one session registered — dial, register, serve HTTP/1.1 (or
//! HTTP/2, with [`Options::streams`]) until the session ends, then dial a replacement — until
//! it is retired, stopped or refused for good.
//! With many nodes, each dial goes to the node the fleet lends it ([`Lease`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use crate::dial::{self, Endpoint, SessionIo};
use crate::error::Error;
use crate::fleet::{Fleet, Lease};
use crate::options::Options;
use crate::retire::{CloseRule, Retiring, SessionFlags};
use crate::service::SessionService;
use crate::state::{Counts, Probe, Shared};

/// How a registered session ended.
enum Ended {
    /// It answered a retirement with `Connection: close`: the slot ends.
    Retired,
    /// Its node is not live any more, or asked it to retire: dial elsewhere at once.
    Moved,
    /// The proxy closed it, an upgrade took it, or it failed: dial a replacement.
    Closed { served: bool },
}

/// What a slot does after one dial.
enum Next {
    Dial,
    Pause(Duration),
    End,
}

pub(crate) struct Slot<S> {
    pub(crate) id: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) options: Arc<Options>,
    pub(crate) fleet: Option<Arc<Fleet>>,
    pub(crate) service: S,
}

impl<S: SessionService> Slot<S> {
    // Methods that await take `&mut self`: `&Slot` is not `Send` for a service that is not `Sync`.

    /// Runs the slot; `_done` is dropped when it ends, which is what `shutdown` waits for.
    pub(crate) async fn run(self, _done: mpsc::Sender<()>) {
        let span = tracing::debug_span!(
            "slot",
            service = %self.options.identity.service,
            acceptor = %self.options.acceptor,
            slot = self.id,
        );
        self.dial_loop().instrument(span).await;
    }

    async fn dial_loop(mut self) {
        let mut counts = self.shared.subscribe_counts();
        let mut topology = self.fleet.as_ref().map(|f| f.subscribe_topology());
        let mut failures = 0u32;
        while !self.shared.should_end() {
            let next = match self.fleet.clone() {
                None => self.round(&mut counts, &mut failures).await,
                Some(fleet) => match fleet.pick().await {
                    Some(lease) => self.round_at(lease).await,
                    None => Next::End,
                },
            };
            match next {
                Next::Dial => {}
                Next::End => return,
                Next::Pause(pause) => {
                    if let Some(t) = &mut topology {
                        t.mark_unchanged();
                    }
                    if self.wait(pause, &mut counts, topology.as_mut()).await {
                        return;
                    }
                }
            }
        }
    }

    /// One dial to the one acceptor.
    async fn round(&mut self, counts: &mut watch::Receiver<Counts>, failures: &mut u32) -> Next {
        if !self.await_probe(counts).await {
            return Next::End;
        }
        let epoch = self.shared.report.epoch();
        match self.session(None).await {
            Ok(Ended::Retired) => Next::End,
            Ok(Ended::Moved) => Next::Dial,
            Ok(Ended::Closed { served }) => self.closed(served, failures),
            Err(e) if e.is_drained() => {
                self.shared.hold(e, self.options.drained_probe);
                Next::Dial
            }
            Err(e) if !e.is_retryable() => {
                self.shared.slot_failed(e);
                Next::End
            }
            Err(e) => {
                self.shared.dial_failed(e, epoch);
                self.backoff(failures)
            }
        }
    }

    /// One dial to the node `lease` names. A failure makes the node back off, not the slot
    /// (protocol/README.md, "Back-off"): [`Fleet::pick`](crate::fleet::Fleet) waits it out.
    async fn round_at(&mut self, lease: Lease) -> Next {
        let lease = Arc::new(lease);
        let epoch = lease.report().epoch();
        match self.session(Some(&lease)).await {
            Ok(ended) => {
                let moved = lease.ended();
                match ended {
                    Ended::Retired => Next::End,
                    Ended::Moved => Next::Dial,
                    Ended::Closed { served } if moved || served => Next::Dial,
                    Ended::Closed { .. } => {
                        // Closed before serving anything: the node backs off, not the slot.
                        lease.unused();
                        Next::Dial
                    }
                }
            }
            Err(e) if e.is_drained() => {
                lease.drained(&e);
                self.shared.record(e);
                Next::Dial
            }
            Err(e) if !e.is_retryable() => {
                lease.gave_up();
                self.shared.slot_failed(e);
                Next::End
            }
            Err(e) => {
                // The node backs off, not the slot: it may dial another node at once.
                lease.failed(&e, epoch);
                self.shared.record(e);
                Next::Dial
            }
        }
    }

    fn closed(&self, served: bool, failures: &mut u32) -> Next {
        *failures = 0;
        // A session closed before serving anything: do not spin on such a proxy.
        if served {
            Next::Dial
        } else {
            Next::Pause(self.options.backoff.delay(0))
        }
    }

    fn backoff(&self, failures: &mut u32) -> Next {
        *failures = failures.saturating_add(1);
        Next::Pause(self.options.backoff.delay(*failures - 1))
    }

    /// While the instance is drained: waits until this slot dials the instance's one probe
    /// (every `drained_probe`) or the hold ends; `false` if the slot should end meanwhile.
    async fn await_probe(&mut self, counts: &mut watch::Receiver<Counts>) -> bool {
        loop {
            let at = match self.shared.claim_probe(self.options.drained_probe) {
                Probe::Dial => return true,
                Probe::Mine => {
                    tracing::debug!("probing whether the instance was resumed");
                    return true;
                }
                Probe::Wait(at) => at,
            };
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                changed = counts.changed() => if changed.is_err() { return false },
            }
            if self.shared.should_end() {
                return false;
            }
        }
    }

    /// Sleeps `pause`; returns early with `true` if the slot should end meanwhile, and with
    /// `false` when the nodes' liveness changes (a node it failed to reach may be down now).
    async fn wait(
        &mut self,
        pause: Duration,
        counts: &mut watch::Receiver<Counts>,
        mut topology: Option<&mut watch::Receiver<u64>>,
    ) -> bool {
        let deadline = Instant::now() + pause;
        loop {
            if self.shared.should_end() {
                return true;
            }
            let nodes_changed = async {
                match topology.as_mut() {
                    Some(t) => t.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return false,
                changed = counts.changed() => if changed.is_err() { return true },
                up = nodes_changed => return !up,
            }
        }
    }

    async fn session(&mut self, lease: Option<&Arc<Lease>>) -> Result<Ended, Error> {
        let target = self.shared.counts().target;
        let to = lease.map_or(Endpoint::Acceptor, |l| Endpoint::Node(l.addr()));
        let registered = dial::register(&self.options, to, target).await?;
        let _registered = self.shared.registered();
        let rule = match lease {
            None => CloseRule::Shrink(self.shared.clone()),
            Some(lease) => {
                lease.registered();
                if lease.is_probe() {
                    tracing::debug!(node = %lease.addr(), "the probe registered");
                }
                CloseRule::Node(lease.clone())
            }
        };
        tracing::debug!("session registered");
        let flags = Arc::new(SessionFlags::default());
        // An HTTP/2 session retires by GOAWAY, not by a response's `Connection: close`.
        let per_response = self.options.streams.is_none().then(|| rule.clone());
        let service = Retiring::new(
            self.service.clone(),
            per_response,
            flags.clone(),
            registered.peer,
        );
        match self.options.streams {
            None => self.serve(registered.io, service, &rule, &flags).await,
            Some(streams) => {
                self.serve_h2(registered.io, service, streams, &rule, &flags)
                    .await
            }
        }
        tracing::debug!("session ended");
        Ok(match (flags.retired.load(Ordering::Relaxed), &rule) {
            (true, CloseRule::Shrink(_)) => Ended::Retired,
            (true, CloseRule::Node(_)) => Ended::Moved,
            (false, _) => Ended::Closed {
                served: flags.served.load(Ordering::Relaxed),
            },
        })
    }

    /// Serves HTTP/1.1 on a session until the proxy closes it or an upgrade takes it. While
    /// it is idle, a close owed (a shrink, or a node no longer live) closes it at once: the
    /// proxy drops a session it sees closed while idle. A busy one closes after its
    /// response instead ([`Retiring`]).
    async fn serve(
        &mut self,
        io: SessionIo,
        service: Retiring<S>,
        rule: &CloseRule,
        flags: &SessionFlags,
    ) {
        let conn = http1::Builder::new()
            // A session idles between requests for as long as the proxy likes.
            .header_read_timeout(None)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        tokio::pin!(conn);
        let mut changes = rule.subscribe();
        // A close owed while this session was registering: it closes at once, idle as it is.
        let mut closing = retire_if_idle(rule, flags);
        if closing {
            conn.as_mut().graceful_shutdown();
        }
        loop {
            tokio::select! {
                ended = conn.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "session ended with an error");
                    }
                    return;
                }
                changed = changes.changed(), if !closing => {
                    closing = !changed || retire_if_idle(rule, flags);
                    if closing {
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        }
    }

    /// Serves HTTP/2 on a session, at most `streams` requests at once, until the proxy closes
    /// it. A close owed (a shrink, or a node no longer live), or the proxy's answer to the
    /// instance's drain, makes it send `GOAWAY` at once, busy or not: the proxy opens no
    /// stream on it after that, those in flight finish, and then it closes.
    async fn serve_h2(
        &mut self,
        io: SessionIo,
        service: Retiring<S>,
        streams: u32,
        rule: &CloseRule,
        flags: &SessionFlags,
    ) {
        let conn = http2::Builder::new(TokioExecutor::new())
            .max_concurrent_streams(streams)
            .serve_connection(TokioIo::new(io), service);
        tokio::pin!(conn);
        let mut changes = rule.subscribe();
        let mut counts = self.shared.subscribe_counts();
        let mut closing = false;
        loop {
            if !closing && (self.shared.counts().drained || claim_close(rule, flags)) {
                closing = true;
                tracing::debug!("closing an HTTP/2 session: GOAWAY");
                conn.as_mut().graceful_shutdown();
            }
            tokio::select! {
                ended = conn.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "session ended with an error");
                    }
                    return;
                }
                changed = changes.changed(), if !closing => if !changed {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                },
                changed = counts.changed(), if !closing => if changed.is_err() {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                },
            }
        }
    }
}

/// Claims an owed close for this session, busy or not (an HTTP/2 one).
fn claim_close(rule: &CloseRule, flags: &SessionFlags) -> bool {
    if flags.retired.load(Ordering::SeqCst) || !rule.claim() {
        return false;
    }
    flags.retired.store(true, Ordering::SeqCst);
    true
}

/// Claims an owed close for this session if it is idle.
fn retire_if_idle(rule: &CloseRule, flags: &SessionFlags) -> bool {
    if flags.busy.load(Ordering::SeqCst) || flags.retired.load(Ordering::SeqCst) || !rule.claim() {
        return false;
    }
    flags.retired.store(true, Ordering::SeqCst);
    tracing::debug!("closing an idle session that owes a close");
    true
}
