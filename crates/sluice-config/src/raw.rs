//! The configuration exactly as written: serde mirrors of the TOML, strict about unknown keys.
//!
//! Values that can be checked alone are checked by their types (see `values`); values whose
//! check needs the rest of the file (references, uniqueness, files, secrets) are kept
//! `Spanned` so `validate` can still point at them.

use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroUsize};

use serde::Deserialize;
use toml::Spanned;

use crate::values::{
    Addr, Cidr, Dur, FileMode, GroupSpec, HeaderTable, MethodValue, Name, OneOrMany, Size, Status,
    Timeout, Value,
};

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub(crate) runtime: RawRuntime,
    pub(crate) acceptor: Option<Spanned<RawAcceptor>>,
    pub(crate) handoff: Option<Spanned<RawHandoff>>,
    pub(crate) admin: Option<Spanned<RawAdmin>>,
    pub(crate) access_log: Option<RawAccessLog>,
    pub(crate) request_id: Option<RawRequestId>,
    pub(crate) tracing: Option<Spanned<RawTracing>>,
    #[serde(default)]
    pub(crate) listener: Vec<RawListener>,
    #[serde(default)]
    pub(crate) route: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    pub(crate) cluster: BTreeMap<Spanned<String>, RawCluster>,
    #[serde(default)]
    pub(crate) relay: Vec<Spanned<RawRelay>>,
    #[serde(default)]
    pub(crate) rate_limit_service: BTreeMap<Spanned<String>, Spanned<RawRateLimitService>>,
    pub(crate) dns: Option<RawDns>,
}

/// `[rate_limit_service.NAME]`: an external rate-limit service (Envoy's protocol).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimitService {
    pub(crate) address: Spanned<String>,
    pub(crate) domain: Spanned<String>,
    pub(crate) timeout: Option<Timeout>,
    pub(crate) failure_mode: Option<Spanned<String>>,
}

/// A route's `global_rate_limit = { service, descriptors }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGlobalRateLimit {
    pub(crate) service: Spanned<String>,
    pub(crate) descriptors: Spanned<Vec<Spanned<Vec<Spanned<RawDescriptorEntry>>>>>,
}

/// One entry of a descriptor: `{ key, from }` or `{ key, value }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptorEntry {
    pub(crate) key: Option<Spanned<String>>,
    pub(crate) from: Option<Spanned<String>>,
    pub(crate) value: Option<Spanned<String>>,
}

/// `[dns]`: where names of clusters with `resolve` are looked up.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDns {
    pub(crate) nameservers: Option<Vec<Spanned<String>>>,
    pub(crate) timeout: Option<Timeout>,
}

/// `[[relay]]`: a split-TCP relay (an entry relay with `to`, or a tunnel end with `tunnel`).
/// Keys of the other role are refused by `validate`, which is why they keep their spans.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRelay {
    pub(crate) name: Spanned<String>,
    pub(crate) listen: Spanned<Addr>,
    // the entry relay
    pub(crate) to: Option<Spanned<String>>,
    pub(crate) resolve: Option<Spanned<RawResolve>>,
    pub(crate) target: Option<Spanned<Addr>>,
    pub(crate) token: Option<Spanned<String>>,
    pub(crate) pool: Option<Spanned<usize>>,
    pub(crate) early_connect: Option<Spanned<bool>>,
    // the tunnel end
    pub(crate) tunnel: Option<Spanned<bool>>,
    pub(crate) tokens: Option<Spanned<Vec<Spanned<String>>>>,
    pub(crate) allow: Option<Spanned<Vec<Spanned<String>>>>,
    pub(crate) preamble_timeout: Option<Spanned<Timeout>>,
    pub(crate) max_unauthenticated: Option<Spanned<usize>>,
    pub(crate) pool_targets: Option<Spanned<Vec<Spanned<Addr>>>>,
    // both
    pub(crate) connect_timeout: Option<Timeout>,
    pub(crate) idle_timeout: Option<Timeout>,
    pub(crate) max_connections: Option<Spanned<usize>>,
    pub(crate) nodelay: Option<bool>,
    pub(crate) congestion: Option<Spanned<String>>,
    pub(crate) socket_buffer: Option<Spanned<Size>>,
    pub(crate) splice: Option<bool>,
    pub(crate) sockmap: Option<bool>,
}

