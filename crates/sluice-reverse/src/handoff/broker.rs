//! The standalone acceptor: services register here as usual; consumers connect to the
//! handoff socket, ask for sessions by credit, and get each as `SESSION` + fd.
//!
//! Registered sessions wait in this process's slice pools, watched for EOF like any idle
//! session. A slice lends as many idle sessions as its consumers have credit for, in turn
//! (round robin across consumers with credit). A lent session's permit stays here, so the
//! session limits count it until the consumer reports it `GONE`, returns it (`RETURN`, back
//! to the pool), or dies (its sessions died with it: the services re-dial).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use sluice_handoff::{AllowedUids, Handoff, HandoffListener, Message, Role, SliceState};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tracing::{debug, info, warn, Instrument};

use super::emptiness::Emptiness;
use super::error::{LinkError, PeerError};
use super::ledger::{ConsumerView, Ledger};
use crate::acceptor::{Acceptor, BindError};
use crate::cluster::ReverseCluster;
use crate::handover::HandedSession;
use crate::instance::SessionPermit;
use crate::metrics::ReverseMetrics;
use crate::options::BrokerOptions;
use crate::protocol::Protocol;
use crate::slice_id::SliceId;
use sluice_net::{Shutdown, ShutdownSignal};

/// Why a standalone acceptor could not start.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The configuration lacks what a standalone acceptor needs, or has what it cannot do.
    #[error("{0}")]
    Config(String),
    /// The service-facing acceptor could not be bound.
    #[error("acceptor: {0}")]
    Acceptor(#[from] BindError),
    /// The handoff socket could not be bound.
    #[error("handoff socket: {0}")]
    Handoff(#[from] sluice_handoff::Error),
}

/// `sluice acceptor`: the acceptor and the handoff socket, without client listeners.
#[derive(Debug)]
pub struct StandaloneAcceptor<P: Protocol> {
    acceptor: Acceptor<P>,
    /// What the broker shares with its tasks (and with [`BrokerView`]s).
    shared: Arc<Shared<P>>,
    /// Told `stop` when it stops, so the services' control links say `DRAINING`.
    readiness: sluice_net::Readiness,
    listener: HandoffListener,
    allowed: AllowedUids,
}

#[derive(Debug, Default)]
struct State {
    /// Credit, loans and recalls; a loan holds the session's permit.
    ledger: Ledger<SessionPermit>,
    /// The slices consumers were told have no session registered.
    emptiness: Emptiness,
    /// Each consumer's connection, by its id in the ledger.
    conns: BTreeMap<u64, Arc<Handoff>>,
}

#[derive(Debug)]
struct Shared<P: Protocol> {
    state: Mutex<State>,
    clusters: BTreeMap<String, ReverseCluster<P>>,
    /// Wakes the pump: credit arrived, or sessions came or went.
    wake: Notify,
}

/// What an admin API reads of a running standalone acceptor: its clusters, and its consumers'
/// credit and loans. Cheap to clone.
#[derive(Debug)]
pub struct BrokerView<P: Protocol>(Arc<Shared<P>>);

impl<P: Protocol> Clone for BrokerView<P> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<P: Protocol> BrokerView<P> {
    /// The reverse clusters it serves.
    pub fn clusters(&self) -> &BTreeMap<String, ReverseCluster<P>> {
        &self.0.clusters
    }

    /// Each consumer connected now, with its credit and loans by slice.
    pub fn consumers(&self) -> Vec<ConsumerView> {
        self.0.state().ledger.view()
    }
}

impl<P: Protocol> Shared<P> {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<P: Protocol> StandaloneAcceptor<P> {
    /// Binds the acceptor for `clusters`, the reverse clusters whose services register here,
    /// and the handoff socket.
    pub async fn bind(
        opts: &BrokerOptions,
        clusters: impl IntoIterator<Item = ReverseCluster<P>>,
    ) -> Result<Self, BrokerError> {
        Self::bind_with_metrics(opts, clusters, &ReverseMetrics::default()).await
    }

    /// [`bind`](Self::bind), counting handshakes and refusals in `metrics` (the clusters count
    /// their queue waits in the metrics they were built with).
    pub async fn bind_with_metrics(
        opts: &BrokerOptions,
        clusters: impl IntoIterator<Item = ReverseCluster<P>>,
        metrics: &ReverseMetrics,
    ) -> Result<Self, BrokerError> {
        let clusters: BTreeMap<String, ReverseCluster<P>> = clusters
            .into_iter()
            .map(|c| (c.name().to_owned(), c))
            .collect();
        let readiness = sluice_net::Readiness::default();
        let acceptor = Acceptor::bind(&opts.acceptor, clusters.values().cloned())
            .await?
            .with_readiness(&readiness)
            .with_metrics(metrics.clone())
            .lending();
        let listener = HandoffListener::bind_with(&opts.path, opts.access)?;
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            clusters,
            wake: Notify::new(),
        });
        Ok(Self {
            acceptor,
            shared,
            readiness,
            listener,
            allowed: AllowedUids::new(opts.allowed_uids.iter().copied()),
        })
    }

    /// A view of its clusters and consumers, for an admin API.
    pub fn view(&self) -> BrokerView<P> {
        BrokerView(Arc::clone(&self.shared))
    }

    /// Whether it takes traffic (for an admin API's `/ready`).
    pub fn readiness(&self) -> &sluice_net::Readiness {
        &self.readiness
    }

    /// The acceptor's bound TCP address.
    pub fn acceptor_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.acceptor.local_addr()
    }

    /// Serves services and consumers until `trigger` resolves; then closes every session it
    /// holds (those lent out stay with their consumers).
    pub async fn run_until(self, trigger: impl std::future::Future<Output = ()>) {
        let shutdown = Shutdown::new();
        let (tx, rx) = mpsc::unbounded_channel();
        let (lost_tx, lost) = mpsc::unbounded_channel();
        let shared = self.shared;
        for cluster in shared.clusters.values() {
            cluster.start_pull(tx.clone(), Some(lost_tx.clone()));
        }
        drop((tx, lost_tx));
        let mut tasks = JoinSet::new();
        tasks.spawn(self.acceptor.run(shutdown.signal()));
        tasks.spawn(pump(Arc::clone(&shared)));
        tasks.spawn(lend(Arc::clone(&shared), rx, lost));
        for cluster in shared.clusters.values() {
            tasks.spawn(watch(Arc::clone(&shared), cluster.clone()));
        }
        let signal = shutdown.signal();
        tasks.spawn(accept(
            self.listener,
            self.allowed,
            Arc::clone(&shared),
            signal,
        ));
        info!(
            clusters = shared.clusters.len(),
            "standalone acceptor running"
        );
        self.readiness.ready();
        trigger.await;
        self.readiness.stop();
        let links: Vec<_> = shared
            .clusters
            .values()
            .map(|c| Arc::clone(c.links()))
            .collect();
        crate::links::told_draining(&links, std::time::Duration::from_secs(1)).await;
        shutdown.trigger();
        tasks.shutdown().await;
        for cluster in shared.clusters.values() {
            cluster.close();
        }
        info!("standalone acceptor stopped");
    }
}

