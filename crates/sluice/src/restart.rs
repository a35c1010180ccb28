//! Hot restart (docs/design.md §4): a new Sluice takes over a running one's listening sockets and
//! idle sessions over a UNIX socket, so an upgrade drops no request and services never
//! re-dial. The exchange is specified in `docs/handoff.md`:
//!
//! ```text
//! new → old   HELLO 1 upgrade, READY              (the new config is loaded)
//! old → new   HELLO 1 upgrade
//! old → new   LISTENER <name> <addr> + fd, …      (every listening socket)
//! old → new   READY                               (the old one stops accepting)
//! old → new   SESSION <id> <cluster> <slice> <instance> + fd, …   (as each becomes idle)
//! old → new   DONE                                (the old one exits)
//! ```
//!
//! The old side is [`UpgradeSocket`] (waits for a successor) and the hand-over that
//! [`Proxy::run_until`](crate::Proxy::run_until) runs when one arrives; the new side is
//! [`Inherited`] (takes the listeners) and the adoption of the sessions that follow.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_handoff::{AllowedUids, Handoff, HandoffListener, Message, Role, PROTOCOL_VERSION};
use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use sluice_net::sockets::{HandedListener, Sockets};
use sluice_reverse::acceptor::HandedOver;
use sluice_upstream::reverse::{HandedSession, Limit};
use sluice_upstream::ReverseCluster;

/// Why a hot restart could not go ahead.
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    /// The upgrade socket could not be bound or reached, or the exchange failed.
    #[error("upgrade socket {path}: {source}")]
    Handoff {
        /// The socket's path.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: sluice_handoff::Error,
    },
    /// The other side said something out of turn.
    #[error("upgrade socket {path}: unexpected {got} ({expected} expected)")]
    Unexpected {
        /// The socket's path.
        path: PathBuf,
        /// The verb that arrived.
        got: &'static str,
        /// What the exchange needed.
        expected: &'static str,
    },
}

/// Where a running Sluice waits for its successor (`[runtime] upgrade_socket`).
#[derive(Debug)]
pub(crate) struct UpgradeSocket {
    listener: HandoffListener,
    path: PathBuf,
}

