//! `[[relay]]`: the validated split-TCP relays (docs/design.md §7).

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use sluice_session::Token;

use super::dns::{Dns, HostPort, Resolve};

/// One relay (`[[relay]]`): where it listens, what it is, and its socket settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Relay {
    /// Unique name, used in logs and metrics.
    pub name: String,
    /// The address clients (or the previous relay) connect to.
    pub addr: SocketAddr,
    /// An entry relay forwarding to a next hop, or a tunnel end.
    pub role: RelayRole,
    /// Timeouts, limits and socket tuning.
    pub options: RelayOptions,
}

/// What a relay does with an accepted connection.
#[derive(Debug, Clone, PartialEq)]
pub enum RelayRole {
    /// Forwards to `to`, naming a target to a tunnel end there when `tunnel` is set.
    Forward(Forward),
    /// A tunnel end (`tunnel = true`): authenticates the preamble and connects to the target
    /// it names, if `allow` lets it.
    Tunnel(TunnelEnd),
}

/// An entry (or middle) relay: `to`, `resolve`, `target`, `token`, `pool`, `early_connect`.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// The next hop.
    pub to: NextHop,
    /// The target to name to the tunnel end at `to`, with the token that authenticates this
    /// relay; `None`: a plain TCP forwarder to `to`.
    pub tunnel: Option<TunnelTarget>,
    /// Connections to `to` kept established (and authenticated) ahead of clients. Default 0.
    pub pool: usize,
    /// Starts the next leg when a client's SYN is seen rather than when `accept` returns.
    /// Default false; needs CAP_NET_RAW (without it, the relay logs once and connects on
    /// accept).
    pub early_connect: bool,
}

/// A relay's next hop: `to = "IP:port"`, or `"host:port"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextHop {
    /// Fixed addresses, tried in turn: an `IP:port`, or a name without `resolve`, looked up
    /// once when the configuration loads (as a static cluster's endpoint names are).
    Addrs(Vec<SocketAddr>),
    /// A name with `resolve`: the relay looks it up when it starts and again whenever its
    /// records' TTL (within the bounds) runs out; new connections go to the addresses it has
    /// then, connections already relayed finish where they are.
    Follow {
        /// The name and its port.
        name: HostPort,
        /// How long an answer holds.
        resolve: Resolve,
        /// Where it is looked up: the file's `[dns]`.
        dns: Dns,
    },
}

impl std::fmt::Display for NextHop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Addrs(addrs) => match addrs.as_slice() {
                [one] => write!(f, "{one}"),
                many => write!(f, "{many:?}"),
            },
            Self::Follow { name, .. } => write!(f, "{name}"),
        }
    }
}

/// The target an entry relay names to a tunnel end, and its credentials.
#[derive(Debug, Clone, PartialEq)]
pub struct TunnelTarget {
    /// The address the tunnel end is asked to connect to.
    pub target: SocketAddr,
    /// The token the tunnel end checks (already resolved from `env:`/`file:`).
    pub token: Token,
}

/// A tunnel end: `tokens`, `allow`, and the bounds on peers not yet authenticated.
#[derive(Debug, Clone, PartialEq)]
pub struct TunnelEnd {
    /// Any one of these authenticates a peer relay.
    pub tokens: Vec<Token>,
    /// The only targets it connects to.
    pub allow: Vec<AllowedTarget>,
    /// How long a new connection may take to present its token (an entry relay sends it as
    /// soon as it connects); then it is closed. Default 2 s.
    pub preamble_timeout: Duration,
    /// Connections still waiting for their token, at once: beyond it, a new connection takes
    /// the place of one still waiting — the oldest of the address (IPv4, or IPv6 /64) holding
    /// the most — which is closed, so a flood of silent connections cannot make honest ones
    /// wait. They do not count towards `max_connections`. Default 1024.
    pub max_unauthenticated: usize,
    /// Fixed targets (each inside `allow`) to which `pool` connections each are kept
    /// established, so a client's last leg costs no handshake either. Default: none.
    pub pool_targets: Vec<SocketAddr>,
    /// Connections kept to each of `pool_targets`; 0 with no targets.
    pub pool: usize,
}

impl TunnelEnd {
    /// The default `preamble_timeout`.
    pub const DEFAULT_PREAMBLE_TIMEOUT: Duration = Duration::from_secs(2);
    /// The default `max_unauthenticated`.
    pub const DEFAULT_MAX_UNAUTHENTICATED: usize = 1024;
}

/// One `allow` entry: a network and a port (`"10.3.0.0/24:8000"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowedTarget {
    /// The addresses allowed.
    pub net: IpNet,
    /// The one port allowed on them.
    pub port: u16,
}

impl AllowedTarget {
    /// Whether `addr` (IPv4-mapped IPv6 taken as IPv4, as the relay matches it) is inside.
    pub fn allows(&self, addr: SocketAddr) -> bool {
        addr.port() == self.port && self.net.contains(&addr.ip().to_canonical())
    }
}

/// A relay's timeouts, limits and socket settings. `Default` gives the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayOptions {
    /// How long a connect to the next hop (or target) may take. Default 5 s.
    pub connect_timeout: Duration,
    /// How long a relayed connection (or a pooled one at the tunnel end) may stay without a
    /// byte in either direction. Default 5 min.
    pub idle_timeout: Duration,
    /// Client connections relayed at once (at a tunnel end: authenticated ones); more wait
    /// in the kernel's accept queue. Default 10 000.
    pub max_connections: usize,
    /// `TCP_NODELAY` on both sockets. Default true.
    pub nodelay: bool,
    /// `TCP_CONGESTION` for the sockets towards the next hop (`"bbr"`, `"reno"`, …); `None`
    /// (the default): the namespace's default.
    pub congestion: Option<String>,
    /// `SO_SNDBUF`/`SO_RCVBUF` of both sockets; `None` (the default): the kernel autotunes.
    pub socket_buffer: Option<usize>,
    /// Forwards with `splice(2)` through a pipe (Linux), falling back to a copy through a
    /// 64 KiB buffer where splice fails. Default true.
    pub splice: bool,
    /// Lets the kernel forward the bytes through a BPF sockmap (no copy, no syscall per chunk):
    /// needs CAP_BPF and CAP_NET_ADMIN (or root) and a build with the `sockmap` feature; without
    /// them the relay logs why once and forwards as `splice` says. Default false.
    pub sockmap: bool,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(300),
            max_connections: 10_000,
            nodelay: true,
            congestion: None,
            socket_buffer: None,
            splice: true,
            sockmap: false,
        }
    }
}
