//! The validated runtime model: what the engine consumes.
//!
//! Every value here has already been checked (addresses parsed, clusters referenced by routes
//! exist, secrets resolved, TLS files read), so the engine never re-validates and never sees an
//! `Option` that "must be `Some` by now".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};
use ipnet::IpNet;
/// A listener's HTTP settings are the transport's type, filled here.
pub use sluice_net::http::HttpOptions;
/// TLS material (a PEM chain and its key, read from disk) is the runtime's type, filled here.
pub use sluice_net::tls::Tls;
pub use sluice_wire::{EscapedSlashes, RequestRules, Underscores};

mod basic_auth;
mod cache;
mod compression;
mod cors;
mod dns;
mod global_rate_limit;
mod log_template;
mod rate_limit;
mod redirect;
mod relay;
mod rewrite;
mod tracing;
pub use basic_auth::BasicAuth;
pub use cache::{Cache, CacheDisk, CacheValid};
pub use compression::*;
pub use cors::{Cors, CorsOrigins, OriginMatch};
pub use dns::{Dns, HostPort, Resolve};
pub use global_rate_limit::*;
pub use log_template::{LogField, LogPiece, LogTemplate};
pub use rate_limit::*;
pub use redirect::{LocationPiece, LocationTemplate};
pub use relay::*;
pub use rewrite::{BadRewrite, PathRegex, Rewrite};
pub use sluice_session::Token;
pub use tracing::*;

/// A whole, validated Sluice configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the configuration came from (a path, or `<embedded default>`).
    pub source: String,
    /// Process-wide settings.
    pub runtime: Runtime,
    /// Where services dial in; present whenever a reverse cluster draws on this process's
    /// own acceptor.
    pub acceptor: Option<Acceptor>,
    /// The standalone acceptor's socket for consumers (`[handoff]`, `sluice acceptor`).
    pub handoff: Option<HandoffServer>,
    /// The admin API (`[admin]`); `None`: no admin listener.
    pub admin: Option<Admin>,
    /// The access log (`[access_log]`); `None` (the default): off.
    pub access_log: Option<AccessLog>,
    /// Request IDs (`[request_id]`); `None` (the default): off.
    pub request_id: Option<RequestId>,
    /// OpenTelemetry tracing (`[tracing]`); `None` (the default): off.
    pub tracing: Option<Tracing>,
    /// Client-facing listeners, in file order.
    pub listeners: Vec<Listener>,
    /// Routes, in file order; the first match wins.
    pub routes: Vec<Route>,
    /// Upstream clusters by name.
    pub clusters: BTreeMap<String, Cluster>,
    /// Split-TCP relays (`[[relay]]`), in file order.
    pub relays: Vec<Relay>,
    /// External rate-limit services (`[rate_limit_service.NAME]`) by name, which routes'
    /// `global_rate_limit` ask.
    pub rate_limit_services: BTreeMap<String, RateLimitService>,
    /// How the names of clusters with `resolve` are looked up (`[dns]`).
    pub dns: Dns,
}

/// Process-wide settings (`[runtime]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Runtime {
    /// Worker threads of the async runtime; `None` means one per CPU.
    pub workers: Option<usize>,
    /// How long in-flight requests may run after a shutdown signal. Default 30 s.
    pub shutdown_grace: Duration,
    /// The UNIX socket where a running Sluice waits for its successor (`sluice run
    /// --upgrade`) to take over its listeners and idle sessions; `None` (the default): no hot
    /// restart. Relative paths are relative to the config file.
    pub upgrade_socket: Option<PathBuf>,
}

/// One client-facing listener (`[[listener]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    /// Unique name, used in logs and metrics.
    pub name: String,
    /// The address to bind.
    pub addr: SocketAddr,
    /// TLS termination: the certificates to serve, chosen by the names in each for a client's
    /// SNI, the first for clients without SNI or with an unknown name. Empty: plaintext
    /// (HTTP/1.1 and h2c with prior knowledge).
    pub tls: Vec<Tls>,
    /// Protocol and limit settings.
    pub http: HttpOptions,
    /// HTTP/3 over QUIC beside the TCP listener (`http3 = true`), TLS listeners only.
    pub http3: Option<Http3>,
}

