//! Raw → model: the checks that need more than one value, the defaults, and the reading of
//! files and secrets. Stops at the first problem.

mod acceptor;
mod basic_auth;
mod cache;
mod cluster;
mod compression;
mod cors;
mod dns;
mod global_rate_limit;
mod handoff;
mod kind_keys;
mod rate_limit;
mod relay;
mod retry;
mod reverse;
mod rewrite;
mod route;
mod secret;
mod tls;
mod tracing;

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_wire::fields::Kind;

use crate::error::ConfigError;
use crate::model::{
    AccessLog, AccessLogFormat, AccessLogTarget, Admin, Config, EscapedSlashes, Http3, HttpOptions,
    Listener, LogTemplate, RequestId, RequestRules, Runtime, Token, Underscores,
};
use crate::raw::{
    RawAccessLog, RawAdmin, RawConfig, RawEscapedSlashes, RawListener, RawRequestId, RawRuntime,
    RawUnderscores,
};

const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(20);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_MAX_HEADER: usize = 16 * 1024;
/// Below 1 KiB ordinary browsers' requests would get 431; above 1 MiB is a memory hazard.
const MAX_HEADER_RANGE: std::ops::RangeInclusive<usize> = 1024..=1024 * 1024;

/// What every check needs to report a problem and to find files.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// The file's text, to turn spans into line:col.
    pub(crate) text: &'a str,
    /// The name errors start with.
    pub(crate) origin: &'a str,
    /// The directory relative paths are resolved against.
    pub(crate) base_dir: &'a Path,
    /// Whether `env:`/`file:` secrets are read; false checks only their form, so that a file
    /// can be validated where its secrets are not (CI, `sluice check --no-secrets`).
    pub(crate) read_secrets: bool,
}

impl Ctx<'_> {
    /// An error at `span`.
    pub(crate) fn err(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        ConfigError::at(self.origin, self.text, &span, message)
    }

    /// `path` if absolute, else joined to the config file's directory.
    pub(crate) fn resolve(&self, path: &str) -> PathBuf {
        self.base_dir.join(path)
    }
}

/// Validates a deserialized file into the runtime model.
pub(crate) fn validate(ctx: Ctx<'_>, mut raw: RawConfig) -> Result<Config, ConfigError> {
    let handoff = raw
        .handoff
        .map(|h| handoff::handoff(ctx, h.into_inner()))
        .transpose()?;
    let admin = raw.admin.map(|a| admin(ctx, a)).transpose()?;
    let access_log = raw.access_log.map(|a| access_log(ctx, a)).transpose()?;
    let request_id = raw.request_id.map(|r| request_id(ctx, r)).transpose()?;
    let tracing = raw.tracing.map(|t| tracing::tracing(ctx, t)).transpose()?;
    // A standalone acceptor's file (`[handoff]`) needs no listener, nor does a relay's.
    let no_listener_needed = handoff.is_some() || !raw.relay.is_empty();
    let listeners = listeners(ctx, raw.listener, no_listener_needed)?;
    let dns = dns::dns(ctx, raw.dns)?;
    let relays = relay::relays(ctx, raw.relay, &dns)?;
    let acceptor = acceptor::acceptor(ctx, raw.acceptor, &raw.cluster)?;
    let clusters = cluster::clusters(ctx, raw.cluster)?;
    // Taken out before the routes are built so their spans survive for `acceptor::slices`.
    let slices = raw
        .route
        .iter_mut()
        .map(|r| r.get_mut().slice.take())
        .collect();
    let rate_limit_services = global_rate_limit::services(ctx, raw.rate_limit_service)?;
    let mut routes = route::routes(ctx, raw.route, &clusters, &rate_limit_services)?;
    acceptor::slices(ctx, &mut routes, slices, &clusters)?;
    Ok(Config {
        source: ctx.origin.to_owned(),
        runtime: runtime(ctx, raw.runtime),
        acceptor,
        handoff,
        admin,
        access_log,
        request_id,
        tracing,
        listeners,
        routes,
        clusters,
        relays,
        rate_limit_services,
        dns,
    })
}

fn runtime(ctx: Ctx<'_>, raw: RawRuntime) -> Runtime {
    Runtime {
        workers: raw.workers.map(usize::from),
        shutdown_grace: raw.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0),
        upgrade_socket: raw.upgrade_socket.map(|p| ctx.resolve(p.get_ref())),
    }
}

