//! `[cluster.<name>]` tables: defaults, endpoint resolution and the cross-field checks.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::dns::Endpoint;
use super::kind_keys::{refuse_foreign, reverse_keys};
use super::{reverse, Ctx};
use crate::error::ConfigError;
use crate::model::{
    Cluster, ClusterKind, Ejection, H2Options, HealthCheck, HostPort, LbPolicy, PoolOptions,
    StaticCluster, StaticOptions, UpstreamProtocol,
};
use crate::raw::{
    RawCluster, RawEjection, RawH2, RawHealthCheck, RawKind, RawLb, RawPool, RawProtocol,
};

const DEFAULT_HEALTH_PATH: &str = "/healthz";
const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 3;
const DEFAULT_HEALTHY_THRESHOLD: u32 = 2;

/// Validates every cluster; names are unique by construction (TOML rejects duplicate tables).
pub(super) fn clusters(
    ctx: Ctx<'_>,
    raw: BTreeMap<Spanned<String>, RawCluster>,
) -> Result<BTreeMap<String, Cluster>, ConfigError> {
    raw.into_iter()
        .map(|(name, c)| {
            let span = name.span();
            let name = name.into_inner();
            let kind = match c.kind {
                RawKind::Static => ClusterKind::Static(static_cluster(ctx, span, &name, c)?),
                RawKind::Reverse => ClusterKind::Reverse(reverse::cluster(ctx, &name, c)?),
            };
            Ok((name.clone(), Cluster { name, kind }))
        })
        .collect()
}

/// Unset keys take [`StaticOptions::default`]'s values.
fn static_cluster(
    ctx: Ctx<'_>,
    name_span: Range<usize>,
    name: &str,
    raw: RawCluster,
) -> Result<StaticCluster, ConfigError> {
    refuse_foreign(ctx, "static", &reverse_keys(&raw))?;
    let Some(raw_endpoints) = &raw.endpoints else {
        let msg = format!("static cluster `{name}` needs `endpoints = [\"host:port\", ...]`");
        return Err(ctx.err(name_span, msg));
    };
    let defaults = StaticOptions::default();
    let protocol = protocol(ctx, raw.protocol, raw.tls.is_some())?;
    if let (UpstreamProtocol::Http1, Some(h2)) = (protocol, &raw.h2) {
        let msg = "`h2` settings need `protocol = \"h2\"`, \"h2c\" or \"auto\"";
        return Err(ctx.err(h2.span(), msg));
    }
    let options = StaticOptions {
        lb: lb(raw.lb.map(Spanned::into_inner)),
        connect_timeout: raw
            .connect_timeout
            .map_or(defaults.connect_timeout, |t| t.into_inner().0),
        response_timeout: raw
            .response_timeout
            .map_or(defaults.response_timeout, |t| t.0),
        pool: pool(raw.pool.map(Spanned::into_inner).unwrap_or_default()),
        ejection: ejection(
            ctx,
            raw.ejection.map(Spanned::into_inner).unwrap_or_default(),
        )?,
        health_check: raw
            .health_check
            .map(|h| health_check(ctx, h.into_inner(), protocol))
            .transpose()?,
        tls: raw
            .tls
            .map(|t| {
                let first = raw_endpoints
                    .get_ref()
                    .first()
                    .map(|e| e.get_ref().as_str());
                super::tls::upstream(ctx, t, first)
            })
            .transpose()?,
        retry: super::retry::retry(ctx, "static", raw.retry, defaults.retry.clone())?,
        protocol,
        h2: h2(ctx, raw.h2)?,
        resolve: super::dns::resolve(ctx, raw.resolve)?,
    };
    let (endpoints, names) = match options.resolve {
        Some(_) => followed(ctx, raw_endpoints)?,
        None => (endpoints(ctx, raw_endpoints)?, Vec::new()),
    };
    Ok(StaticCluster {
        endpoints,
        names,
        options,
    })
}

