//! The engine's own settings: plain values, so the crate is used and tested without the TOML
//! model (the application converts its configuration into them). They have no `Default`: the
//! defaults are the configuration's, documented there.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use sluice_handoff::SocketAccess;

/// A reverse cluster's queueing, limits, timeouts and buffers, shared by its slice pools.
#[derive(Debug, Clone, PartialEq)]
pub struct ReverseOptions {
    /// Requests that may wait for a session, per slice; more are refused (503).
    pub queue_max: usize,
    /// How long a request may wait for a session (then 503).
    pub queue_timeout: Duration,
    /// How long a request may wait while its slice has no session registered at all (services
    /// starting), within `queue_timeout`; zero: 503 at once.
    pub no_sessions_wait: Duration,
    /// For this long after the cluster is made (the node starts), a request to a slice with
    /// no session yet waits for the first instead of a 503; zero: off.
    pub startup_wait: Duration,
    /// Sessions one instance may register; `None`: no limit.
    pub max_sessions_per_instance: Option<usize>,
    /// Sessions the whole cluster may hold; `None`: no limit.
    pub max_sessions: Option<usize>,
    /// Time from the request being sent to the response head arriving.
    pub response_timeout: Duration,
    /// Request bodies up to this size are read before a session is leased.
    pub request_buffer: usize,
    /// Response bodies up to this size are read off the session at once.
    pub response_buffer: usize,
}

/// The service-facing listener where instances register sessions.
#[derive(Debug, Clone)]
pub struct AcceptorOptions {
    /// The TCP address to bind.
    pub addr: SocketAddr,
    /// A UNIX socket path to listen on as well; `None`: TCP only.
    pub unix: Option<PathBuf>,
    /// Time allowed for a service to send its handshake head (and, with `tls`, its TLS
    /// handshake).
    pub handshake_timeout: Duration,
    /// Largest handshake head accepted; larger gets 400.
    pub max_handshake_size: usize,
    /// Sessions across all clusters; `None`: no limit.
    pub max_sessions: Option<usize>,
    /// Handshakes per second accepted from one source address; `None`: no limit.
    pub handshakes_per_second: Option<u32>,
    /// Control links open at once across every cluster; `None`: no limit.
    pub max_control_links: Option<usize>,
    /// Control links open at once from one source address (an IPv6 /64 counts as one);
    /// `None`: no limit.
    pub max_control_links_per_address: Option<usize>,
    /// Slices a cluster may hold beyond those its routes name (services' registrations and
    /// control links create them); `None`: no limit.
    pub max_slices: Option<usize>,
    /// TLS on every acceptor socket (TCP and UNIX), client certificates included; `None`:
    /// plaintext.
    pub tls: Option<Arc<ServerConfig>>,
    /// The services each client certificate name (lowercase) may register for. Empty: any
    /// certificate `tls` accepts may register for any service.
    pub clients: BTreeMap<String, ServiceGrant>,
}

/// The services one client certificate may register for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceGrant {
    /// Any service.
    Any,
    /// Only these reverse clusters.
    Services(BTreeSet<String>),
}

impl ServiceGrant {
    /// Whether `service` is granted.
    pub fn allows(&self, service: &str) -> bool {
        match self {
            ServiceGrant::Any => true,
            ServiceGrant::Services(names) => names.contains(service),
        }
    }
}

/// A standalone acceptor: where services dial in, and where consumers connect.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// The acceptor; its `tls` must be `None`, as a session's TLS state cannot be lent.
    pub acceptor: AcceptorOptions,
    /// The handoff socket's path.
    pub path: PathBuf,
    /// Peer uids allowed to connect besides the process's own, which always may.
    pub allowed_uids: Vec<u32>,
    /// The socket file's permission bits and group.
    pub access: SocketAccess,
}
