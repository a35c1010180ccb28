//! [`ClientInfo`]: what the proxy knows about a request's connection.

use std::net::SocketAddr;
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