impl UpgradeSocket {
    /// Binds the socket (mode 0600: only this user's processes may take over).
    pub(crate) fn bind(path: &Path) -> Result<Self, RestartError> {
        let listener =
            HandoffListener::bind(path, 0o600).map_err(|source| RestartError::Handoff {
                path: path.to_owned(),
                source,
            })?;
        Ok(Self {
            listener,
            path: path.to_owned(),
        })
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for a successor that says `HELLO 1 upgrade` and `READY`; peers of another user
    /// (`SO_PEERCRED`), or that say anything else, are logged and dropped.
    pub(crate) async fn successor(&self) -> Handoff {
        loop {
            match self.listener.accept_allowed(&AllowedUids::default()).await {
                Ok((conn, creds)) => match greet(&conn, &self.path).await {
                    Ok(()) => {
                        info!(pid = creds.pid, "a successor asked to take over");
                        return conn;
                    }
                    Err(error) => warn!(%error, "upgrade request refused"),
                },
                Err(error) => {
                    warn!(%error, "upgrade socket: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// The old side's half of the greeting: the successor's HELLO and READY, then ours.
async fn greet(conn: &Handoff, path: &Path) -> Result<(), RestartError> {
    expect(conn, path, "HELLO", |m| {
        matches!(
            m,
            Message::Hello {
                role: Role::Upgrade,
                ..
            }
        )
    })
    .await?;
    expect(conn, path, "READY", |m| matches!(m, Message::Ready)).await?;
    send(conn, path, &hello(), None).await
}

fn hello() -> Message {
    Message::Hello {
        version: PROTOCOL_VERSION,
        role: Role::Upgrade,
    }
}

async fn send(
    conn: &Handoff,
    path: &Path,
    msg: &Message,
    fd: Option<OwnedFd>,
) -> Result<(), RestartError> {
    conn.send(msg, fd)
        .await
        .map_err(|source| RestartError::Handoff {
            path: path.to_owned(),
            source,
        })
}

async fn recv(conn: &Handoff, path: &Path) -> Result<(Message, Option<OwnedFd>), RestartError> {
    conn.recv().await.map_err(|source| RestartError::Handoff {
        path: path.to_owned(),
        source,
    })
}

async fn expect(
    conn: &Handoff,
    path: &Path,
    expected: &'static str,
    ok: impl Fn(&Message) -> bool,
) -> Result<(), RestartError> {
    let (msg, _fd) = recv(conn, path).await?;
    if ok(&msg) {
        Ok(())
    } else {
        Err(RestartError::Unexpected {
            path: path.to_owned(),
            got: msg.verb(),
            expected,
        })
    }
}

/// The old side: every listening socket (a duplicate: this process stops accepting on its
/// own copy). [`send_ready`] follows.
pub(crate) async fn send_listeners(
    conn: &Handoff,
    path: &Path,
    listeners: Vec<HandedListener>,
) -> Result<(), RestartError> {
    for HandedListener { name, addr, fd } in listeners {
        debug!(%name, %addr, "handing over a listener");
        send(conn, path, &Message::Listener { name, addr }, Some(fd)).await?;
    }
    Ok(())
}

/// The old side: READY, after the last listener. The successor binds the upgrade socket's
/// path when it reads this, so the old side closes its own first.
pub(crate) async fn send_ready(conn: &Handoff, path: &Path) -> Result<(), RestartError> {
    send(conn, path, &Message::Ready, None).await
}

/// The old side: each session handed over, as it comes, then DONE once every cluster has
/// let go of its last one (the senders are dropped).
pub(crate) async fn forward_sessions(
    conn: Handoff,
    path: PathBuf,
    mut sessions: mpsc::UnboundedReceiver<HandedSession>,
) {
    let mut sent = 0u64;
    while let Some(s) = sessions.recv().await {
        let msg = Message::Session {
            id: sent,
            cluster: s.slice.cluster,
            slice: s.slice.slice,
            instance: s.instance,
        };
        if let Err(error) = send(&conn, &path, &msg, Some(s.fd)).await {
            // The successor is gone: the sessions still here close with this process, and
            // their services re-dial.
            warn!(%error, "handing a session over failed");
            return;
        }
        sent += 1;
    }
    if let Err(error) = send(&conn, &path, &Message::Done, None).await {
        warn!(%error, "telling the successor we are done failed");
    }
    info!(sessions = sent, "hand-over complete");
}

/// What a new Sluice took over from its predecessor: listening sockets by name, and the
/// connection on which idle sessions will follow.
#[derive(Debug)]
pub struct Inherited {
    path: PathBuf,
    listeners: Sockets,
    conn: Handoff,
}

impl Inherited {
    /// Connects to the running Sluice's upgrade socket and takes its listening sockets. Call
    /// it once the new configuration is loaded: the old process stops accepting as soon as
    /// this returns.
    pub async fn take_over(path: &Path) -> Result<Self, RestartError> {
        let conn = Handoff::connect(path)
            .await
            .map_err(|source| RestartError::Handoff {
                path: path.to_owned(),
                source,
            })?;
        send(&conn, path, &hello(), None).await?;
        send(&conn, path, &Message::Ready, None).await?;
        expect(&conn, path, "HELLO", |m| matches!(m, Message::Hello { .. })).await?;
        let mut listeners = HashMap::new();
        loop {
            match recv(&conn, path).await? {
                (Message::Listener { name, addr }, Some(fd)) => {
                    listeners.insert(name, (addr, fd));
                }
                (Message::Ready, _) => break,
                (other, _) => {
                    return Err(RestartError::Unexpected {
                        path: path.to_owned(),
                        got: other.verb(),
                        expected: "LISTENER or READY",
                    })
                }
            }
        }
        info!(
            listeners = listeners.len(),
            "took over the listening sockets"
        );
        Ok(Self {
            path: path.to_owned(),
            listeners: Sockets::inheriting(listeners),
            conn,
        })
    }

    /// The listening sockets, to bind through, and the connection on which the predecessor's
    /// sessions arrive.
    pub(crate) fn into_parts(self) -> (Sockets, (Handoff, PathBuf)) {
        (self.listeners, (self.conn, self.path))
    }
}

/// The new side: adopts every session the predecessor hands over into the cluster of the same
/// name, until DONE. A session for a cluster the new configuration lacks is closed (its
/// service re-dials and gets 404).
///
/// Until then, requests to a slice without sessions wait for them instead of meeting an empty
/// slice. The returned future holds that promise from the moment it is created, not from its
/// first poll: the inherited listeners may hand this process a connection before a spawned
/// task runs.
pub(crate) fn adopt_sessions(
    conn: Handoff,
    path: PathBuf,
    clusters: BTreeMap<String, ReverseCluster>,
    total: Arc<Limit>,
) -> impl Future<Output = ()> {
    let expecting: Vec<_> = clusters
        .values()
        .map(ReverseCluster::expect_sessions)
        .collect();
    async move {
        let adopted = adopt_until_done(&conn, &path, &clusters, &total).await;
        drop(expecting);
        if let Some(adopted) = adopted {
            info!(adopted, "adopted the predecessor's sessions");
        }
    }
}

/// Adopts handed sessions until DONE: how many (`None` if the hand-over ended early).
async fn adopt_until_done(
    conn: &Handoff,
    path: &Path,
    clusters: &BTreeMap<String, ReverseCluster>,
    total: &Arc<Limit>,
) -> Option<usize> {
    let mut adopted = 0usize;
    loop {
        let (msg, fd) = match recv(conn, path).await {
            Ok(m) => m,
            Err(error) => {
                warn!(%error, adopted, "the predecessor's hand-over ended early");
                return None;
            }
        };
        match (msg, fd) {
            (
                Message::Session {
                    cluster,
                    slice,
                    instance,
                    ..
                },
                Some(fd),
            ) => {
                let Some(c) = clusters.get(&cluster) else {
                    warn!(%cluster, %instance, "handed a session of an unknown cluster; closing it");
                    continue;
                };
                match c.adopt(&slice, &instance, fd, total).await {
                    Ok(()) => adopted += 1,
                    Err(error) => {
                        warn!(%cluster, %instance, %error, "cannot adopt a handed session")
                    }
                }
            }
            (Message::Done, _) => return Some(adopted),
            (other, _) => debug!(verb = other.verb(), "ignored during the hand-over"),
        }
    }
}

// The old side's part of `Proxy::run_until`.

/// How long idle sessions are given to move to a successor even when the grace period is
/// over.
const MOVE_TIME: Duration = Duration::from_secs(1);

/// The task that forwards sessions to a successor, and when the grace period ends.
#[derive(Debug)]
pub(crate) struct Handover {
    forwarder: JoinHandle<()>,
    deadline: Instant,
}

/// Duplicates of the listening sockets, and the acceptor's switch to mark them taken.
#[derive(Debug, Default)]
pub(crate) struct ListenerFds {
    /// Every listening socket, named for the hand-over.
    pub(crate) sockets: Vec<HandedListener>,
    /// The acceptor's switch, when there is an acceptor.
    pub(crate) acceptor: Option<HandedOver>,
}

/// How [`stop_or_upgrade`] ended.
#[derive(Debug)]
pub(crate) enum Stopped {
    /// The trigger resolved: a plain shutdown.
    Triggered,
    /// A successor has the listening sockets; the idle sessions are moving to it.
    Upgraded(Handover),
}

/// Resolves when `trigger` does, or once a successor has taken the listening sockets (then
/// every reverse cluster starts handing its idle sessions over, and the task that forwards
/// them comes back in [`Stopped::Upgraded`]).
pub(crate) async fn stop_or_upgrade(
    trigger: impl Future<Output = ()>,
    upgrade: Option<UpgradeSocket>,
    fds: ListenerFds,
    reverse: &BTreeMap<String, ReverseCluster>,
    grace: Duration,
    upgraded: &watch::Sender<bool>,
) -> Stopped {
    let Some(socket) = upgrade else {
        trigger.await;
        return Stopped::Triggered;
    };
    tokio::pin!(trigger);
    let path = socket.path().to_owned();
    let conn = loop {
        let conn = tokio::select! {
            () = &mut trigger => return Stopped::Triggered,
            conn = socket.successor() => conn,
        };
        // Copies: if this successor fails, the next one gets the sockets all the same.
        let copies: std::io::Result<Vec<_>> =
            fds.sockets.iter().map(HandedListener::try_clone).collect();
        let sent = match copies {
            Ok(copies) => send_listeners(&conn, &path, copies)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match sent {
            Ok(()) => break conn,
            Err(error) => {
                tracing::error!(%error, "hot restart failed while handing over the listeners; serving on")
            }
        }
    };
    // The successor binds the path anew once it reads READY: ours must be gone by then.
    drop(socket);
    if let Err(error) = send_ready(&conn, &path).await {
        // It has our sockets but may never serve: keep serving (no more upgrades, though).
        tracing::error!(%error, "hot restart failed at READY; serving on without an upgrade socket");
        trigger.await;
        return Stopped::Triggered;
    }
    if let Some(flag) = fds.acceptor {
        flag.set();
    }
    upgraded.send_replace(true);
    let (tx, rx) = mpsc::unbounded_channel();
    for cluster in reverse.values() {
        // One idle session per slice stays for requests on connections still draining here.
        cluster.start_handover(tx.clone(), true);
    }
    let forwarder = tokio::spawn(forward_sessions(conn, path, rx));
    tracing::info!("a successor took the listening sockets; draining and handing sessions over");
    Stopped::Upgraded(Handover {
        forwarder,
        deadline: Instant::now() + grace,
    })
}

/// After the drain: hands over the rest, waits until every session has left (by `deadline`,
/// the end of the grace period that began with the upgrade, but at least [`MOVE_TIME`] for
/// idle sessions to move), and lets the forwarder say DONE.
pub(crate) async fn finish_handover(
    reverse: &BTreeMap<String, ReverseCluster>,
    Handover {
        forwarder,
        deadline,
    }: Handover,
) {
    for cluster in reverse.values() {
        cluster.finish_handover();
    }
    let all_gone = async {
        for cluster in reverse.values() {
            cluster.wait_until(|c| c.sessions() == 0).await;
        }
    };
    let deadline = deadline.max(Instant::now() + MOVE_TIME);
    if tokio::time::timeout_at(deadline, all_gone).await.is_err() {
        tracing::warn!("sessions still busy after the grace period; closing them");
    }
    for cluster in reverse.values() {
        cluster.stop_handover();
    }
    if let Err(e) = forwarder.await {
        tracing::warn!(error = %e, "the hand-over task failed");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use http::Request;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use sluice_core::body::ProxyBody;

    /// The predecessor's side: hands `session` over, says DONE, and answers one request on
    /// the service's end of it (if one comes within 10 s).
    async fn predecessor(conn: Handoff, session: UnixStream, service: UnixStream) {
        let handed = Message::Session {
            id: 1,
            cluster: "api".to_owned(),
            slice: "default".to_owned(),
            instance: "i-1".to_owned(),
        };
        conn.send(&handed, Some(session.into()))
            .await
            .expect("SESSION");
        conn.send(&Message::Done, None).await.expect("DONE");
        service.set_nonblocking(true).expect("non-blocking");
        let mut service = tokio::net::UnixStream::from_std(service).expect("tokio stream");
        let read_head = async {
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8];
                service
                    .read_exact(&mut byte)
                    .await
                    .expect("the request head");
                head.push(byte[0]);
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), read_head)
            .await
            .is_err()
        {
            return;
        }
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        service.write_all(answer).await.expect("the response");
    }

    /// The inherited listeners may hand the new process a connection before its adoption task
    /// has first run (both CI failures of 2026-11-23: `no sessions registered` 503s during hot
    /// restarts). Such a request waits for the handed sessions.
    #[tokio::test]
    async fn a_request_before_the_adoption_task_runs_waits_for_the_handed_sessions() {
        let opts = crate::options::reverse::options(&sluice_config::ReverseOptions::default());
        let cluster = ReverseCluster::new("api", Vec::new(), opts);
        let clusters = BTreeMap::from([("api".to_owned(), cluster.clone())]);
        let (ours, theirs) = Handoff::pair().expect("handoff pair");
        // Created but not yet polled, like a task spawned that has not run yet.
        let adopting = adopt_sessions(
            ours,
            PathBuf::from("upgrade.sock"),
            clusters,
            Arc::default(),
        );
        let upstream = sluice_upstream::Upstream::Reverse(cluster.slice("default"));
        let request = upstream.send(Request::new(ProxyBody::empty()));
        let (session, service) = UnixStream::pair().expect("session pair");
        let (response, (), ()) =
            tokio::join!(request, adopting, predecessor(theirs, session, service));
        let response = response.expect("the handed session answers");
        assert_eq!(response.status(), 200);
    }
}
