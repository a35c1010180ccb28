//! Looking up the endpoint names of static clusters with `resolve`, with hickory-resolver.
//!
//! Every lookup builds its resolver afresh: it reads `/etc/resolv.conf` (or takes `[dns]`'s
//! nameservers) and `/etc/hosts` again, as glibc does, and it has no cache, so an answer is
//! never older than its record's TTL says (the cluster itself waits out the TTL before it asks
//! again). A handful of lookups per name and TTL cost nothing next to a stale address set.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::{ResolverBuilder, TokioResolver};

/// Where and how names are looked up: `[dns]` as the runtime takes it. The default asks
/// `/etc/resolv.conf`'s nameservers, after `/etc/hosts`.
#[derive(Debug, Clone, Default)]
pub struct Dns {
    nameservers: Vec<SocketAddr>,
    timeout: Option<Duration>,
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
    /// The `result` label of `upstream_dns_resolutions`.
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
    /// The resolver `[dns]` describes.
    pub fn from_config(cfg: &sluice_config::Dns) -> Self {
        Self {
            nameservers: cfg.nameservers.clone(),
            timeout: cfg.timeout,
        }
    }

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