/// `protocol`, checked against whether the cluster speaks TLS.
fn protocol(
    ctx: Ctx<'_>,
    raw: Option<Spanned<RawProtocol>>,
    tls: bool,
) -> Result<UpstreamProtocol, ConfigError> {
    let Some(raw) = raw else {
        return Ok(UpstreamProtocol::Http1);
    };
    let span = raw.span();
    match (raw.into_inner(), tls) {
        (RawProtocol::H2, false) => Err(ctx.err(
            span,
            "`protocol = \"h2\"` is HTTP/2 over TLS: add `tls = { .. }`, or use \"h2c\" for HTTP/2 in cleartext",
        )),
        (RawProtocol::H2c, true) => Err(ctx.err(
            span,
            "`protocol = \"h2c\"` is HTTP/2 in cleartext: with `tls`, use \"h2\" (or \"auto\")",
        )),
        (RawProtocol::Http1, _) => Ok(UpstreamProtocol::Http1),
        (RawProtocol::H2, true) => Ok(UpstreamProtocol::H2),
        (RawProtocol::H2c, false) => Ok(UpstreamProtocol::H2c),
        (RawProtocol::Auto, _) => Ok(UpstreamProtocol::Auto),
    }
}

/// `h2 = { max_connections, max_streams, keepalive_interval, keepalive_timeout }`.
fn h2(ctx: Ctx<'_>, raw: Option<Spanned<RawH2>>) -> Result<H2Options, ConfigError> {
    let d = H2Options::default();
    let Some(raw) = raw else {
        return Ok(d);
    };
    let raw = raw.into_inner();
    let at_least_one = |v: Option<Spanned<usize>>, default: usize, key: &str| match v {
        Some(v) if *v.get_ref() == 0 => Err(ctx.err(v.span(), format!("`{key}` is at least 1"))),
        v => Ok(v.map_or(default, Spanned::into_inner)),
    };
    Ok(H2Options {
        max_connections: at_least_one(raw.max_connections, d.max_connections, "max_connections")?,
        max_streams: at_least_one(raw.max_streams, d.max_streams, "max_streams")?,
        keepalive_interval: raw.keepalive_interval.map_or(d.keepalive_interval, |t| t.0),
        keepalive_timeout: raw.keepalive_timeout.map_or(d.keepalive_timeout, |t| t.0),
    })
}

/// `endpoints` of a cluster with `resolve`: the addresses, and the names the proxy looks up
/// itself (when it starts, and as their TTLs say), not the configuration's loader; duplicates
/// dropped.
fn followed(
    ctx: Ctx<'_>,
    raw: &Spanned<Vec<Spanned<String>>>,
) -> Result<(Vec<SocketAddr>, Vec<HostPort>), ConfigError> {
    not_empty(ctx, raw)?;
    let (mut addrs, mut names) = (Vec::new(), Vec::new());
    for endpoint in raw.get_ref() {
        let parsed = super::dns::endpoint(endpoint.get_ref());
        match parsed.map_err(|why| ctx.err(endpoint.span(), why))? {
            Endpoint::Addr(a) if !addrs.contains(&a) => addrs.push(a),
            Endpoint::Name(n) if !names.contains(&n) => names.push(n),
            _ => {}
        }
    }
    Ok((addrs, names))
}

fn not_empty(ctx: Ctx<'_>, raw: &Spanned<Vec<Spanned<String>>>) -> Result<(), ConfigError> {
    match raw.get_ref().is_empty() {
        true => Err(ctx.err(
            raw.span(),
            "`endpoints` is empty; list at least one \"host:port\"",
        )),
        false => Ok(()),
    }
}

