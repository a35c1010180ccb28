//! A relay's own settings: plain values, so the crate is used and tested without the TOML
//! model (the application converts its configuration into them). They have no `Default`: the
//! defaults are the configuration's, documented there.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use sluice_net::dns::{Dns, HostPort, Resolve};
use sluice_session::Token;

/// One relay: where it listens, what it is, and its socket settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayConfig {
    /// Its name, in logs and metrics.
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
    /// Forwards to a next hop, naming a target to a tunnel end there or not.
    Forward(Forward),
    /// Authenticates the preamble and connects to the target it names, if allowed.
    Tunnel(TunnelEnd),
}

/// An entry (or middle) relay.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// The next hop.
    pub to: NextHop,
    /// The target to name to the tunnel end at `to`, and the token that opens it; `None`: a
    /// plain TCP forwarder to `to`.
    pub tunnel: Option<TunnelTarget>,
    /// Connections to `to` kept established (and authenticated) ahead of clients; 0: none.
    pub pool: usize,
    /// Starts the next leg when a client's SYN is seen rather than when `accept` returns
    /// (needs CAP_NET_RAW; without it the relay logs once and connects on accept).
    pub early_connect: bool,
}

/// Where an entry relay's next hop is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextHop {
    /// Fixed addresses; each new connection tries them in turn from the next one on.
    Addrs(Vec<SocketAddr>),
    /// A name the relay looks up when it starts and again whenever its answer's TTL (within
    /// `resolve`'s bounds) runs out, asking `dns`: new connections go to the addresses it has
    /// then, connections already relayed finish where they are, and a failed lookup keeps the
    /// last addresses.
    Follow {
        /// The name and its port.
        name: HostPort,
        /// How long an answer holds.
        resolve: Resolve,
        /// Where it is looked up.
        dns: Dns,
    },
}

impl From<SocketAddr> for NextHop {
    fn from(addr: SocketAddr) -> Self {
        Self::Addrs(vec![addr])
    }
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
    /// The token the tunnel end checks (1 to 255 bytes).
    pub token: Token,
}

/// A tunnel end: who may use it, where to, and the bounds on peers not yet authenticated.
#[derive(Debug, Clone, PartialEq)]
pub struct TunnelEnd {
    /// Any one of these authenticates a peer relay.
    pub tokens: Vec<Token>,
    /// The only targets it connects to.
    pub allow: Vec<AllowedTarget>,
    /// How long a new connection may take to present its token; then it is closed.
    pub preamble_timeout: Duration,
    /// Connections still waiting for their token, at once; more wait in the kernel's accept
    /// queue. They do not count towards `max_connections`.
    pub max_unauthenticated: usize,
    /// Targets (each inside `allow`) to which `pool` connections each are kept established,
    /// so that a client's last leg costs no handshake either.
    pub pool_targets: Vec<SocketAddr>,
    /// Connections kept to each of `pool_targets`.
    pub pool: usize,
}

/// One `allow` entry: a network and a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowedTarget {
    /// The addresses allowed.
    pub net: IpNet,
    /// The one port allowed on them.
    pub port: u16,
}

impl AllowedTarget {
    /// Whether `addr` is inside this entry. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is
    /// matched as the IPv4 address it names, so an IPv6 range never lets one reach an IPv4
    /// service that no IPv4 entry allows.
    pub fn allows(&self, addr: SocketAddr) -> bool {
        addr.port() == self.port && self.net.contains(&addr.ip().to_canonical())
    }
}

/// A relay's timeouts, limits and socket settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayOptions {
    /// How long a connect to the next hop (or target) may take.
    pub connect_timeout: Duration,
    /// How long a relayed connection (or a pooled one at the tunnel end) may stay without a
    /// byte in either direction.
    pub idle_timeout: Duration,
    /// Client connections relayed at once (at a tunnel end: authenticated ones); more wait
    /// in the kernel's accept queue.
    pub max_connections: usize,
    /// `TCP_NODELAY` on both sockets.
    pub nodelay: bool,
    /// `TCP_CONGESTION` on the sockets a relay connects (to its next hop, or a tunnel end's
    /// targets) and on those a tunnel end accepts (legs from relays, which carry the answers
    /// back); `None`: the namespace's default.
    pub congestion: Option<String>,
    /// `SO_SNDBUF`/`SO_RCVBUF` of both sockets; `None`: the kernel autotunes.
    pub socket_buffer: Option<usize>,
    /// Forwards with `splice(2)` through a pipe, falling back to a copy through a 64 KiB
    /// buffer where splice fails; false: always the copy.
    pub splice: bool,
    /// Lets the kernel forward the bytes (a BPF sockmap: no copy, no syscall per chunk), where
    /// its program can be loaded (CAP_BPF and CAP_NET_ADMIN, the `sockmap` feature); else the
    /// relay logs why once and forwards as `splice` says.
    pub sockmap: bool,
}

#[cfg(test)]
mod tests {
    use super::AllowedTarget;

    fn allowed(net: &str, port: u16) -> AllowedTarget {
        let net = net.parse().expect("net");
        AllowedTarget { net, port }
    }

    #[test]
    fn an_entry_allows_its_network_on_its_port() {
        let a = allowed("10.3.0.0/24", 8000);
        assert!(a.allows("10.3.0.7:8000".parse().expect("addr")));
        assert!(!a.allows("10.3.0.7:8001".parse().expect("addr")));
        assert!(!a.allows("10.3.1.7:8000".parse().expect("addr")));
        let v6 = allowed("2001:db8::/32", 443);
        assert!(v6.allows("[2001:db8::1]:443".parse().expect("addr")));
    }

    #[test]
    fn an_ipv4_mapped_target_is_matched_as_ipv4() {
        let mapped = "[::ffff:127.0.0.1]:18721".parse().expect("addr");
        let any_v6 = allowed("::/0", 18721);
        assert!(
            !any_v6.allows(mapped),
            "an IPv6 range reached an IPv4 target"
        );
        let v4 = allowed("127.0.0.1/32", 18721);
        assert!(v4.allows(mapped), "the IPv4 entry for the same address");
        assert!(any_v6.allows("[::1]:18721".parse().expect("addr")));
    }
}
