//! Sluice's split-TCP relay (docs/design.md §7, after KTCP): a chain of relays splits a long TCP
//! path into short legs, so each leg's losses are repaired over its own short round trip.
//!
//! An *entry relay* accepts clients and forwards their bytes to its next hop `to`, either as a
//! plain TCP forwarder or, with `target`, through a *tunnel end* that it tells where to connect
//! in a small authenticated preamble. Latency is removed step by step, each switchable so it can
//! be measured: one task per connection; a pool of connections to `to` established and
//! authenticated before clients arrive; early connect on the client's SYN; tuned sockets
//! (`TCP_NODELAY`, `TCP_CONGESTION`, buffers); `splice(2)` instead of copies.
//!
//! # Layout
//! * [`preamble`] — the tunnel preamble's wire format and its never-panicking parsers.
//! * `upstream` — connects to the next hop's addresses and speaks the preamble; `next_hop` —
//!   a next hop by name that follows DNS (`resolve`); `pool` — the ready
//!   connections and their refill, backing off while the next hop refuses them; `early` —
//!   SYNs seen through a packet socket.
//! * `tunnel` — the tunnel end: authenticate within a deadline, check `allow`, connect;
//!   `waiting` — its connections still waiting for their token, under `max_unauthenticated`.
//! * `forward` — both directions, splice or copy, half-close, idle timeout; `sockmap` — the
//!   same done by the kernel (a BPF sockmap, the `sockmap` feature and key).
//! * `tune` — socket options; [`stats`] — the counters behind `/status` and `/metrics`.
//! * `options` — [`RelayConfig`] and its parts: a relay's settings, plain values the
//!   application converts its configuration into.

mod copy;
mod early;
mod forward;
mod next_hop;
mod options;
mod pool;
pub mod preamble;
#[cfg(feature = "sockmap")]
mod sockmap;
#[cfg(not(feature = "sockmap"))]
#[path = "sockmap_off.rs"]
mod sockmap;
pub mod stats;
mod tune;
mod tunnel;
mod upstream;
mod waiting;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use sluice_net::log_limit::TallyByKind;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::early::Early;
pub use crate::options::{
    AllowedTarget, Forward, NextHop, RelayConfig, RelayOptions, RelayRole, TunnelEnd, TunnelTarget,
};
use crate::pool::Pool;
pub use crate::stats::{Snapshot, Stats};
use crate::upstream::Connector;
use crate::waiting::Unauthenticated;
use sluice_net::dns::{Followed, FollowedStatus};

/// A relay with its listener bound, ready to [`run`](Relay::run).
#[derive(Debug)]
pub struct Relay {
    name: String,
    listener: TcpListener,
    handler: Arc<Handler>,
    handle: RelayHandle,
}

/// What the rest of the process may see and change of a running relay: its counters and its
/// pool size. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RelayHandle {
    /// The relay's name.
    pub name: String,
    /// Its bound address.
    pub addr: SocketAddr,
    /// Its counters.
    pub stats: Arc<Stats>,
    /// An entry relay's pool (configured with `pool > 0`), or a tunnel end's, one per target.
    pools: Vec<Arc<Pool>>,
    early: bool,
    sockmap: bool,
    /// An entry relay's next hop by name with `resolve`.
    followed: Option<Arc<Followed>>,
}

impl RelayHandle {
    /// Changes the pool's size (per target at a tunnel end); `false` if it has no pool.
    pub fn set_pool(&self, size: usize) -> bool {
        self.pools.iter().for_each(|p| p.resize(size));
        !self.pools.is_empty()
    }

    /// Whether early connect is on (configured, and the packet socket could be opened).
    pub fn early_connect(&self) -> bool {
        self.early
    }

    /// Whether the kernel forwards the relay's bytes (`sockmap` configured, and its program
    /// loaded).
    pub fn sockmap(&self) -> bool {
        self.sockmap
    }

    /// A next hop by name that follows DNS: its addresses now and its lookups.
    pub fn next_hop(&self) -> Option<FollowedStatus> {
        self.followed.as_ref().map(|f| f.status())
    }
}

