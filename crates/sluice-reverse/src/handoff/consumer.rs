//! A Sluice drawing sessions from a standalone acceptor: it asks for credit ahead of demand,
//! adopts every lent session into its local pool, reports each that ends here `GONE`, and
//! returns idle sessions beyond twice its target so that other consumers get them.
//!
//! Per slice, the credit asked for (and not yet filled) plus the idle sessions is kept at
//! `handoff_idle` plus the requests waiting in the admission queue. Idle sessions beyond
//! twice `handoff_idle` go back only once the surplus has lasted [`SURPLUS_FOR`] with nothing
//! waiting: under load, sessions are idle for a moment between requests, and returning them
//! then would cost a handoff per request. When the acceptor goes away, the sessions already
//! here keep serving; the consumer reconnects with backoff and asks again.
//!
//! When the process stops (`stop` fires, once its requests have drained), it asks for nothing
//! more, returns every session it holds (`RETURN`, idle ones at once, the rest as their
//! responses end) and sends back any lent on the way until its open credit is used up (at
//! most [`OPEN_CREDIT_WAIT`]), so its services keep their connections and re-dial nothing: the
//! acceptor lends them to the next consumer.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_handoff::{Handoff, Message, Role};
use sluice_net::ShutdownSignal;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How long a slice's idle surplus must last before it goes back to the acceptor.
const SURPLUS_FOR: Duration = Duration::from_secs(1);
/// How long a stopping consumer waits for sessions lent against credit it asked for earlier
/// (credit cannot be withdrawn; what arrives goes straight back), as the NGINX module's
/// exiting workers do.
const OPEN_CREDIT_WAIT: Duration = Duration::from_secs(2);

use super::error::{LinkError, PeerError};
use crate::cluster::ReverseCluster;
use crate::handover::HandedSession;
use crate::instance::Lent;
use crate::protocol::Protocol;
use crate::slice_id::SliceId;

/// One reverse cluster fed by a handoff socket, and the slices its routes use.
#[derive(Debug, Clone)]
pub struct Source<P: Protocol> {
    pub cluster: ReverseCluster<P>,
    pub slices: Vec<String>,
    /// Idle sessions to keep per slice.
    pub idle: usize,
}

/// Keeps the clusters fed from the acceptor at `path` until `stop` fires, then gives their
/// sessions back to it and returns (at once when it is unreachable).
pub async fn consume<P: Protocol>(path: PathBuf, sources: Vec<Source<P>>, stop: ShutdownSignal) {
    let mut attempt = 0u32;
    while !stop.is_triggered() {
        match Handoff::connect(&path).await {
            Ok(conn) => {
                attempt = 0;
                info!(path = %path.display(), "connected to the acceptor");
                let Err(error) = serve(Arc::new(conn), &sources, &stop).await else {
                    info!(path = %path.display(), "returned every session to the acceptor");
                    return;
                };
                // Nothing leaves for a link that is gone: sessions the acceptor recalled stay
                // here rather than close on their way to it (the next link forgives the debt).
                for s in &sources {
                    s.cluster.stop_handover();
                }
                warn!(path = %path.display(), %error, "lost the acceptor; sessions here keep serving");
            }
            Err(error) => {
                debug!(path = %path.display(), %error, attempt, "acceptor unreachable");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff(attempt)) => {}
            () = stop.wait() => {}
        }
        attempt = attempt.saturating_add(1);
    }
}

/// What one connection to the acceptor tracks.
struct Link<'a, P: Protocol> {
    conn: Arc<Handoff>,
    sources: &'a [Source<P>],
    /// Credit asked for and not yet filled, per (cluster, slice).
    asked: HashMap<SliceId, usize>,
    /// Since when each slice has had idle sessions to spare (and nothing waiting).
    surplus: HashMap<SliceId, Instant>,
    gone: mpsc::UnboundedSender<u64>,
    /// Since when the process stops: every session goes back, none is asked for.
    stopping: Option<Instant>,
}