/// `[runtime]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRuntime {
    pub(crate) workers: Option<NonZeroUsize>,
    pub(crate) shutdown_grace: Option<Dur>,
    pub(crate) upgrade_socket: Option<Spanned<String>>,
}

/// `[[listener]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub(crate) name: Spanned<String>,
    pub(crate) listen: Spanned<Addr>,
    pub(crate) tls: Option<Spanned<OneOrMany<RawTls>>>,
    pub(crate) http2: Option<bool>,
    pub(crate) http3: Option<Spanned<bool>>,
    pub(crate) http3_listen: Option<Spanned<Addr>>,
    pub(crate) http3_retry: Option<Spanned<bool>>,
    pub(crate) http3_max_streams: Option<Spanned<u32>>,
    pub(crate) fast_path: Option<bool>,
    pub(crate) own_http2: Option<bool>,
    pub(crate) request_header_timeout: Option<Timeout>,
    pub(crate) client_body_timeout: Option<Timeout>,
    pub(crate) idle_timeout: Option<Timeout>,
    pub(crate) max_header_size: Option<Spanned<Size>>,
    pub(crate) max_request_body: Option<Spanned<Size>>,
    pub(crate) max_requests_per_connection: Option<Spanned<u64>>,
    pub(crate) max_connections_per_client: Option<Spanned<u32>>,
    #[serde(default)]
    pub(crate) trusted_proxies: Vec<Cidr>,
    pub(crate) escaped_slashes: Option<RawEscapedSlashes>,
    pub(crate) underscores_in_headers: Option<RawUnderscores>,
}

/// `escaped_slashes`, as spelled in TOML.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawEscapedSlashes {
    Reject,
    Keep,
    Unescape,
}

/// `underscores_in_headers`, as spelled in TOML.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawUnderscores {
    Drop,
    Allow,
    Reject,
}

/// `tls = { cert, key }`; paths are relative to the config file's directory. A listener takes
/// one such table or an array of them (certificates chosen by SNI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub(crate) cert: Spanned<String>,
    pub(crate) key: Spanned<String>,
}

/// `[[route]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub(crate) name: Option<String>,
    pub(crate) host: Option<Spanned<OneOrMany<String>>>,
    pub(crate) path_prefix: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) case_insensitive: bool,
    #[serde(default)]
    pub(crate) methods: Vec<MethodValue>,
    #[serde(default)]
    pub(crate) headers: HeaderTable<Value>,
    pub(crate) client_cidr: Option<Spanned<OneOrMany<Cidr>>>,
    pub(crate) cluster: Option<Spanned<String>>,
    pub(crate) slice: Option<Spanned<String>>,
    pub(crate) direct_response: Option<Spanned<RawDirectResponse>>,
    #[serde(default)]
    pub(crate) request_headers: RawHeaderEdits,
    #[serde(default)]
    pub(crate) response_headers: RawHeaderEdits,
    pub(crate) max_request_body: Option<Spanned<Size>>,
    pub(crate) rewrite: Option<Spanned<RawRewrite>>,
    pub(crate) rate_limit: Option<Spanned<RawRateLimit>>,
    pub(crate) global_rate_limit: Option<Spanned<RawGlobalRateLimit>>,
    pub(crate) basic_auth: Option<Spanned<RawBasicAuth>>,
    pub(crate) cors: Option<Spanned<RawCors>>,
    pub(crate) compression: Option<RawCompression>,
    pub(crate) cache: Option<Spanned<RawCache>>,
}

/// A route's `cache`: `true`/`false`, or a table of settings.
#[derive(Debug)]
pub(crate) enum RawCache {
    On(bool),
    Table(Box<RawCacheTable>),
}