/// Accepts consumers until shutdown; peers of uids not allowed are refused.
async fn accept<P: Protocol>(
    listener: HandoffListener,
    allowed: AllowedUids,
    shared: Arc<Shared<P>>,
    signal: ShutdownSignal,
) {
    info!(path = %listener.path().display(), "handoff socket listening");
    let mut consumers = JoinSet::new();
    let stop = signal.wait();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept_allowed(&allowed) => accepted,
            Some(_) = consumers.join_next(), if !consumers.is_empty() => continue,
        };
        match accepted {
            Ok((conn, creds)) => {
                let span = tracing::info_span!("consumer", pid = creds.pid, uid = creds.uid);
                consumers.spawn(serve(Arc::new(conn), Arc::clone(&shared)).instrument(span));
            }
            Err(sluice_handoff::Error::PeerNotAllowed { uid, pid }) => warn!(
                uid,
                pid,
                "handoff connection refused: its uid is not allowed; add it to [handoff] allowed_uids"
            ),
            Err(error) => warn!(%error, "handoff connection refused"),
        }
    }
}

/// One consumer: its greeting, then CREDIT, RETURN and GONE until it goes away. Whatever it
/// still held is then forgotten (its permits released: those sessions died with it).
async fn serve<P: Protocol>(conn: Arc<Handoff>, shared: Arc<Shared<P>>) {
    match conn.hello(Role::Acceptor).await {
        Ok(Role::Consumer) => {}
        Ok(role) => return warn!(%role, "handoff peer is not a consumer"),
        Err(error) => return warn!(%error, "handoff greeting failed"),
    }
    let id = {
        let mut st = shared.state();
        let id = st.ledger.join();
        st.conns.insert(id, Arc::clone(&conn));
        id
    };
    info!(consumer = id, "consumer connected");
    let error = loop {
        let (msg, fd) = match conn.recv().await {
            Ok(m) => m,
            Err(e) => break LinkError::from(e),
        };
        if let Err(e) = handle(&shared, id, msg, fd).await {
            break e.into();
        }
    };
    let held = forget(&shared, id);
    info!(consumer = id, held, %error, "consumer gone");
    shared.wake.notify_one();
}