/// One connection's life: `Ok` once it gave every session back after `stop`, else why it
/// ended.
async fn serve<P: Protocol>(
    conn: Arc<Handoff>,
    sources: &[Source<P>],
    stop: &ShutdownSignal,
) -> Result<(), LinkError> {
    match conn.hello(Role::Consumer).await {
        Ok(Role::Acceptor) => {}
        Ok(role) => return Err(PeerError::NotAnAcceptor(role).into()),
        Err(e) => return Err(e.into()),
    }
    let (back_tx, mut back) = mpsc::unbounded_channel();
    let (gone_tx, mut gone) = mpsc::unbounded_channel();
    let wake = Arc::new(Notify::new());
    let mut watchers = JoinSet::new();
    for s in sources {
        s.cluster.start_pull(back_tx.clone(), None);
        let (cluster, wake) = (s.cluster.clone(), Arc::clone(&wake));
        watchers.spawn(async move {
            loop {
                cluster.changed().await;
                wake.notify_one();
            }
        });
    }
    let mut link = Link {
        conn: Arc::clone(&conn),
        sources,
        asked: HashMap::new(),
        surplus: HashMap::new(),
        gone: gone_tx,
        stopping: None,
    };
    loop {
        if link.done_stopping() {
            return Ok(());
        }
        link.balance().await?;
        let step = tokio::select! {
            received = conn.recv() => match received {
                Ok((msg, fd)) => link.on_message(msg, fd).await,
                Err(e) => Err(e.into()),
            },
            Some(handed) = back.recv() => link.give_back(handed).await,
            Some(id) = gone.recv() => link.send(&Message::Gone { id }, None).await,
            () = wake.notified() => Ok(()),
            // A surplus is only returned once it has lasted: look again then.
            () = tokio::time::sleep(SURPLUS_FOR), if !link.surplus.is_empty() => Ok(()),
            () = stop.wait(), if link.stopping.is_none() => {
                link.stop();
                Ok(())
            }
            () = tokio::time::sleep(OPEN_CREDIT_WAIT), if link.stopping.is_some() => Ok(()),
        };
        step?;
    }
}

