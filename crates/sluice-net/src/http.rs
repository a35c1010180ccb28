//! [`HttpOptions`]: how a listener speaks HTTP. The configuration fills it (`sluice-config`
//! re-exports it) and the transport (`sluice-server`) takes it, so neither names the other's
//! types and no copy converts between them.

use std::time::Duration;

use ipnet::IpNet;
use sluice_wire::RequestRules;

/// Per-listener HTTP settings. The default is the configuration file's.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpOptions {
    /// Accept HTTP/2 (h2c prior knowledge on plaintext, ALPN `h2` on TLS). Default true.
    pub http2: bool,
    /// Serve HTTP/1.1 requests (plain or over TLS) to static clusters and reverse slices on the
    /// fast path (no header maps, no task per exchange), leaving everything else to hyper.
    /// Default true.
    pub fast_path: bool,
    /// Serve HTTP/2 clients with Sluice's own HTTP/2 transport (frames and HPACK over the
    /// connection's bytes, no task per stream) rather than hyper's (the `h2` crate); `None`:
    /// the default, which `SLUICE_OWN_HTTP2=0|1` sets (the test command runs the suites both
    /// ways), else the built-in one.
    pub own_http2: Option<bool>,
    /// Time allowed for a client to send a request's headers. Default 10 s. On HTTP/1.1 the
    /// timer also runs while a keep-alive connection waits for its next request.
    pub request_header_timeout: Duration,
    /// The longest wait for the next bytes of a request body (NGINX's `client_body_timeout`):
    /// while it is read into `request_buffer` and while it streams to an upstream. Past it the
    /// client gets 408 and the connection closes. Default 20 s, under a cluster's default
    /// `response_timeout`, so a stalled upload is the client's 408 and not the upstream's 504.
    pub client_body_timeout: Duration,
    /// A connection on which no byte moves in either direction for this long is closed.
    /// Default 60 s.
    pub idle_timeout: Duration,
    /// Largest request head (request line + headers) accepted; larger gets 431. Default 16 KiB.
    pub max_header_bytes: usize,
    /// Largest request body a route forwards (NGINX's `client_max_body_size`); larger gets
    /// 413, before any of it is read when its length is declared, as soon as it is exceeded
    /// when chunked. A route's own `max_request_body` wins. Routes that answer directly
    /// (`direct_response`) read no body and take any. Default: no limit.
    pub max_request_body: Option<u64>,
    /// The most requests one connection serves (NGINX's `keepalive_requests`): the last one's
    /// response closes an HTTP/1.1 connection, an HTTP/2 one gets GOAWAY. Default: no limit.
    pub max_requests_per_connection: Option<u64>,
    /// The most connections one client address (an IPv6 client's /64) may hold open at once
    /// (NGINX's `limit_conn`); more are closed as they are accepted. Default: no limit.
    pub max_connections_per_client: Option<u32>,
    /// Peers whose `X-Forwarded-For` and `Forwarded` chains are kept (and appended to); from
    /// anyone else those headers are replaced by the peer's address. Default: none.
    pub trusted_proxies: Vec<IpNet>,
    /// How request heads are normalised before routing. Default: the safe choices.
    pub rules: RequestRules,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            http2: true,
            fast_path: true,
            own_http2: None,
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