/// A listener's HTTP/3 (`http3 = true` and the `http3_*` keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http3 {
    /// The UDP address (`http3_listen`); default: the listener's own address (its bound port).
    pub addr: Option<SocketAddr>,
    /// Send every new client a Retry to validate its address first (`http3_retry`).
    pub retry: bool,
    /// Requests a connection may have open at once (`http3_max_streams`, default 100).
    pub max_streams: u32,
}

/// One route (`[[route]]`): a match and what to do with matching requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Name for logs and metrics; defaults to `route-<index>` (1-based).
    pub name: String,
    /// What a request must look like to take this route. Empty parts match anything.
    pub matcher: Match,
    /// Proxy to a cluster, or answer directly.
    pub action: Action,
    /// The slice of a reverse cluster whose sessions serve this route. Default
    /// [`DEFAULT_SLICE`]; only a reverse cluster's route may name another.
    pub slice: String,
    /// The largest request body this route forwards, over the listener's; default: the
    /// listener's.
    pub max_request_body: Option<u64>,
    /// Requests per client (or per a field's value) over time; `None`: unlimited.
    pub rate_limit: Option<RateLimit>,
    /// A limit shared by every node, kept by an external rate-limit service, asked after
    /// `rate_limit` (and after `basic_auth`); `None`: none.
    pub global_rate_limit: Option<GlobalRateLimit>,
    /// The users who may use the route (HTTP Basic authentication); `None`: anyone.
    pub basic_auth: Option<BasicAuth>,
    /// Which web origins may call the route from a browser; `None`: Sluice leaves CORS to the
    /// upstream.
    pub cors: Option<Cors>,
    /// How the path is rewritten before it goes upstream (or into a redirect's `{path}`);
    /// default: not at all.
    pub rewrite: Option<Rewrite>,
    /// How responses are compressed; `None` (the default): never.
    pub compression: Option<Compression>,
    /// The route's response cache (RFC 9111); `None` (the default): none.
    pub cache: Option<Cache>,
    /// Header edits applied to the request before it is forwarded.
    pub request_headers: HeaderEdits,
    /// Header edits applied to the response before it is sent to the client.
    pub response_headers: HeaderEdits,
}

/// The conditions of a route; every non-empty condition must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Match {
    /// Any of these hosts (empty: any host).
    pub hosts: Vec<HostMatch>,
    /// Path prefix (`None`: any path). Matches whole segments is NOT implied: `/api` matches `/apix`.
    pub path_prefix: Option<String>,
    /// Compare `path_prefix` without regard to ASCII case (`case_insensitive = true`; default
    /// false), for upstreams that serve `/ADMIN` as `/admin`.
    pub case_insensitive: bool,
    /// Any of these methods (empty: any method).
    pub methods: Vec<Method>,
    /// All of these headers with exactly these values.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The client address in any of these networks (empty: any client).
    pub client_cidrs: Vec<IpNet>,
}

/// A host condition; compared case-insensitively and without the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// Exactly this host, lowercase.
    Exact(String),
    /// `*.example.com`: any host ending in `.example.com` (stored as `.example.com`, lowercase).
    Suffix(String),
}

impl HostMatch {
    /// `api.example.com` matches exactly; `*.example.com` any subdomain. No other wildcards,
    /// and no port (hosts are compared without one). The error says what was expected.
    pub fn parse(host: &str) -> Result<Self, String> {
        let text = host.to_ascii_lowercase();
        let err = |why: &str| format!("invalid host `{host}`: {why}");
        let (wildcard, rest) = match text.strip_prefix("*.") {
            Some(suffix) => (true, suffix),
            None => (false, text.as_str()),
        };
        if rest.contains('*') {
            return Err(err(
                "`*` is only allowed as a leading `*.` (e.g. \"*.example.com\")",
            ));
        }
        if rest.contains(':') && !rest.starts_with('[') {
            return Err(err("hosts are matched without the port; remove `:<port>`"));
        }
        if rest.is_empty() || rest.starts_with('.') || rest.ends_with('.') {
            return Err(err("expected a host name like \"example.com\""));
        }
        Ok(if wildcard {
            HostMatch::Suffix(format!(".{rest}"))
        } else {
            HostMatch::Exact(text)
        })
    }
}

/// What a matching route does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Forward to the named cluster (which exists in [`Config::clusters`]).
    Proxy {
        /// The cluster's name.
        cluster: String,
    },
    /// Answer without contacting any upstream.
    Direct(DirectResponse),
}