#[derive(Debug)]
struct Handler {
    /// The relay's name, for its log lines.
    name: String,
    role: Role,
    opts: RelayOptions,
    stats: Arc<Stats>,
    /// The sockmap program, with `sockmap` on and loaded.
    kernel: Option<Arc<sockmap::Kernel>>,
    /// `max_connections`: connections relayed at once (at a tunnel end, authenticated ones).
    relayed: Arc<Semaphore>,
    /// A tunnel end's `max_unauthenticated`: connections still waiting for their token.
    unauthenticated: Option<Arc<Unauthenticated>>,
    /// A tunnel end's refusals by kind, logged once per interval each.
    refusals: TallyByKind<&'static str>,
}

#[derive(Debug)]
enum Role {
    Forward {
        connector: Arc<Connector>,
        pool: Option<Arc<Pool>>,
        early: Option<Arc<Early>>,
    },
    Tunnel {
        end: TunnelEnd,
        /// Ready connections to each of `end.pool_targets`.
        pools: pool::Pools,
    },
}

impl Role {
    /// What the relay is, for its log lines: `entry` (names a target to a tunnel end),
    /// `forwarder` (plain TCP) or `tunnel` (a tunnel end).
    fn kind(&self) -> &'static str {
        match self {
            Role::Forward { connector, .. } if connector.names_target() => "entry",
            Role::Forward { .. } => "forwarder",
            Role::Tunnel { .. } => "tunnel",
        }
    }
}

impl Relay {
    /// Binds the relay's listener (and, with `early_connect`, its packet socket: without
    /// CAP_NET_RAW that logs a warning and the relay connects on accept). Must be called inside
    /// a Tokio runtime.
    pub fn bind(config: &RelayConfig) -> io::Result<Self> {
        Self::from_listener(config, Self::listen(config)?)
    }

    /// The relay's listening socket alone, with its socket options set before `listen` (for a
    /// caller that keeps a table of its sockets, then [`from_listener`](Self::from_listener)).
    pub fn listen(config: &RelayConfig) -> io::Result<TcpListener> {
        let from_relays = matches!(config.role, RelayRole::Tunnel(_));
        tune::listen(config.addr, &config.options, from_relays)
    }

