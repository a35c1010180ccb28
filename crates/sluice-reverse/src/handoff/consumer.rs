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
use crate::instance::{Lent, SessionPermit};
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
    surplus: Surpluses,
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
        surplus: Surpluses::default(),
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
            () = tokio::time::sleep(SURPLUS_FOR), if link.surplus.any() => Ok(()),
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
        self.surplus = Surpluses::default();
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
                let holding = Holding {
                    keep: s.idle,
                    idle,
                    queued,
                    asked: self.asked.get(&key).copied().unwrap_or(0),
                    room: s.cluster.room(),
                };
                match holding.need() {
                    Need::Credit(n) => {
                        let msg = Message::Credit {
                            cluster: key.cluster.clone(),
                            slice: key.slice.clone(),
                            n,
                        };
                        self.send(&msg, None).await?;
                        self.surplus.end(&key);
                        *self.asked.entry(key).or_default() += n as usize;
                    }
                    Need::Surplus(n) => {
                        if self.surplus.lasted(&key) {
                            s.cluster.hand_over_some(slice, n);
                            self.surplus.end(&key);
                        }
                    }
                    Need::Even => self.surplus.end(&key),
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
        match returning(&mut permit, &self.gone) {
            Some(id) => {
                drop(permit);
                self.send(&Message::Return { id }, Some(fd)).await
            }
            None => {
                if let Some(c) = self.cluster(&slice.cluster) {
                    let _ = c.reattach(&slice.slice, fd, permit).await;
                }
                Ok(())
            }
        }
    }
}

/// One slice as [`Link::balance`] weighs it.
#[derive(Debug, Clone, Copy)]
struct Holding {
    /// Idle sessions to keep (`handoff_idle`).
    keep: usize,
    /// Idle sessions here.
    idle: usize,
    /// Requests waiting in the admission queue.
    queued: usize,
    /// Credit asked for and not yet filled.
    asked: usize,
    /// How many more sessions the cluster's `max_sessions` allows.
    room: usize,
}

/// What a slice needs of the acceptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Credit for this many more sessions.
    Credit(u32),
    /// Nothing: this many idle sessions are surplus, and go back once that has lasted.
    Surplus(usize),
    /// Nothing, and nothing to give back.
    Even,
}

impl Holding {
    /// Credit asked for plus idle sessions are kept at `keep` plus the requests waiting;
    /// idle sessions beyond twice `keep` are surplus while nothing waits.
    fn need(self) -> Need {
        // Never more than the cluster's own `max_sessions` leaves room for: what it could not
        // adopt would only go back as GONE (and its service re-dial).
        let room = self.room.saturating_sub(self.asked);
        let want = (self.keep + self.queued).min(self.idle.saturating_add(room));
        if self.idle + self.asked < want {
            Need::Credit(u32::try_from(want - self.idle - self.asked).unwrap_or(u32::MAX))
        } else if self.queued == 0 && self.idle > 2 * self.keep {
            Need::Surplus(self.idle - self.keep)
        } else {
            Need::Even
        }
    }
}

/// Since when each slice has had idle sessions to spare (and nothing waiting): under load,
/// sessions are idle for a moment between requests, and returning them then would cost a
/// handoff per request.
#[derive(Debug, Default)]
struct Surpluses(HashMap<SliceId, Instant>);

impl Surpluses {
    /// `key` has a surplus now: whether it has lasted [`SURPLUS_FOR`] (it is timed from the
    /// first time asked).
    fn lasted(&mut self, key: &SliceId) -> bool {
        let since = *self.0.entry(key.clone()).or_insert_with(Instant::now);
        since.elapsed() >= SURPLUS_FOR
    }

    /// Whether any slice has a surplus (to look again once it has lasted).
    fn any(&self) -> bool {
        !self.0.is_empty()
    }

    /// `key`'s surplus is over (given back, or needed again).
    fn end(&mut self, key: &SliceId) {
        self.0.remove(key);
    }
}