/// `cache = { memory, max_object, lock_timeout, valid, disk }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCacheTable {
    pub(crate) memory: Option<Spanned<Size>>,
    pub(crate) max_object: Option<Spanned<Size>>,
    pub(crate) lock_timeout: Option<Spanned<Dur>>,
    /// `valid = { "200" = "10m", any = "1m" }`: status (or `any`) to lifetime.
    pub(crate) valid: Option<Spanned<BTreeMap<String, Spanned<Dur>>>>,
    pub(crate) disk: Option<Spanned<RawCacheDisk>>,
}

/// A cache's `disk = { path, max_size }` (NGINX's `proxy_cache_path`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCacheDisk {
    pub(crate) path: Spanned<String>,
    pub(crate) max_size: Option<Spanned<Size>>,
}

struct RawCacheVisitor;

impl<'de> serde::de::Visitor<'de> for RawCacheVisitor {
    type Value = RawCache;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("true, false, or a table like { memory = \"256MiB\" }")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<RawCache, E> {
        Ok(RawCache::On(v))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawCache, A::Error> {
        let table = serde::de::value::MapAccessDeserializer::new(map);
        RawCacheTable::deserialize(table).map(|t| RawCache::Table(Box::new(t)))
    }
}

impl<'de> Deserialize<'de> for RawCache {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawCacheVisitor)
    }
}

/// A route's `cors = { origins, methods, headers, expose, credentials, max_age }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCors {
    pub(crate) origins: Spanned<Vec<String>>,
    pub(crate) methods: Option<Vec<MethodValue>>,
    #[serde(default)]
    pub(crate) headers: Vec<Name>,
    #[serde(default)]
    pub(crate) expose: Vec<Name>,
    pub(crate) credentials: Option<bool>,
    pub(crate) max_age: Option<Dur>,
}

/// A route's `basic_auth = { htpasswd, realm }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBasicAuth {
    pub(crate) htpasswd: Spanned<String>,
    pub(crate) realm: Option<String>,
}

/// A route's `compression`: `true`/`false`, or a table of settings.
#[derive(Debug)]
pub(crate) enum RawCompression {
    On(bool),
    Table(RawCompressionTable),
}

/// `compression = { encodings, min_size, types, level }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCompressionTable {
    pub(crate) encodings: Option<Spanned<Vec<Spanned<String>>>>,
    pub(crate) min_size: Option<Size>,
    pub(crate) types: Option<Vec<Spanned<String>>>,
    pub(crate) level: Option<RawLevels>,
}

/// `level = { gzip, br, zstd }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLevels {
    pub(crate) gzip: Option<Spanned<u32>>,
    pub(crate) br: Option<Spanned<u32>>,
    pub(crate) zstd: Option<Spanned<i32>>,
}

struct RawCompressionVisitor;

impl<'de> serde::de::Visitor<'de> for RawCompressionVisitor {
    type Value = RawCompression;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("true, false, or a table like { encodings = [\"gzip\"] }")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<RawCompression, E> {
        Ok(RawCompression::On(v))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawCompression, A::Error> {
        let table = serde::de::value::MapAccessDeserializer::new(map);
        RawCompressionTable::deserialize(table).map(RawCompression::Table)
    }
}

impl<'de> Deserialize<'de> for RawCompression {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawCompressionVisitor)
    }
}

/// A static cluster's or an entry relay's `resolve`: `true`/`false`, or a table of bounds.
#[derive(Debug)]
pub(crate) enum RawResolve {
    On(bool),
    Table(RawResolveTable),
}

/// `resolve = { min_ttl, max_ttl }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawResolveTable {
    pub(crate) min_ttl: Option<Spanned<Timeout>>,
    pub(crate) max_ttl: Option<Spanned<Timeout>>,
}

struct RawResolveVisitor;

impl<'de> serde::de::Visitor<'de> for RawResolveVisitor {
    type Value = RawResolve;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("true, false, or a table like { min_ttl = \"1s\", max_ttl = \"5m\" }")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<RawResolve, E> {
        Ok(RawResolve::On(v))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawResolve, A::Error> {
        let table = serde::de::value::MapAccessDeserializer::new(map);
        RawResolveTable::deserialize(table).map(RawResolve::Table)
    }
}

impl<'de> Deserialize<'de> for RawResolve {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawResolveVisitor)
    }
}