async fn handle<P: Protocol>(
    shared: &Shared<P>,
    consumer: u64,
    msg: Message,
    fd: Option<OwnedFd>,
) -> Result<(), PeerError> {
    match (msg, fd) {
        (Message::Credit { cluster, slice, n }, None) => {
            let Some(c) = shared.clusters.get(&cluster) else {
                return Err(PeerError::UnknownCluster(cluster));
            };
            let alive = c.alive_sessions(&slice);
            let key = SliceId::new(cluster, slice);
            let news = {
                let mut st = shared.state();
                let first = !st.ledger.has_asked(consumer, &key);
                st.ledger.credit(consumer, key.clone(), n);
                slice_news(&mut st, &key, alive, first.then_some(consumer))
            };
            shared.wake.notify_one();
            tell(news).await;
            Ok(())
        }
        (Message::Gone { id }, None) => {
            // The permit is released outside the lock.
            let settled = shared.state().ledger.settle(consumer, id)?;
            drop(settled);
            shared.wake.notify_one();
            Ok(())
        }
        (Message::Return { id }, Some(fd)) => {
            let settled = shared.state().ledger.settle(consumer, id);
            let (slice, permit) = settled?;
            if let Some(c) = shared.clusters.get(&slice.cluster) {
                if let Err(error) = c.reattach(&slice.slice, fd, permit).await {
                    debug!(%slice, %error, "a returned session could not rejoin its pool");
                }
            }
            Ok(())
        }
        (other, _) => Err(PeerError::Unexpected {
            verb: other.verb(),
            from: "a consumer",
        }),
    }
}

/// Forgets a consumer and everything lent to it; returns how many sessions it held.
fn forget<P: Protocol>(shared: &Shared<P>, consumer: u64) -> usize {
    let permits = {
        let mut st = shared.state();
        st.conns.remove(&consumer);
        st.ledger.leave(consumer)
    };
    permits.len()
}

/// Asks each slice's pool for as many idle sessions as consumers have credit for (less those
/// already on their way), whenever credit or sessions change.
async fn pump<P: Protocol>(shared: Arc<Shared<P>>) {
    loop {
        let wanted = shared.state().ledger.wanted();
        for (key, n) in wanted {
            let Some(c) = shared.clusters.get(&key.cluster) else {
                continue;
            };
            // Counted before they leave: `lend` may see them arrive before this returns.
            shared.state().ledger.asked(&key, n);
            let got = c.hand_over_some(&key.slice, n);
            for (conn, msg) in recalls(&shared, &key, n, got) {
                if let Err(error) = conn.send(&msg, None).await {
                    debug!(%error, "a consumer missed a RECALL");
                }
            }
        }
        shared.wake.notified().await;
    }
}

/// The RECALLs the ledger says are due for `key` now that its pool gave `got` of the `n`
/// sessions asked, with the connections to send them on.
fn recalls<P: Protocol>(
    shared: &Shared<P>,
    key: &SliceId,
    n: usize,
    got: usize,
) -> Vec<(Arc<Handoff>, Message)> {
    let mut st = shared.state();
    let due = st.ledger.pumped(key, n, got);
    due.into_iter()
        .filter_map(|(consumer, n)| {
            let msg = Message::Recall {
                cluster: key.cluster.clone(),
                slice: key.slice.clone(),
                n,
            };
            Some((Arc::clone(st.conns.get(&consumer)?), msg))
        })
        .collect()
}

/// Wakes the pump whenever a cluster's sessions change, tells the consumers of a slice when
/// it has no session left or has some again, and tells every consumer about drained
/// instances.
async fn watch<P: Protocol>(shared: Arc<Shared<P>>, cluster: ReverseCluster<P>) {
    let mut drains = cluster.subscribe_drains();
    loop {
        tokio::select! {
            () = cluster.changed() => {
                shared.wake.notify_one();
                tell(cluster_news(&shared, &cluster)).await;
            }
            drained = drains.recv() => match drained {
                Ok(instance) => tell_all(&shared, &Message::Drain { instance }).await,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            },
        }
    }
}

/// `SLICE` for every slice of `cluster` consumers asked for whose emptiness changed.
fn cluster_news<P: Protocol>(
    shared: &Shared<P>,
    cluster: &ReverseCluster<P>,
) -> Vec<(Arc<Handoff>, Message)> {
    let keys = shared.state().ledger.asked_slices(cluster.name());
    let alive: Vec<(SliceId, usize)> = keys
        .into_iter()
        .map(|key| {
            let n = cluster.alive_sessions(&key.slice);
            (key, n)
        })
        .collect();
    let mut st = shared.state();
    alive
        .iter()
        .flat_map(|(key, n)| slice_news(&mut st, key, *n, None))
        .collect()
}

