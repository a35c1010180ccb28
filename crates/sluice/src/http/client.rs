//! [`ClientInfo`]: what the proxy knows about a request's connection.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use sluice_config::RequestRules;

/// What the proxy knows about a request's connection; inserted into every request's
/// extensions by the server.
#[derive(Debug, Clone, Copy)]
pub struct ClientInfo {
    /// The client's address.
    pub peer: SocketAddr,
    /// The local address the client connected to.
    pub local: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// Whether the peer is one of the listener's `trusted_proxies`, whose forwarding chains
    /// are kept. Default false.
    pub trusted: bool,
    /// The listener's normalisation rules.
    pub rules: RequestRules,
    /// The listener's `client_body_timeout`: the longest wait for more of a request body.
    pub body_timeout: Duration,
    /// The listener's `max_request_body`, unless a route says otherwise. Default: no limit.
    pub max_body: Option<u64>,
}

impl Default for ClientInfo {
    fn default() -> Self {
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        Self {
            peer: unspecified,
            local: unspecified,
            tls: false,
            trusted: false,
            rules: RequestRules::default(),
            body_timeout: Duration::from_secs(20),
            max_body: None,
        }
    }
}

/// The address limits count a client by (`rate_limit`, `max_connections_per_client`): an
/// IPv4 address (also when it arrives IPv4-mapped), or an IPv6 address's /64 — a host or a
/// home network gets a whole /64, and would otherwise be 2^64 clients.
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}