/// A route's `rate_limit = { rate, burst, key }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub(crate) rate: Spanned<String>,
    pub(crate) burst: Option<Spanned<u32>>,
    pub(crate) key: Option<Spanned<String>>,
}

/// `rewrite = { prefix, replace }` or `{ regex, replace }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRewrite {
    pub(crate) prefix: Option<Spanned<String>>,
    pub(crate) regex: Option<Spanned<String>>,
    pub(crate) replace: Spanned<String>,
}

/// `direct_response = { status, body, headers, location }`; header values may be secrets. The
/// status is required but for a redirect (`location`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDirectResponse {
    pub(crate) status: Option<Spanned<Status>>,
    pub(crate) location: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) body: String,
    #[serde(default)]
    pub(crate) headers: HeaderTable<Spanned<String>>,
}

/// `request_headers` / `response_headers = { set, remove }`; `set` values may be secrets.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHeaderEdits {
    #[serde(default)]
    pub(crate) set: HeaderTable<Spanned<String>>,
    #[serde(default)]
    pub(crate) remove: Vec<Name>,
}

/// The cluster kinds; serde's "unknown variant" message lists the valid ones.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawKind {
    Static,
    Reverse,
}

/// The load-balancing policies as spelled in TOML.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawLb {
    P2c,
    RoundRobin,
    Random,
    LeastRequest,
}

/// `[cluster.<name>]`. Keys of the other kind are refused by `validate`, which is why each
/// kind-specific key keeps its span.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub(crate) kind: RawKind,
    pub(crate) response_timeout: Option<Timeout>,
    pub(crate) retry: Option<Spanned<RawRetry>>,
    // kind = "static"
    pub(crate) endpoints: Option<Spanned<Vec<Spanned<String>>>>,
    pub(crate) lb: Option<Spanned<RawLb>>,
    pub(crate) connect_timeout: Option<Spanned<Timeout>>,
    pub(crate) pool: Option<Spanned<RawPool>>,
    pub(crate) ejection: Option<Spanned<RawEjection>>,
    pub(crate) health_check: Option<Spanned<RawHealthCheck>>,
    pub(crate) tls: Option<Spanned<RawUpstreamTls>>,
    pub(crate) protocol: Option<Spanned<RawProtocol>>,
    pub(crate) h2: Option<Spanned<RawH2>>,
    pub(crate) resolve: Option<Spanned<RawResolve>>,
    // kind = "reverse"
    pub(crate) tokens: Option<Spanned<Vec<Spanned<String>>>>,
    pub(crate) queue_max: Option<Spanned<usize>>,
    pub(crate) queue_timeout: Option<Spanned<Timeout>>,
    pub(crate) no_sessions_wait: Option<Spanned<Dur>>,
    pub(crate) startup_wait: Option<Spanned<Dur>>,
    pub(crate) max_sessions_per_instance: Option<Spanned<usize>>,
    pub(crate) max_sessions: Option<Spanned<usize>>,
    pub(crate) request_buffer: Option<Spanned<Size>>,
    pub(crate) response_buffer: Option<Spanned<Size>>,
    pub(crate) handoff: Option<Spanned<String>>,
    pub(crate) handoff_idle: Option<Spanned<usize>>,
}

/// A static cluster's `protocol`; serde's "unknown variant" message lists the valid ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawProtocol {
    Http1,
    H2,
    H2c,
    Auto,
}

/// A static cluster's `h2 = { max_connections, max_streams, keepalive_interval,
/// keepalive_timeout }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawH2 {
    pub(crate) max_connections: Option<Spanned<usize>>,
    pub(crate) max_streams: Option<Spanned<usize>>,
    pub(crate) keepalive_interval: Option<Timeout>,
    pub(crate) keepalive_timeout: Option<Timeout>,
}

/// A cluster's `retry = { retries, on, non_idempotent, budget_percent, budget_min }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetry {
    pub(crate) retries: Option<Spanned<u32>>,
    pub(crate) on: Option<Spanned<Vec<Spanned<String>>>>,
    pub(crate) non_idempotent: Option<bool>,
    pub(crate) budget_percent: Option<Spanned<u32>>,
    pub(crate) budget_min: Option<u32>,
}