/// A fixed response, like Envoy's `direct_response` or NGINX's `return`; with a `location`,
/// a redirect.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectResponse {
    /// The status code; with a `location`, one of 301, 302, 303, 307, 308 (default 301).
    pub status: StatusCode,
    /// Where a redirect sends the client (its `Location`, filled in per request); default:
    /// none, not a redirect.
    pub location: Option<LocationTemplate>,
    /// Extra response headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body (may be empty).
    pub body: String,
}

/// Header set/remove edits. Removals run first, then sets (which replace any existing value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeaderEdits {
    /// Headers to set, replacing existing values. Values may have come from `env:`/`file:`.
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Headers to remove.
    pub remove: Vec<HeaderName>,
}

/// An upstream cluster (`[cluster.<name>]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// The cluster's name.
    pub name: String,
    /// How the cluster reaches its backends.
    pub kind: ClusterKind,
}

/// The kinds of cluster.
// Built once per configuration load and never moved on a request path: boxing the larger
// variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterKind {
    /// Listening backends reached over pooled keep-alive connections.
    Static(StaticCluster),
    /// Services that dial in to the acceptor and register sessions.
    Reverse(ReverseCluster),
}

/// A cluster of listening endpoints (`kind = "static"`).
#[derive(Debug, Clone, PartialEq)]
pub struct StaticCluster {
    /// Endpoint addresses: IP literals, and without `resolve` also the addresses names had
    /// when the config was loaded.
    pub endpoints: Vec<SocketAddr>,
    /// With `resolve`: the endpoints given by name, resolved by the proxy when it starts and
    /// again as their records' TTLs say. Empty without `resolve`.
    pub names: Vec<HostPort>,
    /// How the cluster balances, pools, times out and ejects.
    pub options: StaticOptions,
}

/// The settings of a static cluster. `Default` gives the documented defaults, which are also
/// the config file's.
#[derive(Debug, Clone, PartialEq)]
pub struct StaticOptions {
    /// The load-balancing policy. Default p2c.
    pub lb: LbPolicy,
    /// Time allowed for the TCP connect to an endpoint. Default 2 s (expiry: 504).
    pub connect_timeout: Duration,
    /// Time allowed from the request being sent to the response head arriving. Default 30 s.
    pub response_timeout: Duration,
    /// Connection pool settings.
    pub pool: PoolOptions,
    /// Passive ejection of endpoints that fail to connect.
    pub ejection: Ejection,
    /// Optional active HTTP health checks. Default none (passive ejection only).
    pub health_check: Option<HealthCheck>,
    /// HTTPS to the endpoints (`tls = { .. }`); `None` (the default): plain HTTP.
    pub tls: Option<UpstreamTls>,
    /// When a request goes out again (`retry = { .. }`).
    pub retry: Retry,
    /// The HTTP version spoken to the endpoints (`protocol`). Default HTTP/1.1.
    pub protocol: UpstreamProtocol,
    /// HTTP/2 connections to each endpoint (`h2 = { .. }`), when `protocol` may speak it.
    pub h2: H2Options,
    /// Endpoint names follow DNS (`resolve`); `None` (the default): they are resolved once,
    /// when the configuration is loaded.
    pub resolve: Option<Resolve>,
}

/// What a static cluster speaks to its endpoints (`protocol = ..`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// `"http1"`: HTTP/1.1, one request per connection at a time (the default).
    Http1,
    /// `"h2"`: HTTP/2 over TLS (ALPN `h2`); needs `tls`.
    H2,
    /// `"h2c"`: HTTP/2 in cleartext, with prior knowledge (gRPC's usual plaintext).
    H2c,
    /// `"auto"`: over TLS, what ALPN agrees (`h2` offered first, then `http/1.1`); in
    /// plaintext, HTTP/2 with prior knowledge (h2c) for gRPC calls, which are only ever
    /// HTTP/2, and HTTP/1.1 for the rest.
    Auto,
}

/// How a static cluster keeps its HTTP/2 connections (`h2 = { .. }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Options {
    /// Connections to one endpoint at most; another opens when those open carry as many
    /// streams as they may. Default 4.
    pub max_connections: usize,
    /// Streams one connection carries at once at most (fewer if the endpoint's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` says so). Default 100.
    pub max_streams: usize,
    /// A connection quiet this long is sent a PING. Default 30 s.
    pub keepalive_interval: Duration,
    /// A PING unanswered this long closes the connection. Default 10 s.
    pub keepalive_timeout: Duration,
}