    /// The same as [`bind`](Self::bind) on a listener bound elsewhere (a hot restart's
    /// inherited socket). A tunnel end sets its `congestion` on the listener again, for the
    /// legs it accepts; that fails when the algorithm cannot be set here.
    pub fn from_listener(config: &RelayConfig, listener: TcpListener) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let stats = Arc::new(Stats::default());
        let opts = config.options.clone();
        let (role, pools, early) = match &config.role {
            RelayRole::Tunnel(end) => {
                // Again for a listener a hot restart handed over.
                tune::accepting_relays(&listener, &opts)?;
                let pools = pool::pools(end, &opts, &stats);
                let handles = pools.iter().map(|(_, p)| Arc::clone(p)).collect();
                let end = end.clone();
                (Role::Tunnel { end, pools }, handles, false)
            }
            RelayRole::Forward(f) => {
                let connector = Arc::new(Connector::new(f, &opts, Arc::clone(&stats)));
                let pool =
                    (f.pool > 0).then(|| Arc::new(Pool::new(f.pool, Arc::clone(&connector))));
                let early = f
                    .early_connect
                    .then(|| open_early(&config.name, addr, &opts));
                let early = early.flatten().map(Arc::new);
                let on = early.is_some();
                (
                    Role::Forward {
                        connector,
                        pool: pool.clone(),
                        early,
                    },
                    pool.into_iter().collect(),
                    on,
                )
            }
        };
        let unauthenticated = match &role {
            Role::Tunnel { end, .. } => Some(Unauthenticated::new(end.max_unauthenticated)),
            Role::Forward { .. } => None,
        };
        let kernel = config
            .options
            .sockmap
            .then(|| open_kernel(&config.name))
            .flatten();
        stats.sockmap.store(u64::from(kernel.is_some()), Relaxed);
        let handler = Arc::new(Handler {
            name: config.name.clone(),
            role,
            kernel: kernel.clone(),
            relayed: Arc::new(Semaphore::new(opts.max_connections)),
            opts,
            stats: Arc::clone(&stats),
            unauthenticated,
            refusals: TallyByKind::new(),
        });
        let followed = match &handler.role {
            Role::Forward { connector, .. } => connector.followed().cloned(),
            Role::Tunnel { .. } => None,
        };
        let handle = RelayHandle {
            name: config.name.clone(),
            addr,
            stats,
            pools,
            early,
            sockmap: kernel.is_some(),
            followed,
        };
        Ok(Self {
            name: config.name.clone(),
            listener,
            handler,
            handle,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The relay's counters and pool control.
    pub fn handle(&self) -> RelayHandle {
        self.handle.clone()
    }

    /// The listening socket, for a hot restart's hand-over.
    pub fn listener(&self) -> &TcpListener {
        &self.listener
    }

    /// Accepts and relays until `shutdown` resolves; then stops accepting (and refilling its
    /// pool), lets the connections under way finish within `grace` (as the proxy's listeners
    /// do), closes the rest, and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>, grace: Duration) {
        let (addr, mode) = (self.handle.addr, self.handler.role.kind());
        let mut helpers = JoinSet::new();
        if let Some(followed) = &self.handle.followed {
            // Before the pool fills and before clients are served: bounded by `[dns]`'s
            // timeout; clients meanwhile wait in the listener's backlog.
            next_hop::first(&self.name, followed, &self.handle.stats).await;
            let (name, stats) = (self.name.clone(), Arc::clone(&self.handle.stats));
            helpers.spawn(next_hop::follow(name, Arc::clone(followed), stats));
        }
        tracing::info!(relay = %self.name, %addr, mode, "relay listening");
        for pool in &self.handle.pools {
            let span = tracing::info_span!("pool", relay = %self.name);
            helpers.spawn(Arc::clone(pool).run().instrument(span));
        }
        if let Role::Forward {
            connector,
            pool,
            early: Some(early),
        } = &self.handler.role
        {
            helpers.spawn(Arc::clone(early).run(Arc::clone(connector), pool.clone()));
        }
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            // A forwarder accepts under `max_connections`: beyond it, clients wait in the
            // kernel's accept queue. A tunnel end accepts every connection and gives it a
            // place among those waiting for their token (`waiting`); each moves to
            // `max_connections` once its token is checked.
            let permit = match &self.handler.unauthenticated {
                Some(_) => None,
                None => {
                    let relayed = Arc::clone(&self.handler.relayed);
                    let permit = tokio::select! {
                        () = &mut shutdown => break,
                        permit = relayed.acquire_owned() => permit,
                    };
                    let Ok(permit) = permit else {
                        break;
                    };
                    Some(permit)
                }
            };
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => accepted,
            };
            while conns.try_join_next().is_some() {}
            let (client, peer) = match accepted {
                Ok(a) => a,
                Err(error) => {
                    tracing::warn!(relay = %self.name, %error, "accept failed");
                    continue;
                }
            };
            let admitted = match (permit, &self.handler.unauthenticated) {
                (Some(permit), _) => Admitted::Relayed { _slot: permit },
                (None, Some(waiting)) => {
                    // Waits only while every place is held by an authenticated connection
                    // waiting for `max_connections`.
                    let place = tokio::select! {
                        () = &mut shutdown => break,
                        place = waiting.admit(peer.ip()) => place,
                    };
                    Admitted::Waiting(place)
                }
                (None, None) => continue,
            };
            let handler = Arc::clone(&self.handler);
            let span = tracing::debug_span!("relay", relay = %self.name, client.addr = %peer);
            conns.spawn(handler.serve(client, peer, admitted).instrument(span));
        }
        drop(self.listener);
        helpers.shutdown().await;
        let open = conns.len();
        tracing::info!(relay = %self.name, open, ?grace, "relay stopped accepting; draining connections");
        let all_done = async { while conns.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, all_done).await.is_err() {
            tracing::warn!(relay = %self.name, left = conns.len(), "grace period over; closing remaining relayed connections");
            conns.shutdown().await;
        }
    }
}

/// What an accepted connection counts under.
#[derive(Debug)]
enum Admitted {
    /// A forwarder's: a `max_connections` slot, held while the connection lasts.
    Relayed { _slot: OwnedSemaphorePermit },
    /// A tunnel end's: a place among the connections waiting for their token.
    Waiting(waiting::Place),
}