/// A static cluster's `tls = { ca, sni, cert, key, insecure_skip_verify }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstreamTls {
    pub(crate) ca: Option<Spanned<String>>,
    pub(crate) sni: Option<Spanned<String>>,
    pub(crate) cert: Option<Spanned<String>>,
    pub(crate) key: Option<Spanned<String>>,
    pub(crate) insecure_skip_verify: Option<Spanned<bool>>,
}

/// `[access_log]`: one line per request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccessLog {
    /// `common`, `combined`, `json`, or a template with `{fields}`.
    pub(crate) format: Option<Spanned<String>>,
    pub(crate) path: Option<String>,
}

/// `[request_id]`: a request ID on every request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRequestId {
    pub(crate) header: Option<Spanned<String>>,
}

/// `[tracing]`: OpenTelemetry traces, exported over OTLP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTracing {
    pub(crate) endpoint: Option<Spanned<String>>,
    pub(crate) protocol: Option<Spanned<String>>,
    pub(crate) sample_ratio: Option<Spanned<f64>>,
    pub(crate) parent_based: Option<bool>,
    pub(crate) extract: Option<Spanned<String>>,
    pub(crate) service_name: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) resource: BTreeMap<String, String>,
    pub(crate) queue: Option<Spanned<usize>>,
    pub(crate) timeout: Option<Timeout>,
}

/// `[admin]`: the admin API.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub(crate) listen: Spanned<Addr>,
    pub(crate) token: Option<Spanned<String>>,
    pub(crate) read_only: Option<bool>,
}

/// `[handoff]`: the standalone acceptor's socket for consumers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHandoff {
    pub(crate) listen: Spanned<String>,
    pub(crate) allowed_uids: Option<Vec<u32>>,
    pub(crate) mode: Option<FileMode>,
    pub(crate) group: Option<Spanned<GroupSpec>>,
}

/// `[acceptor]`: where services dial in to register sessions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAcceptor {
    pub(crate) listen: Spanned<Addr>,
    pub(crate) unix: Option<Spanned<String>>,
    pub(crate) handshake_timeout: Option<Timeout>,
    pub(crate) max_handshake_size: Option<Spanned<Size>>,
    pub(crate) max_sessions: Option<usize>,
    pub(crate) handshakes_per_second: Option<u32>,
    pub(crate) max_control_links: Option<usize>,
    pub(crate) max_control_links_per_address: Option<usize>,
    pub(crate) max_slices: Option<usize>,
    pub(crate) tls: Option<RawAcceptorTls>,
    pub(crate) clients: Option<Spanned<BTreeMap<Spanned<String>, RawGrant>>>,
}

/// `[acceptor] tls = { cert, key, client_ca }`; `client_ca` turns on mTLS.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAcceptorTls {
    pub(crate) cert: Spanned<String>,
    pub(crate) key: Spanned<String>,
    pub(crate) client_ca: Option<Spanned<String>>,
}

/// One `[acceptor.clients]` entry: the services a client certificate name may register for.
pub(crate) type RawGrant = Spanned<Vec<Spanned<String>>>;

/// `pool = { ... }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPool {
    pub(crate) idle_timeout: Option<Timeout>,
    pub(crate) max_idle_per_endpoint: Option<usize>,
    pub(crate) max_requests_per_connection: Option<u64>,
}

/// `ejection = { backoff, max_backoff }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEjection {
    pub(crate) backoff: Option<Timeout>,
    pub(crate) max_backoff: Option<Spanned<Timeout>>,
}

/// `health_check = { ... }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealthCheck {
    pub(crate) path: Option<Spanned<String>>,
    pub(crate) grpc_service: Option<Spanned<String>>,
    pub(crate) interval: Option<Timeout>,
    pub(crate) timeout: Option<Timeout>,
    pub(crate) unhealthy_threshold: Option<NonZeroU32>,
    pub(crate) healthy_threshold: Option<NonZeroU32>,
}