/// What the consumers of `key` must hear now that it has `alive` sessions: `SLICE` to each
/// that asked for it when its emptiness changed; else, to a consumer asking for the first
/// time (`newcomer`), that it is empty if it is.
fn slice_news(
    st: &mut State,
    key: &SliceId,
    alive: usize,
    newcomer: Option<u64>,
) -> Vec<(Arc<Handoff>, Message)> {
    let (to, state) = match st.emptiness.update(key, alive) {
        Some(state) => {
            match state {
                SliceState::Empty => {
                    warn!(%key, "no sessions registered: consumers are told (SLICE empty)")
                }
                SliceState::Registered => {
                    info!(%key, "sessions registered again: consumers are told")
                }
            }
            (st.ledger.askers(key), state)
        }
        None if st.emptiness.is_empty(key) => (newcomer.into_iter().collect(), SliceState::Empty),
        None => return Vec::new(),
    };
    to.iter()
        .filter_map(|consumer| {
            let msg = Message::Slice {
                cluster: key.cluster.clone(),
                slice: key.slice.clone(),
                state,
            };
            Some((Arc::clone(st.conns.get(consumer)?), msg))
        })
        .collect()
}

/// Sends each message on its connection; a consumer that misses one has gone away.
async fn tell(news: Vec<(Arc<Handoff>, Message)>) {
    for (conn, msg) in news {
        if let Err(error) = conn.send(&msg, None).await {
            debug!(%error, "a consumer missed {}", msg.verb());
        }
    }
}

async fn tell_all<P: Protocol>(shared: &Shared<P>, msg: &Message) {
    let conns: Vec<Arc<Handoff>> = shared.state().conns.values().cloned().collect();
    for conn in conns {
        if let Err(error) = conn.send(msg, None).await {
            debug!(%error, "a consumer missed {}", msg.verb());
        }
    }
}

/// Lends each session the pools hand over to the next consumer with credit for its slice;
/// with nobody left wanting it, it goes back to its pool.
/// A session asked of a pool that will not arrive (it closed first) is no longer in transit.
async fn lend<P: Protocol>(
    shared: Arc<Shared<P>>,
    mut rx: mpsc::UnboundedReceiver<HandedSession>,
    mut lost: mpsc::UnboundedReceiver<SliceId>,
) {
    loop {
        let handed = tokio::select! {
            Some(handed) = rx.recv() => handed,
            Some(key) = lost.recv() => {
                shared.state().ledger.arrived(&key);
                shared.wake.notify_one();
                continue;
            }
            else => return,
        };
        let key = handed.slice.clone();
        let picked = {
            let mut st = shared.state();
            st.ledger.arrived(&key);
            let picked = st.ledger.pick(&key);
            picked.and_then(|(consumer, id)| {
                Some((consumer, id, Arc::clone(st.conns.get(&consumer)?)))
            })
        };
        match picked {
            Some((consumer, id, conn)) => send_session(&shared, handed, consumer, id, conn).await,
            None => {
                let HandedSession {
                    slice, fd, permit, ..
                } = handed;
                if let Some(c) = shared.clusters.get(&slice.cluster) {
                    let _ = c.reattach(&slice.slice, fd, permit).await;
                }
            }
        }
    }
}

async fn send_session<P: Protocol>(
    shared: &Shared<P>,
    handed: HandedSession,
    consumer: u64,
    id: u64,
    conn: Arc<Handoff>,
) {
    let HandedSession {
        slice,
        instance,
        fd,
        permit,
    } = handed;
    let msg = Message::Session {
        id,
        cluster: slice.cluster.clone(),
        slice: slice.slice.clone(),
        instance,
    };
    // Recorded first: the consumer may answer GONE before `send` returns here. A consumer
    // forgotten since it was picked gets nothing (nobody would ever release the entry).
    let lent = shared
        .state()
        .ledger
        .lend(id, consumer, slice.clone(), permit);
    if let Err(permit) = lent {
        if let Some(c) = shared.clusters.get(&slice.cluster) {
            let _ = c.reattach(&slice.slice, fd, permit).await;
        }
        return;
    }
    let sent = conn.send(&msg, Some(fd)).await;
    let forgotten = {
        let mut st = shared.state();
        match &sent {
            // Forgotten while the send ran: its sessions went with it, as for the others.
            Ok(()) if st.ledger.is_member(consumer) => None,
            _ => st.ledger.unlend(id),
        }
    };
    if let Err(error) = sent {
        // The socket went with the failed send (closed): the service re-dials.
        warn!(consumer, %error, "lending a session failed");
    }
    // The permit is released outside the lock.
    drop(forgotten);
}