/// Resolves every endpoint now: a name that resolves to several addresses becomes several
/// endpoints (as in NGINX's `upstream`), duplicates dropped.
fn endpoints(
    ctx: Ctx<'_>,
    raw: &Spanned<Vec<Spanned<String>>>,
) -> Result<Vec<SocketAddr>, ConfigError> {
    not_empty(ctx, raw)?;
    let mut all = Vec::new();
    for endpoint in raw.get_ref() {
        for addr in resolve(ctx, endpoint)? {
            if !all.contains(&addr) {
                all.push(addr);
            }
        }
    }
    Ok(all)
}

fn resolve(ctx: Ctx<'_>, endpoint: &Spanned<String>) -> Result<Vec<SocketAddr>, ConfigError> {
    crate::values::resolve_endpoint(endpoint.get_ref()).map_err(|why| ctx.err(endpoint.span(), why))
}

fn lb(raw: Option<RawLb>) -> LbPolicy {
    match raw.unwrap_or(RawLb::P2c) {
        RawLb::P2c => LbPolicy::P2c,
        RawLb::RoundRobin => LbPolicy::RoundRobin,
        RawLb::Random => LbPolicy::Random,
        RawLb::LeastRequest => LbPolicy::LeastRequest,
    }
}

fn pool(raw: RawPool) -> PoolOptions {
    let defaults = PoolOptions::default();
    PoolOptions {
        idle_timeout: raw.idle_timeout.map_or(defaults.idle_timeout, |t| t.0),
        // 0 is meaningful: no pooling at all.
        max_idle_per_endpoint: raw
            .max_idle_per_endpoint
            .unwrap_or(defaults.max_idle_per_endpoint),
        max_requests_per_connection: raw.max_requests_per_connection.filter(|&n| n > 0),
    }
}

fn ejection(ctx: Ctx<'_>, raw: RawEjection) -> Result<Ejection, ConfigError> {
    let defaults = Ejection::default();
    let backoff = raw.backoff.map_or(defaults.backoff, |t| t.0);
    let max_backoff = match raw.max_backoff {
        // A long `backoff` alone must not make the default maximum invalid.
        None => defaults.max_backoff.max(backoff),
        Some(max) if max.get_ref().0 < backoff => {
            return Err(ctx.err(max.span(), "ejection max_backoff is shorter than backoff"));
        }
        Some(max) => max.into_inner().0,
    };
    Ok(Ejection {
        backoff,
        max_backoff,
    })
}

fn health_check(
    ctx: Ctx<'_>,
    raw: RawHealthCheck,
    protocol: UpstreamProtocol,
) -> Result<HealthCheck, ConfigError> {
    if let Some(service) = &raw.grpc_service {
        if let Some(path) = &raw.path {
            let msg = "a gRPC health check calls grpc.health.v1.Health/Check: drop `path`, or `grpc_service` for a GET of it";
            return Err(ctx.err(path.span(), msg));
        }
        if protocol == UpstreamProtocol::Http1 {
            let msg = "gRPC runs over HTTP/2: set the cluster's `protocol = \"h2c\"` (or \"h2\", \"auto\")";
            return Err(ctx.err(service.span(), msg));
        }
    }
    let path = match raw.path {
        None => DEFAULT_HEALTH_PATH.to_owned(),
        Some(p) if p.get_ref().starts_with('/') => p.into_inner(),
        Some(p) => return Err(ctx.err(p.span(), "health_check path must start with \"/\"")),
    };
    Ok(HealthCheck {
        path,
        interval: raw.interval.map_or(DEFAULT_HEALTH_INTERVAL, |t| t.0),
        timeout: raw.timeout.map_or(DEFAULT_HEALTH_TIMEOUT, |t| t.0),
        unhealthy_threshold: raw
            .unhealthy_threshold
            .map_or(DEFAULT_UNHEALTHY_THRESHOLD, u32::from),
        healthy_threshold: raw
            .healthy_threshold
            .map_or(DEFAULT_HEALTHY_THRESHOLD, u32::from),
        grpc_service: raw.grpc_service.map(Spanned::into_inner),
    })
}