impl Default for H2Options {
    fn default() -> Self {
        Self {
            max_connections: 4,
            max_streams: 100,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

/// When a request goes to the cluster again after a failed attempt (`retry = { .. }` on a
/// cluster). Whatever it says, a request whose first attempt met a connection or session the
/// upstream had closed while idle goes once more (that was not the upstream's failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Further attempts after the first on a failure `on` lists. Default 0 without a
    /// `retry` table, 1 with one that does not say.
    pub retries: u32,
    /// Which failures count.
    pub on: RetryOn,
    /// Whether requests of methods that are not idempotent (POST, PATCH) go again too.
    /// Default false: a POST that may have been processed is not sent twice.
    pub non_idempotent: bool,
    /// Retries in flight are at most this percentage of the cluster's requests in flight
    /// (Envoy's retry budget), so that retries cannot multiply an overloaded upstream's load.
    /// Default 20.
    pub budget_percent: u32,
    /// ... but this many may always be in flight, however few the requests. Default 3.
    pub budget_min: u32,
}

/// The failures that send a request again (`on = [..]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryOn {
    /// `"connect-failure"`: a static cluster's connect failed (nothing was sent); the request
    /// moves on to another endpoint, up to three endpoints, whatever `retries` says.
    pub connect_failure: bool,
    /// `"reset"`: the connection or session closed or failed before any response byte.
    pub reset: bool,
    /// `"502"`, `"503"`, …: the upstream answered with one of these (429 or 500–599); the
    /// answer is read off and dropped, and the last attempt's answer is the client's.
    pub statuses: Vec<u16>,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            retries: 0,
            on: RetryOn {
                connect_failure: true,
                reset: true,
                statuses: Vec::new(),
            },
            non_idempotent: false,
            budget_percent: 20,
            budget_min: 3,
        }
    }
}

/// How a static cluster speaks TLS to its endpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamTls {
    /// The trust anchors endpoint certificates must chain to: PEM read from `ca`, or `None`
    /// for the system's roots.
    pub ca: Option<Pem>,
    /// The name sent by SNI and checked against each endpoint's certificate; `None`: the
    /// endpoint's IP address (checked against the certificate's IP addresses, no SNI sent).
    pub sni: Option<String>,
    /// A client certificate and key presented to endpoints that ask for one (mTLS).
    pub client_cert: Option<Tls>,
    /// `insecure_skip_verify = true`: endpoint certificates are not verified at all.
    pub insecure_skip_verify: bool,
}

/// PEM certificates read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Pem {
    /// Where they came from.
    pub path: PathBuf,
    /// The PEM text.
    pub pem: Vec<u8>,
}

impl Default for StaticOptions {
    fn default() -> Self {
        Self {
            lb: LbPolicy::P2c,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(30),
            pool: PoolOptions::default(),
            ejection: Ejection::default(),
            health_check: None,
            tls: None,
            retry: Retry::default(),
            protocol: UpstreamProtocol::Http1,
            h2: H2Options::default(),
            resolve: None,
        }
    }
}

/// Load-balancing policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbPolicy {
    /// Power of two choices: the fewer in-flight requests of two random endpoints.
    P2c,
    /// Each endpoint in turn.
    RoundRobin,
    /// A uniformly random endpoint.
    Random,
    /// The endpoint with the fewest in-flight requests.
    LeastRequest,
}

/// Keep-alive pool settings of a static cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolOptions {
    /// An idle pooled connection is closed after this long. Default 60 s.
    pub idle_timeout: Duration,
    /// At most this many idle connections are kept per endpoint. Default 128.
    pub max_idle_per_endpoint: usize,
    /// A connection is closed after this many requests; `None` means no limit (default).
    pub max_requests_per_connection: Option<u64>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(60),
            max_idle_per_endpoint: 128,
            max_requests_per_connection: None,
        }
    }
}

/// Passive ejection: an endpoint whose connect fails sits out for a backoff that doubles with
/// each consecutive failure, from `backoff` up to `max_backoff`.
#[derive(Debug, Clone, PartialEq)]
pub struct Ejection {
    /// The first backoff. Default 1 s.
    pub backoff: Duration,
    /// The largest backoff. Default 30 s.
    pub max_backoff: Duration,
}

