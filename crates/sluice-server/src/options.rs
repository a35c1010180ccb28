//! [`HttpOptions`]: how a listener speaks HTTP — the transport's own type, which the
//! application fills from a listener's configuration (`sluice::options::http`).

use std::time::Duration;

use ipnet::IpNet;
use sluice_wire::RequestRules;

/// Per-listener HTTP settings. The default is the configuration file's.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpOptions {
    /// Accept HTTP/2 (h2c prior knowledge on plaintext, ALPN `h2` on TLS). Default true.
    pub http2: bool,
    /// Serve HTTP/1.1 requests with the fast path a server was given, leaving everything else
    /// to hyper. Default true.
    pub fast_path: bool,
    /// Time allowed for a client to send a request's headers; on HTTP/1.1 also while a
    /// keep-alive connection waits for its next request. Default 10 s.
    pub request_header_timeout: Duration,
    /// The longest wait for the next bytes of a request body. Default 20 s.
    pub client_body_timeout: Duration,
    /// A connection on which no byte moves in either direction for this long is closed.
    /// Default 60 s.
    pub idle_timeout: Duration,
    /// Largest request head accepted; larger gets 431. Default 16 KiB.
    pub max_header_bytes: usize,
    /// Largest request body a route forwards (a route's own wins). Default: no limit.
    pub max_request_body: Option<u64>,
    /// The most requests one connection serves. Default: no limit.
    pub max_requests_per_connection: Option<u64>,
    /// The most connections one client address (an IPv6 client's /64) may hold open at once.
    /// Default: no limit.
    pub max_connections_per_client: Option<u32>,
    /// Peers whose `X-Forwarded-For` and `Forwarded` chains are kept. Default: none.
    pub trusted_proxies: Vec<IpNet>,
    /// How request heads are normalised before routing. Default: the safe choices.
    pub rules: RequestRules,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            http2: true,
            fast_path: true,
            request_header_timeout: Duration::from_secs(10),
            client_body_timeout: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            max_header_bytes: 16 * 1024,
            max_request_body: None,
            max_requests_per_connection: None,
            max_connections_per_client: None,
            trusted_proxies: Vec::new(),
            rules: RequestRules::default(),
        }
    }
}
