//! `[cluster.<name>]` tables: defaults, endpoint resolution and the cross-field checks.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::kind_keys::{refuse_foreign, reverse_keys};
use super::{reverse, Ctx};
use crate::error::ConfigError;
use crate::model::{
    Cluster, ClusterKind, Ejection, HealthCheck, LbPolicy, PoolOptions, StaticCluster,
    StaticOptions,
};
use crate::raw::{RawCluster, RawEjection, RawHealthCheck, RawKind, RawLb, RawPool};

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
            .map(|h| health_check(ctx, h.into_inner()))
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
    };
    Ok(StaticCluster {
        endpoints: endpoints(ctx, raw_endpoints)?,
        options,
    })
}

/// Resolves every endpoint now: a name that resolves to several addresses becomes several
/// endpoints (as in NGINX's `upstream`), duplicates dropped.
fn endpoints(
    ctx: Ctx<'_>,
    raw: &Spanned<Vec<Spanned<String>>>,
) -> Result<Vec<SocketAddr>, ConfigError> {
    if raw.get_ref().is_empty() {
        return Err(ctx.err(
            raw.span(),
            "`endpoints` is empty; list at least one \"host:port\"",
        ));
    }
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

fn health_check(ctx: Ctx<'_>, raw: RawHealthCheck) -> Result<HealthCheck, ConfigError> {
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
    })
}
