//! Names that follow DNS: the resolver's settings (`[dns]`) and a static cluster's `resolve`.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// How endpoint names of clusters with `resolve` are looked up (`[dns]`). The default reads
/// `/etc/resolv.conf` (its nameservers, search domains, `ndots`, `timeout`, `attempts`) and
/// `/etc/hosts` afresh for every lookup, as glibc does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    /// The nameservers asked, in order (UDP, and TCP for answers too long for UDP); empty
    /// (the default): `/etc/resolv.conf`'s. `/etc/hosts` is read first either way.
    pub nameservers: Vec<SocketAddr>,
    /// How long one query waits for an answer; `None` (the default): `/etc/resolv.conf`'s
    /// `options timeout:`, else 5 s.
    pub timeout: Option<Duration>,
}

/// A static cluster's `resolve`: its endpoint names are resolved when the proxy starts and
/// again whenever their records' TTL runs out, kept within these bounds; addresses that
/// appear join the balancer, addresses that disappear are drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolve {
    /// A record's TTL below this counts as this (a TTL of 0 would ask on every tick).
    /// Default 1 s, at least 100 ms.
    pub min_ttl: Duration,
    /// A record's TTL above this counts as this, so that a long-lived record is still checked
    /// now and then. Default 5 min.
    pub max_ttl: Duration,
}

impl Default for Resolve {
    fn default() -> Self {
        Self {
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(300),
        }
    }
}

/// An endpoint given by name: `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPort {
    /// The DNS name.
    pub host: String,
    /// The port every address of the name is reached on.
    pub port: u16,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}