/// Whether a session handed back from a pool here goes to the acceptor: the id to `RETURN`
/// when it was lent over this link (`gone` is this link's), and its permit no longer reports
/// it `GONE`. `None` for one lent over an earlier link (that acceptor has restarted since):
/// it stays here, still reported `GONE` when it ends.
fn returning(permit: &mut SessionPermit, gone: &mpsc::UnboundedSender<u64>) -> Option<u64> {
    match permit.take_lent() {
        Some(lent) if lent.gone.same_channel(gone) => Some(lent.id),
        earlier => {
            permit.restore_lent(earlier);
            None
        }
    }
}

/// Delays between attempts to reach the acceptor: 100 ms doubling to 5 s.
fn backoff(attempt: u32) -> std::time::Duration {
    let ms = 100u64.saturating_mul(1 << attempt.min(6)).min(5_000);
    std::time::Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::*;
    use crate::instance::Limit;
    use crate::tests::Fake;

    fn holding(idle: usize, queued: usize, asked: usize) -> Holding {
        Holding {
            keep: 4,
            idle,
            queued,
            asked,
            room: usize::MAX,
        }
    }

    #[test]
    fn a_consumer_asks_for_its_idle_reserve_plus_the_requests_waiting() {
        assert_eq!(holding(0, 0, 0).need(), Need::Credit(4));
        assert_eq!(holding(1, 3, 0).need(), Need::Credit(6));
        assert_eq!(holding(1, 3, 6).need(), Need::Even, "asked already");
        assert_eq!(holding(4, 0, 0).need(), Need::Even);
    }

    #[test]
    fn a_consumer_asks_for_no_more_than_its_max_sessions_leaves_room_for() {
        let full = Holding {
            room: 2,
            ..holding(0, 10, 0)
        };
        assert_eq!(full.need(), Need::Credit(2));
        let asked = Holding {
            room: 2,
            ..holding(0, 10, 2)
        };
        assert_eq!(asked.need(), Need::Even);
    }

    #[test]
    fn idle_sessions_beyond_twice_the_reserve_are_surplus_only_while_nothing_waits() {
        assert_eq!(holding(8, 0, 0).need(), Need::Even, "twice: kept");
        assert_eq!(
            holding(9, 0, 0).need(),
            Need::Surplus(5),
            "the reserve stays"
        );
        assert_eq!(holding(9, 1, 0).need(), Need::Even, "a request waits");
    }

    #[tokio::test(start_paused = true)]
    async fn a_surplus_goes_back_only_once_it_has_lasted() {
        let key = SliceId::new("api", "default");
        let mut surplus = Surpluses::default();
        assert!(!surplus.lasted(&key));
        assert!(surplus.any());
        tokio::time::sleep(SURPLUS_FOR - Duration::from_millis(1)).await;
        assert!(!surplus.lasted(&key));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(surplus.lasted(&key));
        // Needed again meanwhile: timed afresh.
        surplus.end(&key);
        assert!(!surplus.any());
        assert!(!surplus.lasted(&key));
    }

    /// A permit of a session lent with id 7, reporting to `gone`.
    fn lent_permit(gone: &mpsc::UnboundedSender<u64>) -> SessionPermit {
        let cluster =
            ReverseCluster::<Fake>::new("api", Vec::new(), crate::tests::reverse_options());
        let mut permit = cluster.reserve("a", &Arc::new(Limit::new(None))).unwrap();
        permit.lent = Some(Lent {
            id: 7,
            gone: gone.clone(),
        });
        permit
    }

    #[test]
    fn a_session_lent_over_this_link_goes_back_and_is_not_reported_gone() {
        let (gone, mut reported) = mpsc::unbounded_channel();
        let mut permit = lent_permit(&gone);
        assert_eq!(returning(&mut permit, &gone), Some(7));
        drop(permit);
        assert!(reported.try_recv().is_err(), "RETURN, not GONE");
    }

    #[test]
    fn a_session_lent_over_an_earlier_link_stays_and_is_reported_gone_when_it_ends() {
        let (earlier, mut reported) = mpsc::unbounded_channel();
        let (this_link, _) = mpsc::unbounded_channel();
        let mut permit = lent_permit(&earlier);
        assert_eq!(returning(&mut permit, &this_link), None);
        drop(permit);
        assert_eq!(reported.try_recv().ok(), Some(7));
    }
}