/// `[admin]`: a token is required unless the listener is on loopback.
fn admin(ctx: Ctx<'_>, raw: toml::Spanned<RawAdmin>) -> Result<Admin, ConfigError> {
    let raw = raw.into_inner();
    let addr = raw.listen.get_ref().0;
    let token = match &raw.token {
        Some(t) => {
            let value = secret::resolve(ctx, t)?;
            if value.is_empty() {
                return Err(ctx.err(t.span(), "the admin token is empty"));
            }
            Some(Token(value.as_bytes().to_vec()))
        }
        None if addr.ip().is_loopback() => None,
        None => {
            let msg = format!(
                "the admin API on {addr} is reachable from other hosts: set `token` (e.g. \"env:SLUICE_ADMIN_TOKEN\") or listen on 127.0.0.1"
            );
            return Err(ctx.err(raw.listen.span(), msg));
        }
    };
    Ok(Admin {
        addr,
        token,
        read_only: raw.read_only.unwrap_or(false),
    })
}

fn access_log(ctx: Ctx<'_>, raw: RawAccessLog) -> Result<AccessLog, ConfigError> {
    let format = match &raw.format {
        None => AccessLogFormat::Common,
        Some(format) => access_log_format(ctx, format)?,
    };
    let target = match raw.path.as_deref() {
        None | Some("stdout") => AccessLogTarget::Stdout,
        Some(path) => AccessLogTarget::File(ctx.resolve(path)),
    };
    Ok(AccessLog { format, target })
}

/// `[request_id]`: the field's name, which must be one the proxy leaves to requests.
fn request_id(ctx: Ctx<'_>, raw: RawRequestId) -> Result<RequestId, ConfigError> {
    let Some(name) = raw.header else {
        let header = http::HeaderName::from_static("x-request-id");
        return Ok(RequestId { header });
    };
    let header = http::HeaderName::from_bytes(name.get_ref().as_bytes()).map_err(|_| {
        ctx.err(
            name.span(),
            format!("invalid field name `{}`", name.get_ref()),
        )
    })?;
    let owned = sluice_wire::fields::kind(header.as_str().as_bytes()) != Kind::Other;
    if owned {
        let msg = format!("`{header}` is a field the proxy sets or removes itself; name another (e.g. x-request-id)");
        return Err(ctx.err(name.span(), msg));
    }
    Ok(RequestId { header })
}

/// `common`, `combined`, `json`, or a template with `{fields}`.
fn access_log_format(
    ctx: Ctx<'_>,
    raw: &toml::Spanned<String>,
) -> Result<AccessLogFormat, ConfigError> {
    Ok(match raw.get_ref().as_str() {
        "common" => AccessLogFormat::Common,
        "combined" => AccessLogFormat::Combined,
        "json" => AccessLogFormat::Json,
        text if text.contains(['{', '}']) => {
            let template = LogTemplate::parse(text).map_err(|e| ctx.err(raw.span(), e))?;
            AccessLogFormat::Template(template)
        }
        other => {
            let msg = format!("unknown access log format `{other}`: common, combined, json, or a template with {{fields}} (docs/access-log.md)");
            return Err(ctx.err(raw.span(), msg));
        }
    })
}

fn listeners(
    ctx: Ctx<'_>,
    raw: Vec<RawListener>,
    none_needed: bool,
) -> Result<Vec<Listener>, ConfigError> {
    if raw.is_empty() && !none_needed {
        return Err(ConfigError::new(
            ctx.origin,
            "no listener: add at least one [[listener]] with `name` and `listen`",
        ));
    }
    let mut names = HashMap::new();
    let mut addrs = HashMap::new();
    raw.into_iter()
        .map(|l| {
            unique(
                ctx,
                &mut names,
                l.name.get_ref(),
                l.name.span(),
                "listener name",
            )?;
            let addr = l.listen.get_ref().0;
            // Port 0 asks the kernel for a free port, a different one for each listener.
            if addr.port() != 0 {
                unique(ctx, &mut addrs, &addr, l.listen.span(), "listen address")?;
            }
            listener(ctx, l)
        })
        .collect()
}

/// Records `key`, or fails if an earlier entry already used it.
pub(crate) fn unique<K>(
    ctx: Ctx<'_>,
    seen: &mut HashMap<K, usize>,
    key: &K,
    span: Range<usize>,
    what: &str,
) -> Result<(), ConfigError>
where
    K: std::hash::Hash + Eq + Clone + std::fmt::Display,
{
    if let Some(first) = seen.get(key) {
        let (line, _) = crate::error::line_col(ctx.text, *first);
        return Err(ctx.err(
            span,
            format!("duplicate {what} `{key}` (first used on line {line})"),
        ));
    }
    seen.insert(key.clone(), span.start);
    Ok(())
}

/// `max_request_body`: at least a byte (leave it out for no limit).
pub(crate) fn max_request_body(
    ctx: Ctx<'_>,
    raw: Option<toml::Spanned<crate::values::Size>>,
) -> Result<Option<u64>, ConfigError> {
    match raw {
        None => Ok(None),
        Some(size) if size.get_ref().0 == 0 => Err(ctx.err(
            size.span(),
            "max_request_body must be at least 1 byte; leave it out for no limit",
        )),
        Some(size) => Ok(Some(size.get_ref().0 as u64)),
    }
}

