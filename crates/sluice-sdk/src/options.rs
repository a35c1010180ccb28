//! [`Options`]: where the acceptor is, who this instance is, and how hard to try.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use sluice_session::{Address, Identity, MAX_STREAMS};

use crate::error::Error;
use crate::resolve::Resolver;

/// Where the proxy's acceptor listens: one acceptor, or many nodes (`protocol/README.md`,
/// "Many nodes"), among which the capacity is split by demand. There is no default: an SDK
/// must be told.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acceptor {
    /// One acceptor at a TCP address, `host:port` or `ip:port`, resolved again on every
    /// dial; no control link.
    Tcp(String),
    /// One acceptor at a UNIX stream socket path.
    Unix(PathBuf),
    /// `dns:NAME:PORT`: a node at every A and AAAA record of `name` (a Kubernetes headless
    /// Service), re-resolved every [`Options::resolve_interval`].
    Dns {
        /// The name to resolve.
        name: String,
        /// The acceptor port on every node.
        port: u16,
    },
    /// `a:7070,b:7070`: a node at each entry (`host:port`), and one per address an entry's
    /// name resolves to. A list of one entry is one node with a control link.
    List(Vec<String>),
}

impl Acceptor {
    /// What a many-node acceptor asks to resolve: `(host, port)` per name or list entry, in order.
    /// `None` for one acceptor.
    pub(crate) fn names(&self) -> Option<Vec<(String, u16)>> {
        match self {
            Acceptor::Dns { name, port } => Some(vec![(name.clone(), *port)]),
            Acceptor::List(all) => Some(all.iter().filter_map(|e| host_port(e)).collect()),
            _ => None,
        }
    }

    /// Reads an acceptor address as the protocol writes it: `host:port` (one acceptor),
    /// `unix:PATH`, `dns:NAME:PORT` or a comma list `a:7070,b:7070` (many nodes).
    pub fn parse(text: &str) -> Result<Self, Error> {
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(Acceptor::Unix(path.into()));
        }
        match Address::parse(text).map_err(|e| Error::Config(e.to_string()))? {
            Address::Single(addr) => Ok(Acceptor::Tcp(addr)),
            Address::Dns { name, port } => Ok(Acceptor::Dns { name, port }),
            Address::List(all) => Ok(Acceptor::List(all)),
        }
    }

    /// Whether the address names many nodes: control links, and the capacity split by demand.
    pub fn is_many(&self) -> bool {
        matches!(self, Acceptor::Dns { .. } | Acceptor::List(_))
    }

    /// Rejects an address that names no node, before any dial.
    fn validate(&self) -> Result<(), Error> {
        let entries = match self {
            Acceptor::Tcp(_) | Acceptor::Unix(_) => return Ok(()),
            Acceptor::Dns { .. } => vec![self.to_string()],
            Acceptor::List(all) if all.is_empty() => {
                return Err(Error::Config("the acceptor list is empty".into()))
            }
            Acceptor::List(all) => all.clone(),
        };
        for entry in entries {
            let parsed = Address::parse(&entry).map_err(|e| Error::Config(e.to_string()))?;
            if matches!(parsed, Address::List(_)) || entry.contains(',') {
                return Err(Error::Config(format!(
                    "acceptor list entry {entry:?} holds a comma"
                )));
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for Acceptor {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        Acceptor::parse(text)
    }
}

impl From<SocketAddr> for Acceptor {
    fn from(addr: SocketAddr) -> Self {
        Acceptor::Tcp(addr.to_string())
    }
}

impl std::fmt::Display for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Acceptor::Tcp(addr) => f.write_str(addr),
            Acceptor::Unix(path) => write!(f, "unix:{}", path.display()),
            Acceptor::Dns { name, port } => write!(f, "dns:{name}:{port}"),
            Acceptor::List(all) => f.write_str(&all.join(",")),
        }
    }
}

/// TLS to the acceptor; without it (the default) sessions are plaintext.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// The rustls client configuration (roots, client certificate for mTLS, ALPN: none needed).
    pub config: Arc<rustls::ClientConfig>,
    /// The name the acceptor's certificate must carry; with many nodes, every node's
    /// certificate (one name for the fleet, e.g. the `dns:` name).
    pub server_name: ServerName<'static>,
}

