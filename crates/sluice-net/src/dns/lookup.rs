//! One lookup ([`Dns::lookup`]) and what it gives; how long an answer holds ([`Resolve`]); a
//! name to follow ([`HostPort`]).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::{ResolverBuilder, TokioResolver};

/// How names that follow DNS are looked up (`[dns]`). The default reads `/etc/resolv.conf`
/// (its nameservers, search domains, `ndots`, `timeout`, `attempts`) and `/etc/hosts` afresh for
/// every lookup, as glibc does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    /// The nameservers asked, in order (UDP, and TCP for answers too long for UDP); empty
    /// (the default): `/etc/resolv.conf`'s. `/etc/hosts` is read first either way.
    pub nameservers: Vec<SocketAddr>,
    /// How long one query waits for an answer; `None` (the default): `/etc/resolv.conf`'s
    /// `options timeout:`, else 5 s.
    pub timeout: Option<Duration>,
}

/// After a failed lookup the next comes `min_ttl` later, doubling per failure up to this (or
/// `max_ttl`, when shorter).
const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(30);

/// A name that follows DNS (a static cluster's or a relay's `resolve`): it is resolved when the
/// process starts and again whenever its records' TTL runs out, kept within these bounds.
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

impl Resolve {
    /// How long a good answer holds: its TTL within the bounds.
    pub fn hold(&self, ttl: Duration) -> Duration {
        ttl.clamp(self.min_ttl, self.max_ttl)
    }

    /// How long until the lookup after `failures` failed ones in a row: `min_ttl`, doubling per
    /// failure, up to 30 s (or `max_ttl`, when shorter).
    pub fn backoff(&self, failures: u32) -> Duration {
        let cap = self.max_ttl.min(MAX_FAILURE_BACKOFF);
        let doubled = (self.min_ttl).saturating_mul(1 << failures.saturating_sub(1).min(16));
        doubled.min(cap).max(self.min_ttl)
    }
}

/// A name to follow: `host:port`.
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

/// A name's addresses, and how long the answer may be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// IPv4 addresses first, then IPv6 ones (A and AAAA are both asked for).
    pub addrs: Vec<IpAddr>,
    /// The smallest TTL among the records (`/etc/hosts` entries: no limit).
    pub ttl: Duration,
}

/// Why a lookup gave no addresses. Each keeps the name's last known addresses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// The name does not exist (NXDOMAIN).
    #[error("no such name (NXDOMAIN)")]
    NoSuchName,
    /// The name exists but has no A or AAAA records.
    #[error("the name has no A or AAAA records")]
    NoRecords,
    /// No nameserver answered in time.
    #[error("no nameserver answered in time")]
    Timeout,
    /// Anything else: a refusal, SERVFAIL, an unreadable `/etc/resolv.conf`, …
    #[error("{0}")]
    Other(String),
}

impl LookupError {
    /// The `result` label of the lookup counters (`ok` is a good answer).
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoSuchName => "nxdomain",
            Self::NoRecords => "no_records",
            Self::Timeout => "timeout",
            Self::Other(_) => "error",
        }
    }

    fn from_net(e: &NetError) -> Self {
        if e.is_nx_domain() {
            Self::NoSuchName
        } else if e.is_no_records_found() {
            Self::NoRecords
        } else if matches!(e, NetError::Timeout) {
            Self::Timeout
        } else {
            Self::Other(e.to_string())
        }
    }
}

impl Dns {
    /// Looks `host` up (A and AAAA).
    pub async fn lookup(&self, host: &str) -> Result<Resolved, LookupError> {
        let resolver = self.resolver()?;
        let asked = Instant::now();
        let found = resolver.lookup_ip(host).await;
        let found = found.map_err(|e| LookupError::from_net(&e))?;
        let mut addrs: Vec<IpAddr> = found.iter().collect();
        addrs.sort_by_key(IpAddr::is_ipv6);
        addrs.dedup();
        if addrs.is_empty() {
            return Err(LookupError::NoRecords);
        }
        let ttl = found.valid_until().saturating_duration_since(asked);
        Ok(Resolved { addrs, ttl })
    }

    fn resolver(&self) -> Result<TokioResolver, LookupError> {
        let mut builder = self.builder()?;
        let opts = builder.options_mut();
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        // The cluster waits out each answer's TTL itself; a cache could only hand back an
        // answer the cluster already has.
        opts.cache_size = 0;
        if let Some(timeout) = self.timeout {
            opts.timeout = timeout;
        }
        builder
            .build()
            .map_err(|e| LookupError::Other(e.to_string()))
    }

    fn builder(&self) -> Result<ResolverBuilder<TokioRuntimeProvider>, LookupError> {
        if self.nameservers.is_empty() {
            let read = TokioResolver::builder_tokio();
            return read.map_err(|e| LookupError::Other(format!("/etc/resolv.conf: {e}")));
        }
        let servers = self.nameservers.iter().map(|ns| {
            let connection = |mut c: ConnectionConfig| {
                c.port = ns.port();
                c
            };
            let both = vec![
                connection(ConnectionConfig::udp()),
                connection(ConnectionConfig::tcp()),
            ];
            NameServerConfig::new(ns.ip(), true, both)
        });
        let config = ResolverConfig::from_name_servers(servers.collect());
        Ok(TokioResolver::builder_with_config(
            config,
            TokioRuntimeProvider::default(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(min: u64, max: u64) -> Resolve {
        Resolve {
            min_ttl: Duration::from_millis(min),
            max_ttl: Duration::from_millis(max),
        }
    }

    #[test]
    fn an_answer_holds_for_its_ttl_within_the_bounds() {
        let b = bounds(1_000, 60_000);
        assert_eq!(b.hold(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(b.hold(Duration::from_secs(20)), Duration::from_secs(20));
        assert_eq!(b.hold(Duration::from_secs(86_400)), Duration::from_secs(60));
    }

    #[test]
    fn failed_lookups_back_off_from_the_floor_to_a_cap() {
        let b = bounds(1_000, 300_000);
        let secs: Vec<u64> = (1..=7).map(|n| b.backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(
            bounds(100, 500).backoff(40),
            Duration::from_millis(500),
            "max_ttl caps it"
        );
    }
}