/// A limit that must let at least one through (leave it out for no limit).
fn at_least_one<T: Copy + PartialEq + From<u8>>(
    ctx: Ctx<'_>,
    raw: Option<toml::Spanned<T>>,
    key: &str,
) -> Result<Option<T>, ConfigError> {
    match raw {
        Some(n) if *n.get_ref() == T::from(0) => {
            let msg = format!("{key} must be at least 1; leave it out for no limit");
            Err(ctx.err(n.span(), msg))
        }
        n => Ok(n.map(|n| *n.get_ref())),
    }
}

/// A listener's HTTP/3: `http3 = true` on a TLS listener; the `http3_*` keys only with it.
fn http3(ctx: Ctx<'_>, raw: &RawListener) -> Result<Option<Http3>, ConfigError> {
    let on = raw.http3.as_ref().filter(|on| *on.get_ref());
    let Some(on) = on else {
        let spans = [
            raw.http3_listen
                .as_ref()
                .map(|k| (k.span(), "http3_listen")),
            raw.http3_retry.as_ref().map(|k| (k.span(), "http3_retry")),
            raw.http3_max_streams
                .as_ref()
                .map(|k| (k.span(), "http3_max_streams")),
        ];
        return match spans.into_iter().flatten().next() {
            Some((span, key)) => Err(ctx.err(span, format!("{key} needs `http3 = true`"))),
            None => Ok(None),
        };
    };
    if raw.tls.is_none() {
        return Err(ctx.err(
            on.span(),
            "http3 needs TLS (QUIC is always encrypted): add `tls = { cert = \"…\", key = \"…\" }` to this listener",
        ));
    }
    let max_streams = at_least_one(ctx, raw.http3_max_streams.clone(), "http3_max_streams")?;
    Ok(Some(Http3 {
        addr: raw.http3_listen.as_ref().map(|a| a.get_ref().0),
        retry: raw.http3_retry.as_ref().is_some_and(|r| *r.get_ref()),
        max_streams: max_streams.unwrap_or(100),
    }))
}

fn listener(ctx: Ctx<'_>, raw: RawListener) -> Result<Listener, ConfigError> {
    let http3 = http3(ctx, &raw)?;
    let max_header_bytes = match raw.max_header_size {
        None => DEFAULT_MAX_HEADER,
        Some(size) if MAX_HEADER_RANGE.contains(&size.get_ref().0) => size.get_ref().0,
        Some(size) => {
            return Err(ctx.err(size.span(), "max_header_size must be between 1KiB and 1MiB"))
        }
    };
    Ok(Listener {
        http3,
        name: raw.name.into_inner(),
        addr: raw.listen.into_inner().0,
        tls: tls::listener(ctx, raw.tls)?,
        http: HttpOptions {
            http2: raw.http2.unwrap_or(true),
            fast_path: raw.fast_path.unwrap_or(true),
            own_http2: raw.own_http2,
            request_header_timeout: raw
                .request_header_timeout
                .map_or(DEFAULT_HEADER_TIMEOUT, |t| t.0),
            client_body_timeout: raw
                .client_body_timeout
                .map_or(DEFAULT_BODY_TIMEOUT, |t| t.0),
            idle_timeout: raw.idle_timeout.map_or(DEFAULT_IDLE_TIMEOUT, |t| t.0),
            max_header_bytes,
            max_request_body: max_request_body(ctx, raw.max_request_body)?,
            max_requests_per_connection: at_least_one(
                ctx,
                raw.max_requests_per_connection,
                "max_requests_per_connection",
            )?,
            max_connections_per_client: at_least_one(
                ctx,
                raw.max_connections_per_client,
                "max_connections_per_client",
            )?,
            trusted_proxies: raw.trusted_proxies.into_iter().map(|c| c.0).collect(),
            rules: RequestRules {
                escaped_slashes: match raw.escaped_slashes {
                    None | Some(RawEscapedSlashes::Reject) => EscapedSlashes::Reject,
                    Some(RawEscapedSlashes::Keep) => EscapedSlashes::Keep,
                    Some(RawEscapedSlashes::Unescape) => EscapedSlashes::Unescape,
                },
                underscores_in_headers: match raw.underscores_in_headers {
                    None | Some(RawUnderscores::Drop) => Underscores::Drop,
                    Some(RawUnderscores::Allow) => Underscores::Allow,
                    Some(RawUnderscores::Reject) => Underscores::Reject,
                },
            },
        },
    })
}