/// Jittered exponential backoff between failed dials.
/// Default: 100 ms doubling up to 5 s, each delay shortened by up to half at random.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay; default 100 ms.
    pub initial: Duration,
    /// The longest delay; default 5 s.
    pub max: Duration,
    /// The fraction of each delay taken off at random, 0.0 to 1.0; default 0.5. Jitter keeps
    /// many instances from re-dialing a restarted proxy in lockstep.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based): `initial * 2^attempt`, capped at
    /// `max`, less a random share of up to `jitter`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(31));
        let base = self.initial.saturating_mul(factor).min(self.max);
        base.saturating_sub(base.mul_f64(self.jitter * fastrand::f64()))
    }
}

/// Everything [`serve`](crate::serve) needs besides the service.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to dial.
    pub acceptor: Acceptor,
    /// Who this instance is (service, slice, instance id, token).
    pub identity: Identity,
    /// How many sessions to keep registered; default 1.
    pub capacity: usize,
    /// `Some(n)`: every session speaks HTTP/2 after its `101` and takes `n` requests at once
    /// (1 to 1000; `protocol/README.md`, "HTTP/2 sessions"), for a service whose server is an
    /// HTTP/2 one, such as a gRPC (tonic) service. The instance then takes `capacity × n`
    /// requests at once; `capacity` still counts sessions. An acceptor that does not take
    /// HTTP/2 sessions stops the slots with [`Error::Http2Unsupported`]. Default `None`:
    /// HTTP/1.1, one request at a time per session.
    pub streams: Option<u32>,
    /// TLS to the acceptor; default `None` (plaintext).
    pub tls: Option<TlsOptions>,
    /// Delays between failed dials; default [`Backoff::default`].
    pub backoff: Backoff,
    /// Limit on connecting plus the registration (or drain) answer; default 5 s. With many
    /// nodes, also the longest the first sessions wait for every node first resolved to
    /// answer its control link.
    pub handshake_timeout: Duration,
    /// While an operator holds the instance drained (`410`), one registration probes this
    /// often whether it was resumed; default 30 s.
    pub drained_probe: Duration,
    /// Many nodes: how often the names are resolved again (nodes join and leave); default
    /// 10 s (the system resolver does not expose TTLs). A node lost (its link ended, or it
    /// went down) makes them resolve again after 1, 2, 4, … s up to it.
    pub resolve_interval: Duration,
    /// Many nodes: how long a node's control link may be lost (silent, timing out, or
    /// restarting hot, which keeps its sessions) before the node counts as down and its share
    /// moves to the others; default 5 s. A node whose link ended and which then refuses a
    /// connection is down at once.
    pub node_grace: Duration,
    /// Many nodes: how names become addresses; default the system resolver. Tests inject
    /// their own.
    pub resolver: Resolver,
}

impl Options {
    /// Options for `identity` at `acceptor`, with 1 HTTP/1.1 session, no TLS and the default
    /// backoff and handshake timeout.
    pub fn new(acceptor: impl Into<Acceptor>, identity: Identity) -> Self {
        Self {
            acceptor: acceptor.into(),
            identity,
            capacity: 1,
            streams: None,
            tls: None,
            backoff: Backoff::default(),
            handshake_timeout: Duration::from_secs(5),
            drained_probe: Duration::from_secs(30),
            resolve_interval: Duration::from_secs(10),
            node_grace: Duration::from_secs(5),
            resolver: Resolver::system(),
        }
    }

    /// Rejects options that could never register, before any dial.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let id = &self.identity;
        if id.service.is_empty() {
            return Err(Error::Config("identity.service is empty".into()));
        }
        header_value("identity.service", &id.service)?;
        header_value("identity.slice", &id.slice)?;
        if let Some(instance) = &id.instance {
            header_value("identity.instance", instance)?;
        }
        if let Some(token) = &id.token {
            header_value("identity.token", token)?;
        }
        if let Some(n) = self.streams {
            if !(1..=MAX_STREAMS).contains(&n) {
                return Err(Error::Config(format!(
                    "streams must be from 1 to {MAX_STREAMS}, not {n}"
                )));
            }
        }
        self.acceptor.validate()?;
        self.validate_timing()
    }

    fn validate_timing(&self) -> Result<(), Error> {
        let b = &self.backoff;
        if b.initial.is_zero() || b.initial > b.max {
            return Err(Error::Config(
                "backoff.initial must be positive and at most backoff.max".into(),
            ));
        }
        if !(0.0..=1.0).contains(&b.jitter) {
            return Err(Error::Config(
                "backoff.jitter must be within 0.0..=1.0".into(),
            ));
        }
        if self.handshake_timeout.is_zero() {
            return Err(Error::Config("handshake_timeout must be positive".into()));
        }
        let positive = [
            ("drained_probe", self.drained_probe),
            ("resolve_interval", self.resolve_interval),
            ("node_grace", self.node_grace),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, d)| d.is_zero()) {
            return Err(Error::Config(format!("{name} must be positive")));
        }
        Ok(())
    }
}