impl Default for Ejection {
    fn default() -> Self {
        Self {
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Active HTTP health checking (`health_check = { ... }`).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    /// The path requested with GET. Default `/healthz`.
    pub path: String,
    /// Time between checks of one endpoint. Default 5 s.
    pub interval: Duration,
    /// Time allowed for one check. Default 1 s.
    pub timeout: Duration,
    /// Consecutive failures that mark an endpoint unhealthy. Default 3.
    pub unhealthy_threshold: u32,
    /// Consecutive successes that mark it healthy again. Default 2.
    pub healthy_threshold: u32,
    /// `grpc_service = "NAME"`: the gRPC health protocol's `grpc.health.v1.Health/Check` for
    /// this service (`""`: the whole server) instead of a GET of `path`; passes when the
    /// endpoint answers SERVING. Needs a cluster that speaks HTTP/2. Default none.
    pub grpc_service: Option<String>,
}

/// The slice of a route or a session that names none.
pub const DEFAULT_SLICE: &str = "default";

/// The service-facing listener (`[acceptor]`) where instances register sessions.
#[derive(Debug, Clone, PartialEq)]
pub struct Acceptor {
    /// The TCP address to bind.
    pub addr: SocketAddr,
    /// An optional UNIX socket path to listen on as well.
    pub unix: Option<PathBuf>,
    /// Time allowed for a service to send its handshake head. Default 5 s.
    pub handshake_timeout: Duration,
    /// Largest handshake head accepted; larger gets 400. Default 8 KiB.
    pub max_handshake_size: usize,
    /// Sessions across all clusters; `None` (config `0`) means no limit. Default 10000.
    pub max_sessions: Option<usize>,
    /// Handshakes per second accepted from one source address; `None` (config `0`) means no
    /// limit. Default 100.
    pub handshakes_per_second: Option<u32>,
    /// Control links (many nodes) open at once across every cluster; `None` (config `0`)
    /// means no limit. Default 4096.
    pub max_control_links: Option<usize>,
    /// Control links open at once from one source address (an IPv6 /64 counts as one);
    /// `None` (config `0`) means no limit. Default 256.
    pub max_control_links_per_address: Option<usize>,
    /// Slices a reverse cluster may hold beyond those its routes name, created by services'
    /// registrations and control links; `None` (config `0`) means no limit. Default 64.
    pub max_slices: Option<usize>,
    /// TLS on every acceptor socket (TCP and UNIX); `None` (default) accepts plaintext.
    pub tls: Option<AcceptorTls>,
}

/// TLS on the acceptor (`[acceptor] tls`).
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptorTls {
    /// The acceptor's own certificate chain and key.
    pub server: Tls,
    /// Client certificates; `None` (no `client_ca`, default) asks services for none.
    pub client_auth: Option<ClientAuth>,
}

/// mTLS: every service must present a certificate that `client_ca` signed.
#[derive(Clone, PartialEq)]
pub struct ClientAuth {
    /// Where the CA certificates came from.
    pub ca_path: PathBuf,
    /// The PEM CA certificates client certificates must chain to.
    pub ca_pem: Vec<u8>,
    /// The services each client certificate name (DNS SAN, or CN without SANs; lowercase)
    /// may register for (`[acceptor.clients]`). Empty (no table, default): every certificate
    /// the CA signed may register for any service.
    pub clients: BTreeMap<String, ServiceGrant>,
}

impl fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientAuth")
            .field("ca_path", &self.ca_path)
            .field("clients", &self.clients)
            .finish_non_exhaustive()
    }
}

/// The services one client certificate may register for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceGrant {
    /// Any service (`"*"`).
    Any,
    /// Only these reverse clusters.
    Services(BTreeSet<String>),
}

/// A cluster of services that dial in (`kind = "reverse"`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReverseCluster {
    /// Bearer tokens any one of which lets an instance register; empty means no auth.
    pub tokens: Vec<Token>,
    /// Queueing, limits, timeouts and buffers.
    pub options: ReverseOptions,
    /// Where the sessions come from; default: this process's `[acceptor]`.
    pub source: SessionSource,
}

