//! The standalone acceptor: services register here as usual; consumers connect to the
//! handoff socket, ask for sessions by credit, and get each as `SESSION` + fd.
//!
//! Registered sessions wait in this process's slice pools, watched for EOF like any idle
//! session. A slice lends as many idle sessions as its consumers have credit for, in turn
//! (round robin across consumers with credit). A lent session's permit stays here, so the
//! session limits count it until the consumer reports it `GONE`, returns it (`RETURN`, back
//! to the pool), or dies (its sessions died with it: the services re-dial).

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use sluice_config::{Config, HandoffServer, SessionSource};
use sluice_handoff::{AllowedUids, Handoff, HandoffListener, Message, Role};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tracing::{debug, info, warn, Instrument};

use super::error::{LinkError, PeerError};
use crate::acceptor::{Acceptor, BindError};
use crate::server::{Shutdown, ShutdownSignal};
use crate::upstream::reverse::{HandedSession, SessionPermit};
use crate::upstream::ReverseCluster;

/// Why a standalone acceptor could not start.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The configuration lacks what a standalone acceptor needs.
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
pub struct StandaloneAcceptor {
    acceptor: Acceptor,
    listener: HandoffListener,
    allowed: AllowedUids,
    clusters: BTreeMap<String, ReverseCluster>,
}

/// A (cluster, slice) pair.
type SliceKey = (String, String);

#[derive(Debug, Default)]
struct State {
    consumers: BTreeMap<u64, Peer>,
    /// Lent sessions by id.
    out: HashMap<u64, Out>,
    /// Sessions asked of a pool and not yet arrived, per slice.
    in_transit: HashMap<SliceKey, usize>,
    next_consumer: u64,
    next_session: u64,
    /// Where the round robin over consumers resumes.
    cursor: u64,
}

#[derive(Debug)]
struct Peer {
    conn: Arc<Handoff>,
    credit: HashMap<SliceKey, u32>,
    /// Sessions asked back (`RECALL`) and not yet returned or gone, per slice.
    recalled: HashMap<SliceKey, usize>,
}

#[derive(Debug)]
struct Out {
    consumer: u64,
    slice: SliceKey,
    permit: SessionPermit,
}

struct Shared {
    state: Mutex<State>,
    clusters: BTreeMap<String, ReverseCluster>,
    /// Wakes the pump: credit arrived, or sessions came or went.
    wake: Notify,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StandaloneAcceptor {
    /// Binds the acceptor (`[acceptor]`) for the reverse clusters that draw on it and the
    /// handoff socket (`[handoff]`).
    pub async fn bind(config: &Config) -> Result<Self, BrokerError> {
        let (Some(opts), Some(handoff)) = (&config.acceptor, &config.handoff) else {
            return Err(BrokerError::Config(format!(
                "{}: a standalone acceptor needs [acceptor] (where services dial in) and [handoff] (where consumers connect)",
                config.source
            )));
        };
        if opts.tls.is_some() {
            return Err(BrokerError::Config(format!(
                "{}: [acceptor] tls: a standalone acceptor cannot lend sessions over TLS (their TLS state stays in this process); remove `tls` here and let services register over plain TCP on a private network or a UNIX socket",
                config.source
            )));
        }
        let clusters: BTreeMap<String, ReverseCluster> = config
            .clusters
            .iter()
            .filter_map(|(name, c)| match &c.kind {
                sluice_config::ClusterKind::Reverse(r) if r.source == SessionSource::Acceptor => {
                    Some((
                        name.clone(),
                        ReverseCluster::from_config(name, r, &Default::default()),
                    ))
                }
                _ => None,
            })
            .collect();
        let acceptor = Acceptor::bind(opts, clusters.values().cloned()).await?;
        let HandoffServer { path, allowed_uids } = handoff;
        let listener = HandoffListener::bind(path, sluice_handoff::DEFAULT_SOCKET_MODE)?;
        Ok(Self {
            acceptor,
            listener,
            allowed: AllowedUids::new(allowed_uids.iter().copied()),
            clusters,
        })
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
        for cluster in self.clusters.values() {
            cluster.start_pull(tx.clone(), Some(lost_tx.clone()));
        }
        drop((tx, lost_tx));
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            clusters: self.clusters,
            wake: Notify::new(),
        });
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
        trigger.await;
        shutdown.trigger();
        tasks.shutdown().await;
        for cluster in shared.clusters.values() {
            cluster.close();
        }
        info!("standalone acceptor stopped");
    }
}

/// Accepts consumers until shutdown; peers of uids not allowed are refused.
async fn accept(
    listener: HandoffListener,
    allowed: AllowedUids,
    shared: Arc<Shared>,
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
            Err(error) => warn!(%error, "handoff connection refused"),
        }
    }
}

