//! One slot: a task that keeps one session registered — dial, register, serve HTTP/1.1 until
//! the session ends, then dial a replacement — until it is retired, stopped or refused for good.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use crate::dial::{self, SessionIo};
use crate::retire::{Retiring, SessionFlags};
use crate::state::{Counts, Probe, Shared};
use crate::SessionService;
use crate::{Error, Options};

/// How a registered session ended.
enum Ended {
    /// It answered a retirement with `Connection: close`: the slot ends.
    Retired,
    /// The proxy closed it, an upgrade took it, or it failed: dial a replacement.
    Closed { served: bool },
}

pub(crate) struct Slot<S> {
    pub(crate) id: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) options: Arc<Options>,
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
        let mut failures = 0u32;
        while !self.shared.should_end() {
            if !self.await_probe(&mut counts).await {
                return;
            }
            let epoch = self.shared.report.epoch();
            let pause = match self.session().await {
                Ok(Ended::Retired) => return,
                Ok(Ended::Closed { served }) => {
                    failures = 0;
                    // A session closed before serving anything: do not spin on such a proxy.
                    (!served).then(|| self.options.backoff.delay(0))
                }
                Err(e) if e.is_drained() => {
                    self.shared.hold(e, self.options.drained_probe);
                    None
                }
                Err(e) if !e.is_retryable() => return self.shared.slot_failed(e),
                Err(e) => {
                    self.shared.dial_failed(e, epoch);
                    failures = failures.saturating_add(1);
                    Some(self.options.backoff.delay(failures - 1))
                }
            };
            if let Some(pause) = pause {
                if self.wait(pause, &mut counts).await {
                    return;
                }
            }
        }
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

    /// Sleeps `pause`; returns early with `true` if the slot should end meanwhile.
    async fn wait(&mut self, pause: Duration, counts: &mut watch::Receiver<Counts>) -> bool {
        let deadline = Instant::now() + pause;
        loop {
            if self.shared.should_end() {
                return true;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return false,
                changed = counts.changed() => if changed.is_err() { return true },
            }
        }
    }

    async fn session(&mut self) -> Result<Ended, Error> {
        let target = self.shared.counts().target;
        let registered = dial::register(&self.options, target).await?;
        let _registered = self.shared.registered();
        tracing::debug!("session registered");
        let flags = Arc::new(SessionFlags::default());
        let service = Retiring::new(
            self.service.clone(),
            self.shared.clone(),
            flags.clone(),
            registered.peer,
        );
        self.serve(registered.io, service, &flags).await;
        tracing::debug!("session ended");
        Ok(if flags.retired.load(Ordering::Relaxed) {
            Ended::Retired
        } else {
            Ended::Closed {
                served: flags.served.load(Ordering::Relaxed),
            }
        })
    }

    /// Serves HTTP/1.1 on a session until the proxy closes it or an upgrade takes it. While
    /// it is idle, a retirement owed (a shrink) closes it at once: the proxy drops a session
    /// it sees closed while idle. A busy one retires on its response instead ([`Retiring`]).
    async fn serve(&mut self, io: SessionIo, service: Retiring<S>, flags: &SessionFlags) {
        let conn = http1::Builder::new()
            // A session idles between requests for as long as the proxy likes.
            .header_read_timeout(None)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        tokio::pin!(conn);
        let mut counts = self.shared.subscribe_counts();
        // A shrink while this session was registering: it retires at once, idle as it is.
        let mut closing = self.retire_if_idle(flags);
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
                changed = counts.changed(), if !closing => {
                    closing = changed.is_err() || self.retire_if_idle(flags);
                    if closing {
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        }
    }

    /// Claims an owed retirement for this session if it is idle.
    fn retire_if_idle(&self, flags: &SessionFlags) -> bool {
        if flags.busy.load(Ordering::SeqCst)
            || flags.retired.load(Ordering::SeqCst)
            || !self.shared.claim_retirement()
        {
            return false;
        }
        flags.retired.store(true, Ordering::SeqCst);
        tracing::debug!("retiring idle session: closing it");
        true
    }
}