/// Where a reverse cluster's sessions come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionSource {
    /// Services register with this process's `[acceptor]`.
    Acceptor,
    /// A standalone acceptor (`sluice acceptor`) hands them over its handoff socket.
    Handoff {
        /// The acceptor's handoff socket.
        path: PathBuf,
        /// Idle sessions to keep here per slice (credit asked ahead); twice as many are
        /// handed back. Default 4.
        idle: usize,
    },
}

/// `[request_id]`: every request gets an ID, in a field of this name (default `x-request-id`):
/// the one a trusted client sent, else a new one. It goes upstream, into the access log
/// (`{request_id}`) and into Sluice's own error answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId {
    /// The field's name, lowercase.
    pub header: http::HeaderName,
}

/// `[access_log]`: where each answered request is logged, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    /// The line format; default [`AccessLogFormat::Common`].
    pub format: AccessLogFormat,
    /// Where lines go; default stdout.
    pub target: AccessLogTarget,
}

/// An access log line's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// The Common Log Format (NGINX's and Apache's `common`).
    Common,
    /// The Combined Log Format: Common plus `Referer` and `User-Agent` (NGINX's default
    /// `combined`).
    Combined,
    /// One JSON object per line.
    Json,
    /// A line of the operator's own (NGINX's `log_format`).
    Template(LogTemplate),
}

/// Where access log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    /// Standard output (`path = "stdout"`, the default).
    Stdout,
    /// A file, appended to (relative paths are relative to the config file).
    File(PathBuf),
}

/// `[admin]`: the admin API's listener and its bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// Where it listens; a non-loopback address needs `token`.
    pub addr: SocketAddr,
    /// The bearer token every request must carry; `None` (allowed on loopback only): none.
    pub token: Option<Token>,
    /// Refuses every change (any method but GET and HEAD) with 403, token or not; default
    /// false. What the packages ship where no token can be set up for them (the OCI image).
    pub read_only: bool,
}

/// `[handoff]`: where a standalone acceptor hands sessions to consumers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffServer {
    /// The UNIX socket path.
    pub path: PathBuf,
    /// Peer uids allowed to connect besides the acceptor's own, which always may.
    pub allowed_uids: Vec<u32>,
    /// The socket file's permission bits; default 0600 (the owner only).
    pub mode: u32,
    /// The socket file's group (a gid, names resolved); `None` (the default): the
    /// acceptor's own.
    pub group: Option<u32>,
}

/// The settings of a reverse cluster. `Default` gives the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ReverseOptions {
    /// Requests that may wait for a session, per slice. Default 1024 (full: 503).
    pub queue_max: usize,
    /// How long a request may wait for a session. Default 2 s (expiry: 503).
    pub queue_timeout: Duration,
    /// How long a request may wait while its slice has no session registered at all (services
    /// starting), within `queue_timeout`. Default 0: 503 at once.
    pub no_sessions_wait: Duration,
    /// For this long after the node starts, a request to a slice with no session yet waits
    /// for the first (beyond `queue_timeout`) instead of a 503, and `/ready` says 503 until
    /// each routed slice holds a session: services dial a new node only once they find it.
    /// Default 10 s; 0: off.
    pub startup_wait: Duration,
    /// Sessions one instance may register; `None` (config `0`, default) means no limit.
    pub max_sessions_per_instance: Option<usize>,
    /// Sessions the whole cluster may hold; `None` (config `0`, default) means no limit.
    pub max_sessions: Option<usize>,
    /// Time from the request being sent to the response head arriving. Default 30 s.
    pub response_timeout: Duration,
    /// Request bodies up to this size are read before a session is leased. Default 64 KiB.
    pub request_buffer: usize,
    /// Response bodies up to this size are read off the session at once. Default 64 KiB.
    pub response_buffer: usize,
    /// When a request goes out again (`retry = { .. }`; sessions are never connected, so
    /// `on` has no `connect-failure`).
    pub retry: Retry,
}

impl Default for ReverseOptions {
    fn default() -> Self {
        Self {
            queue_max: 1024,
            queue_timeout: Duration::from_secs(2),
            no_sessions_wait: Duration::ZERO,
            startup_wait: Duration::from_secs(10),
            max_sessions_per_instance: None,
            max_sessions: None,
            response_timeout: Duration::from_secs(30),
            request_buffer: 64 * 1024,
            response_buffer: 64 * 1024,
            retry: Retry {
                on: RetryOn {
                    connect_failure: false,
                    ..Retry::default().on
                },
                ..Retry::default()
            },
        }
    }
}