impl Handler {
    /// Serves one accepted connection, holding what it was `admitted` under while it counts.
    async fn serve(self: Arc<Self>, client: TcpStream, peer: SocketAddr, admitted: Admitted) {
        self.stats.accepted.fetch_add(1, Relaxed);
        self.stats.active.fetch_add(1, Relaxed);
        if let Err(error) = tune::accepted(&client, &self.opts) {
            tracing::debug!(%error, "socket options on the client socket");
        }
        let result = match (&self.role, admitted) {
            (
                Role::Forward {
                    connector,
                    pool,
                    early,
                },
                admitted,
            ) => {
                let _admitted = admitted;
                self.forward(&client, peer, connector, pool.as_deref(), early.as_deref())
                    .await
            }
            (Role::Tunnel { end, pools }, Admitted::Waiting(place)) => {
                self.tunnel(&client, peer, end, pools, place).await
            }
            // A tunnel end admits every connection to its waiting places.
            (Role::Tunnel { .. }, Admitted::Relayed { .. }) => Ok(()),
        };
        if let Err(error) = result {
            tracing::debug!(%error, "relayed connection ended");
        }
        self.stats.active.fetch_sub(1, Relaxed);
        drop(client);
    }

    /// A tunnel end's connection: `place` is its place until its token is checked.
    async fn tunnel(
        &self,
        client: &TcpStream,
        peer: SocketAddr,
        end: &TunnelEnd,
        pools: &pool::Pools,
        place: waiting::Place,
    ) -> io::Result<()> {
        let admission = tunnel::Admission {
            place,
            relayed: &self.relayed,
        };
        let pooled = |target| pool::take_for(pools, target);
        let ctx = tunnel::Context {
            opts: &self.opts,
            stats: &self.stats,
            kernel: self.kernel.as_ref(),
        };
        tunnel::serve(client, (end, &pooled), ctx, admission)
            .await
            .map_err(|e| {
                if let Some(kind) = e.refusal() {
                    self.stats.refused.fetch_add(1, Relaxed);
                    self.log_refusal(kind, &e, peer);
                }
                io::Error::other(e.to_string())
            })
    }

    /// A refusal leaves a line, once per interval for each kind, with how many since its
    /// last: at warn for a wrong token or target (a peer relay misconfigured, or someone
    /// guessing), at info for bytes that are no preamble at all (scanners) and for connections
    /// closed still waiting for their token when newer ones needed their place (a flood).
    fn log_refusal(&self, kind: &'static str, e: &tunnel::Refused, peer: SocketAddr) {
        let Some(refused) = self.refusals.record(kind) else {
            return;
        };
        match e {
            tunnel::Refused::Malformed(_) | tunnel::Refused::Shed => {
                tracing::info!(relay = %self.name, error = %e, peer.addr = %peer, refused, "tunnel connections refused (count since the last such line)");
            }
            _ => {
                tracing::warn!(relay = %self.name, error = %e, peer.addr = %peer, refused, "tunnel connections refused (count since the last such line)");
            }
        }
    }

    async fn forward(
        &self,
        client: &TcpStream,
        peer: SocketAddr,
        connector: &Connector,
        pool: Option<&Pool>,
        early: Option<&Early>,
    ) -> io::Result<()> {
        let claimed = match early {
            Some(early) => early.claim(peer).await,
            None => None,
        };
        let upstream = match claimed {
            Some(conn) => conn,
            None => connector.for_client(pool.and_then(Pool::take)).await,
        };
        let upstream = upstream.inspect_err(|error| {
            self.stats.refused.fetch_add(1, Relaxed);
            tracing::info!(to = %connector.to, %error, "next hop unreachable");
        })?;
        forward::relay(
            client,
            &upstream,
            (forward::Mode::of(&self.opts), self.kernel.as_ref()),
            self.opts.idle_timeout,
            &self.stats,
        )
        .await
    }
}

/// The process's sockmap program, or says why not (once per relay) and returns `None`.
fn open_kernel(name: &str) -> Option<Arc<sockmap::Kernel>> {
    match sockmap::kernel() {
        Ok(kernel) => Some(kernel),
        Err(error) => {
            tracing::warn!(relay = %name, %error, "sockmap is off: cannot load the BPF program (needs CAP_BPF and CAP_NET_ADMIN, or root, and a kernel with CONFIG_BPF_STREAM_PARSER); forwarding in user space");
            None
        }
    }
}

/// Opens the early-connect packet socket, or says why not and returns `None`.
fn open_early(name: &str, addr: SocketAddr, opts: &RelayOptions) -> Option<Early> {
    match Early::open(addr, opts.connect_timeout * 2) {
        Ok(early) => Some(early),
        Err(error) => {
            tracing::warn!(relay = %name, %error, "early_connect is off: cannot watch for SYNs (needs CAP_NET_RAW and an IPv4 listener); connecting on accept");
            None
        }
    }
}