/// One consumer: its greeting, then CREDIT, RETURN and GONE until it goes away. Whatever it
/// still held is then forgotten (its permits released: those sessions died with it).
async fn serve(conn: Arc<Handoff>, shared: Arc<Shared>) {
    match conn.hello(Role::Acceptor).await {
        Ok(Role::Consumer) => {}
        Ok(role) => return warn!(%role, "handoff peer is not a consumer"),
        Err(error) => return warn!(%error, "handoff greeting failed"),
    }
    let id = {
        let mut st = shared.state();
        st.next_consumer += 1;
        let id = st.next_consumer;
        let peer = Peer {
            conn: Arc::clone(&conn),
            credit: HashMap::new(),
            recalled: HashMap::new(),
        };
        st.consumers.insert(id, peer);
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

async fn handle(
    shared: &Shared,
    consumer: u64,
    msg: Message,
    fd: Option<OwnedFd>,
) -> Result<(), PeerError> {
    match (msg, fd) {
        (Message::Credit { cluster, slice, n }, None) => {
            if !shared.clusters.contains_key(&cluster) {
                return Err(PeerError::UnknownCluster(cluster));
            }
            let mut st = shared.state();
            if let Some(peer) = st.consumers.get_mut(&consumer) {
                let c = peer.credit.entry((cluster, slice)).or_default();
                *c = c.saturating_add(n);
            }
            drop(st);
            shared.wake.notify_one();
            Ok(())
        }
        (Message::Gone { id }, None) => {
            take_out(shared, consumer, id)?;
            shared.wake.notify_one();
            Ok(())
        }
        (Message::Return { id }, Some(fd)) => {
            let out = take_out(shared, consumer, id)?;
            let (cluster, slice) = out.slice;
            if let Some(c) = shared.clusters.get(&cluster) {
                if let Err(error) = c.reattach(&slice, fd, out.permit).await {
                    debug!(%cluster, %error, "a returned session could not rejoin its pool");
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

/// Removes a lent session that `consumer` reports on; another consumer's id is an error.
fn take_out(shared: &Shared, consumer: u64, id: u64) -> Result<Out, PeerError> {
    let mut st = shared.state();
    match st.out.remove(&id) {
        Some(out) if out.consumer == consumer => {
            if let Some(peer) = st.consumers.get_mut(&consumer) {
                if let Some(pending) = peer.recalled.get_mut(&out.slice) {
                    *pending = pending.saturating_sub(1);
                }
            }
            Ok(out)
        }
        Some(out) => {
            st.out.insert(id, out);
            Err(PeerError::LentElsewhere(id))
        }
        None => Err(PeerError::NotLent(id)),
    }
}

/// Forgets a consumer and everything lent to it; returns how many sessions it held.
fn forget(shared: &Shared, consumer: u64) -> usize {
    let permits: Vec<Out> = {
        let mut st = shared.state();
        st.consumers.remove(&consumer);
        let ids: Vec<u64> = st
            .out
            .iter()
            .filter(|(_, o)| o.consumer == consumer)
            .map(|(id, _)| *id)
            .collect();
        ids.iter().filter_map(|id| st.out.remove(id)).collect()
    };
    permits.len()
}

/// Asks each slice's pool for as many idle sessions as consumers have credit for (less those
/// already on their way), whenever credit or sessions change.
async fn pump(shared: Arc<Shared>) {
    loop {
        let wanted: Vec<(SliceKey, usize)> = {
            let st = shared.state();
            let mut credit: HashMap<&SliceKey, usize> = HashMap::new();
            for peer in st.consumers.values() {
                for (key, n) in &peer.credit {
                    *credit.entry(key).or_default() += *n as usize;
                }
            }
            credit
                .into_iter()
                .map(|(key, n)| {
                    let moving = st.in_transit.get(key).copied().unwrap_or(0);
                    (key.clone(), n.saturating_sub(moving))
                })
                .filter(|(_, n)| *n > 0)
                .collect()
        };
        for ((cluster, slice), n) in wanted {
            let Some(c) = shared.clusters.get(&cluster) else {
                continue;
            };
            // Counted before they leave: `lend` may see them arrive before this returns.
            let key = (cluster, slice);
            *shared.state().in_transit.entry(key.clone()).or_default() += n;
            let got = c.hand_over_some(&key.1, n);
            if let Some(moving) = shared.state().in_transit.get_mut(&key) {
                *moving = moving.saturating_sub(n - got);
            }
            if got < n {
                let sends = recalls(&mut shared.state(), &key);
                for (conn, msg) in sends {
                    if let Err(error) = conn.send(&msg, None).await {
                        debug!(%error, "a consumer missed a RECALL");
                    }
                }
            }
        }
        shared.wake.notified().await;
    }
}

/// When a consumer wants sessions of `key` and holds fewer than its share ([`surplus`]), asks
/// those above theirs to give the difference back; at most one recall is pending per consumer
/// and slice.
fn recalls(st: &mut State, key: &SliceKey) -> Vec<(Arc<Handoff>, Message)> {
    let mut lent: BTreeMap<u64, usize> = BTreeMap::new();
    for out in st.out.values().filter(|o| &o.slice == key) {
        *lent.entry(out.consumer).or_default() += 1;
    }
    let wanted: BTreeMap<u64, usize> = st
        .consumers
        .iter()
        .filter_map(|(id, p)| Some((*id, *p.credit.get(key)? as usize)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let mut sends = Vec::new();
    for (id, over) in surplus(&lent, &wanted) {
        let Some(peer) = st.consumers.get_mut(&id) else {
            continue;
        };
        let pending = peer.recalled.entry(key.clone()).or_default();
        if *pending > 0 {
            continue;
        }
        *pending = over;
        let msg = Message::Recall {
            cluster: key.0.clone(),
            slice: key.1.clone(),
            n: u32::try_from(over).unwrap_or(u32::MAX),
        };
        sends.push((Arc::clone(&peer.conn), msg));
    }
    sends
}

/// How many of a slice's lent sessions each consumer should give back, given what each holds
/// (`lent`) and what each still asks for (`wanted`, its open credit). Sessions are shared by
/// demand, not evenly: a consumer's share of the lent sessions is in proportion to what it
/// holds plus what it asks for (at least one), so the idle sessions of a quiet consumer move
/// to one whose requests wait. With the pool empty, a consumer that wants sessions and holds
/// fewer than its share gets the excess of those above theirs.
fn surplus(lent: &BTreeMap<u64, usize>, wanted: &BTreeMap<u64, usize>) -> BTreeMap<u64, usize> {
    let total: usize = lent.values().sum();
    let mut sharing: Vec<u64> = lent.keys().chain(wanted.keys()).copied().collect();
    sharing.sort_unstable();
    sharing.dedup();
    if total == 0 || sharing.len() < 2 {
        return BTreeMap::new();
    }
    let get = |m: &BTreeMap<u64, usize>, id: &u64| m.get(id).copied().unwrap_or(0);
    let demand = |id: &u64| get(lent, id) + get(wanted, id);
    let all: usize = sharing.iter().map(demand).sum();
    let share = |id: &u64| (total * demand(id) / all.max(1)).max(1);
    if !wanted.keys().any(|id| get(lent, id) < share(id)) {
        return BTreeMap::new();
    }
    lent.iter()
        .map(|(id, n)| (*id, n.saturating_sub(share(id))))
        .filter(|(_, over)| *over > 0)
        .collect()
}

/// Wakes the pump whenever a cluster's sessions change, and tells every consumer about
/// drained instances.
async fn watch(shared: Arc<Shared>, cluster: ReverseCluster) {
    let mut drains = cluster.subscribe_drains();
    loop {
        tokio::select! {
            () = cluster.changed() => shared.wake.notify_one(),
            drained = drains.recv() => match drained {
                Ok(instance) => tell_all(&shared, &Message::Drain { instance }).await,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            },
        }
    }
}

async fn tell_all(shared: &Shared, msg: &Message) {
    let conns: Vec<Arc<Handoff>> = {
        let st = shared.state();
        st.consumers.values().map(|p| Arc::clone(&p.conn)).collect()
    };
    for conn in conns {
        if let Err(error) = conn.send(msg, None).await {
            debug!(%error, "a consumer missed {}", msg.verb());
        }
    }
}

/// Lends each session the pools hand over to the next consumer with credit for its slice;
/// with nobody left wanting it, it goes back to its pool.
/// A session asked of a pool that will not arrive (it closed first) is no longer in transit.
async fn lend(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<HandedSession>,
    mut lost: mpsc::UnboundedReceiver<SliceKey>,
) {
    loop {
        let handed = tokio::select! {
            Some(handed) = rx.recv() => handed,
            Some(key) = lost.recv() => {
                arrived(&mut shared.state(), &key);
                shared.wake.notify_one();
                continue;
            }
            else => return,
        };
        let key = (handed.cluster.clone(), handed.slice.clone());
        let picked = {
            let mut st = shared.state();
            arrived(&mut st, &key);
            pick(&mut st, &key)
        };
        match picked {
            Some((consumer, id, conn)) => send_session(&shared, handed, consumer, id, conn).await,
            None => {
                let HandedSession {
                    cluster,
                    slice,
                    fd,
                    permit,
                    ..
                } = handed;
                if let Some(c) = shared.clusters.get(&cluster) {
                    let _ = c.reattach(&slice, fd, permit).await;
                }
            }
        }
    }
}

/// One session asked of `key`'s pool is no longer on its way.
fn arrived(st: &mut State, key: &SliceKey) {
    if let Some(n) = st.in_transit.get_mut(key) {
        *n = n.saturating_sub(1);
    }
}

/// The next consumer (round robin) with credit for `key`: takes one credit and an id.
fn pick(st: &mut State, key: &SliceKey) -> Option<(u64, u64, Arc<Handoff>)> {
    let cursor = st.cursor;
    let ids: Vec<u64> = st
        .consumers
        .range(cursor + 1..)
        .chain(st.consumers.range(..=cursor))
        .filter(|(_, p)| p.credit.get(key).is_some_and(|n| *n > 0))
        .map(|(id, _)| *id)
        .collect();
    let consumer = *ids.first()?;
    let peer = st.consumers.get_mut(&consumer)?;
    if let Some(n) = peer.credit.get_mut(key) {
        *n -= 1;
    }
    let conn = Arc::clone(&peer.conn);
    st.cursor = consumer;
    st.next_session += 1;
    Some((consumer, st.next_session, conn))
}

async fn send_session(
    shared: &Shared,
    handed: HandedSession,
    consumer: u64,
    id: u64,
    conn: Arc<Handoff>,
) {
    let HandedSession {
        cluster,
        slice,
        instance,
        fd,
        permit,
    } = handed;
    let msg = Message::Session {
        id,
        cluster: cluster.clone(),
        slice: slice.clone(),
        instance,
    };
    let out = Out {
        consumer,
        slice: (cluster.clone(), slice.clone()),
        permit,
    };
    // Recorded first: the consumer may answer GONE before `send` returns here. A consumer
    // forgotten since it was picked gets nothing (nobody would ever release the entry).
    let not_lent = {
        let mut st = shared.state();
        if st.consumers.contains_key(&consumer) {
            st.out.insert(id, out);
            None
        } else {
            Some(out)
        }
    };
    if let Some(out) = not_lent {
        if let Some(c) = shared.clusters.get(&cluster) {
            let _ = c.reattach(&slice, fd, out.permit).await;
        }
        return;
    }
    let sent = conn.send(&msg, Some(fd)).await;
    let forgotten = {
        let mut st = shared.state();
        match &sent {
            // Forgotten while the send ran: its sessions went with it, as for the others.
            Ok(()) if st.consumers.contains_key(&consumer) => None,
            _ => st.out.remove(&id),
        }
    };
    if let Err(error) = sent {
        // The socket went with the failed send (closed): the service re-dials.
        warn!(consumer, %error, "lending a session failed");
    }
    // The permit is released outside the lock.
    drop(forgotten);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(u64, usize)]) -> BTreeMap<u64, usize> {
        pairs.iter().copied().collect()
    }

    /// Issue 13's case: six sessions, three at each of two consumers; consumer 1 has requests
    /// queued (it asks for many more), consumer 2 is idle (it asks only to top up its idle
    /// reserve). The idle sessions must move to where the requests wait.
    #[test]
    fn idle_sessions_move_to_the_consumer_whose_requests_wait() {
        let over = surplus(&map(&[(1, 3), (2, 3)]), &map(&[(1, 13), (2, 1)]));
        assert_eq!(over, map(&[(2, 2)]));
    }

    /// Both loaded alike: nobody gives anything back, so sessions do not bounce.
    #[test]
    fn equal_demand_keeps_an_even_split() {
        let over = surplus(&map(&[(1, 3), (2, 3)]), &map(&[(1, 8), (2, 8)]));
        assert!(over.is_empty(), "{over:?}");
    }

    /// A consumer that holds nothing and wants some gets a share from the one that holds all.
    #[test]
    fn a_newcomer_gets_a_share() {
        let over = surplus(&map(&[(1, 6)]), &map(&[(2, 4)]));
        assert_eq!(over, map(&[(1, 3)]));
    }

    /// Once the loaded consumer holds its share, no further recall: the split is stable.
    #[test]
    fn the_split_by_demand_is_stable() {
        let over = surplus(&map(&[(1, 5), (2, 1)]), &map(&[(1, 10), (2, 3)]));
        assert!(over.is_empty(), "{over:?}");
    }
}