/// Each identity field becomes a header value: visible ASCII only, so none can inject a line.
fn header_value(field: &str, value: &str) -> Result<(), Error> {
    if value.bytes().all(|b| b.is_ascii_graphic() || b == b' ') && value.trim() == value {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{field} must be visible ASCII without leading or trailing spaces"
        )))
    }
}

/// `host:port` or `[v6]:port` (already validated by the options).
fn host_port(entry: &str) -> Option<(String, u16)> {
    let (host, port) = entry.trim().rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host.to_owned(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn list_entries_and_dns_names_become_names_to_resolve() {
        let list = Acceptor::List(vec!["a:1".into(), "[::1]:2".into(), "10.0.0.1:3".into()]);
        let want = [("a", 1), ("::1", 2), ("10.0.0.1", 3)].map(|(h, p)| (h.to_owned(), p));
        assert_eq!(list.names(), Some(want.to_vec()));
        let dns = Acceptor::Dns {
            name: "nodes.test".into(),
            port: 7070,
        };
        assert_eq!(dns.names(), Some(vec![("nodes.test".into(), 7070)]));
        assert_eq!(Acceptor::Tcp("a:1".into()).names(), None);
    }

    #[test]
    fn delays_double_up_to_max_and_jitter_only_shortens() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            jitter: 0.5,
        };
        for (attempt, base) in [(0, 100), (1, 200), (3, 800), (4, 1000), (40, 1000)] {
            let base = Duration::from_millis(base);
            for _ in 0..50 {
                let d = b.delay(attempt);
                assert!(d <= base && d >= base / 2, "{attempt}: {d:?}");
            }
        }
    }

    #[test]
    fn invalid_identities_and_timings_are_rejected() {
        let ok = Options::new(Acceptor::Tcp("127.0.0.1:1".into()), Identity::new("svc"));
        assert!(ok.validate().is_ok());
        let mut bad = ok.clone();
        bad.identity.service = String::new();
        assert!(bad.validate().is_err());
        let mut bad = ok.clone();
        bad.identity.token = Some("t\r\nX-Evil: 1".into());
        assert!(bad.validate().is_err());
        let mut bad = ok.clone();
        bad.backoff.jitter = 2.0;
        assert!(bad.validate().is_err());
        let mut bad = ok.clone();
        bad.handshake_timeout = Duration::ZERO;
        assert!(bad.validate().is_err());
        let mut bad = ok.clone();
        bad.node_grace = Duration::ZERO;
        assert!(bad.validate().is_err());
        for streams in [0, MAX_STREAMS + 1] {
            let mut bad = ok.clone();
            bad.streams = Some(streams);
            assert!(bad.validate().is_err(), "{streams}");
        }
        for streams in [1, MAX_STREAMS] {
            let mut good = ok.clone();
            good.streams = Some(streams);
            assert!(good.validate().is_ok(), "{streams}");
        }
        let mut bad = ok.clone();
        bad.acceptor = Acceptor::List(vec![]);
        assert!(bad.validate().is_err());
        let mut bad = ok;
        bad.acceptor = Acceptor::List(vec!["a:1".into(), "b".into()]);
        assert!(bad.validate().is_err());
    }

    #[test]
    fn addresses_parse_to_one_acceptor_or_many_nodes() {
        let one = Acceptor::parse("sluice:7070").unwrap();
        assert_eq!(one, Acceptor::Tcp("sluice:7070".into()));
        assert!(!one.is_many());
        assert_eq!(
            Acceptor::parse("unix:/run/s.sock").unwrap(),
            Acceptor::Unix("/run/s.sock".into())
        );
        let dns: Acceptor = "dns:nodes.test:7070".parse().unwrap();
        assert_eq!(dns.to_string(), "dns:nodes.test:7070");
        assert!(dns.is_many());
        let list = Acceptor::parse("a:1, b:2").unwrap();
        assert_eq!(list, Acceptor::List(vec!["a:1".into(), "b:2".into()]));
        assert!(matches!(Acceptor::parse("dns:x"), Err(Error::Config(_))));
    }
}