impl<P: Protocol> Link<'_, P> {
    async fn send(&self, msg: &Message, fd: Option<OwnedFd>) -> Result<(), LinkError> {
        Ok(self.conn.send(msg, fd).await?)
    }

    fn cluster(&self, name: &str) -> Option<&ReverseCluster<P>> {
        self.sources
            .iter()
            .map(|s| &s.cluster)
            .find(|c| c.name() == name)
    }

    /// The process stops: from now on every session goes back as soon as it is idle.
    fn stop(&mut self) {
        self.stopping = Some(Instant::now());
        self.surplus.clear();
        for s in self.sources {
            s.cluster.recall_all();
        }
    }

    /// Stopping, with every session given back and no credit open (or none filled in time).
    fn done_stopping(&self) -> bool {
        let Some(since) = self.stopping else {
            return false;
        };
        let credit_open = self.asked.values().any(|&n| n > 0);
        self.sources.iter().all(|s| s.cluster.sessions() == 0)
            && (!credit_open || since.elapsed() >= OPEN_CREDIT_WAIT)
    }

    /// Asks for the credit each slice lacks, and hands surplus idle sessions back.
    async fn balance(&mut self) -> Result<(), LinkError> {
        if self.stopping.is_some() {
            return Ok(());
        }
        for s in self.sources {
            for slice in &s.slices {
                let (idle, queued) = (s.cluster.idle_sessions(slice), s.cluster.queued(slice));
                let key = SliceId::new(s.cluster.name(), slice.as_str());
                let asked = self.asked.get(&key).copied().unwrap_or(0);
                // Never more than the cluster's own `max_sessions` leaves room for: what it
                // could not adopt would only go back as GONE (and its service re-dial).
                let room = s.cluster.room().saturating_sub(asked);
                let want = (s.idle + queued).min(idle.saturating_add(room));
                if idle + asked < want {
                    let n = u32::try_from(want - idle - asked).unwrap_or(u32::MAX);
                    let msg = Message::Credit {
                        cluster: key.cluster.clone(),
                        slice: key.slice.clone(),
                        n,
                    };
                    self.send(&msg, None).await?;
                    self.surplus.remove(&key);
                    *self.asked.entry(key).or_default() += n as usize;
                } else if queued == 0 && idle > 2 * s.idle {
                    let since = *self.surplus.entry(key.clone()).or_insert_with(Instant::now);
                    if since.elapsed() >= SURPLUS_FOR {
                        s.cluster.hand_over_some(slice, idle - s.idle);
                        self.surplus.remove(&key);
                    }
                } else {
                    self.surplus.remove(&key);
                }
            }
        }
        Ok(())
    }

    async fn on_message(&mut self, msg: Message, fd: Option<OwnedFd>) -> Result<(), LinkError> {
        match (msg, fd) {
            (
                Message::Session {
                    id,
                    cluster,
                    slice,
                    instance,
                },
                Some(fd),
            ) => {
                if let Some(n) = self
                    .asked
                    .get_mut(&SliceId::new(cluster.as_str(), slice.as_str()))
                {
                    *n = n.saturating_sub(1);
                }
                if self.stopping.is_some() {
                    // Lent as this process stops: straight back, never adopted.
                    return self.send(&Message::Return { id }, Some(fd)).await;
                }
                self.adopt(id, &cluster, &slice, &instance, fd).await
            }
            (Message::Recall { cluster, slice, n }, None) => {
                if let Some(c) = self.cluster(&cluster) {
                    c.recall(&slice, n as usize);
                }
                Ok(())
            }
            (Message::Drain { instance }, None) => {
                for s in self.sources {
                    s.cluster.drain(&instance);
                }
                Ok(())
            }
            // A Sluice consumer's requests wait for sessions regardless (its clusters expect
            // them from the acceptor); the NGINX module answers 503 at once instead.
            (
                Message::Slice {
                    cluster,
                    slice,
                    state,
                },
                None,
            ) => {
                debug!(%cluster, %slice, %state, "the acceptor reports the slice");
                Ok(())
            }
            (other, _) => Err(PeerError::Unexpected {
                verb: other.verb(),
                from: "the acceptor",
            }
            .into()),
        }
    }

    async fn adopt(
        &self,
        id: u64,
        cluster: &str,
        slice: &str,
        instance: &str,
        fd: OwnedFd,
    ) -> Result<(), LinkError> {
        let Some(c) = self.cluster(cluster) else {
            warn!(%cluster, "lent a session of a cluster this process does not have");
            return self.send(&Message::Gone { id }, None).await;
        };
        let lent = Lent {
            id,
            gone: self.gone.clone(),
        };
        // On failure the permit (and with it the GONE) went with the error.
        if let Err(error) = c.adopt_lent(slice, instance, fd, lent).await {
            debug!(%cluster, %instance, %error, "cannot adopt a lent session");
        }
        Ok(())
    }

    /// Returns a surplus idle session to the acceptor that lent it; one lent over an earlier
    /// connection (the acceptor restarted since) stays here instead.
    async fn give_back(&self, handed: HandedSession) -> Result<(), LinkError> {
        let HandedSession {
            slice,
            fd,
            mut permit,
            ..
        } = handed;
        match permit.take_lent() {
            Some(lent) if lent.gone.same_channel(&self.gone) => {
                drop(permit);
                self.send(&Message::Return { id: lent.id }, Some(fd)).await
            }
            earlier => {
                permit.restore_lent(earlier);
                if let Some(c) = self.cluster(&slice.cluster) {
                    let _ = c.reattach(&slice.slice, fd, permit).await;
                }
                Ok(())
            }
        }
    }
}

/// Delays between attempts to reach the acceptor: 100 ms doubling to 5 s.
fn backoff(attempt: u32) -> std::time::Duration {
    let ms = 100u64.saturating_mul(1 << attempt.min(6)).min(5_000);
    std::time::Duration::from_millis(ms)
}
