//! `[[route]]` entries: the match, the action, the rewrite and the header edits.

use std::collections::BTreeMap;

use toml::Spanned;

use super::rewrite::{rewrite, status_and_location};
use super::{secret, Ctx};
use crate::error::ConfigError;
use crate::model::{
    Action, Cluster, DirectResponse, HeaderEdits, HostMatch, Match, RateLimitService, Rewrite,
    Route,
};
use crate::raw::{RawDirectResponse, RawHeaderEdits, RawRewrite, RawRoute};
use crate::values::HeaderTable;
use crate::values::OneOrMany;

/// Validates every route, in file order (the first match wins at runtime).
pub(super) fn routes(
    ctx: Ctx<'_>,
    raw: Vec<Spanned<RawRoute>>,
    clusters: &BTreeMap<String, Cluster>,
    services: &BTreeMap<String, RateLimitService>,
) -> Result<Vec<Route>, ConfigError> {
    super::cache::one_route_per_directory(ctx, &raw)?;
    raw.into_iter()
        .enumerate()
        .map(|(i, r)| route(ctx, i + 1, r, (clusters, services)))
        .collect()
}

fn route(
    ctx: Ctx<'_>,
    index: usize,
    raw: Spanned<RawRoute>,
    (clusters, services): (
        &BTreeMap<String, Cluster>,
        &BTreeMap<String, RateLimitService>,
    ),
) -> Result<Route, ConfigError> {
    let span = raw.span();
    let mut raw = raw.into_inner();
    let name = raw.name.take().unwrap_or_else(|| format!("route-{index}"));
    let action = match (raw.cluster.take(), raw.direct_response.take()) {
        (Some(cluster), None) => proxy(ctx, cluster, clusters)?,
        (None, Some(direct)) => Action::Direct(direct_response(ctx, direct)?),
        (Some(cluster), Some(_)) => {
            let msg = format!("route `{name}` has both `cluster` and `direct_response`; keep one");
            return Err(ctx.err(cluster.span(), msg));
        }
        (None, None) => {
            let msg = format!("route `{name}` needs either `cluster` or `direct_response`");
            return Err(ctx.err(span, msg));
        }
    };
    let rewrite = match raw.rewrite.take() {
        Some(r) => Some(route_rewrite(ctx, r, &action, raw.case_insensitive)?),
        None => None,
    };
    Ok(Route {
        max_request_body: super::max_request_body(ctx, raw.max_request_body.take())?,
        rate_limit: raw
            .rate_limit
            .take()
            .map(|r| super::rate_limit::rate_limit(ctx, r))
            .transpose()?,
        global_rate_limit: raw
            .global_rate_limit
            .take()
            .map(|g| super::global_rate_limit::global_rate_limit(ctx, g, services))
            .transpose()?,
        basic_auth: raw
            .basic_auth
            .take()
            .map(|a| super::basic_auth::basic_auth(ctx, a))
            .transpose()?,
        cors: raw
            .cors
            .take()
            .map(|c| super::cors::cors(ctx, c))
            .transpose()?,
        rewrite,
        cache: match raw.cache.take() {
            Some(c) => super::cache::cache(ctx, c, &action)?,
            None => None,
        },
        compression: match raw.compression.take() {
            Some(c) => super::compression::compression(ctx, c)?,
            None => None,
        },
        request_headers: edits(ctx, std::mem::take(&mut raw.request_headers))?,
        response_headers: edits(ctx, std::mem::take(&mut raw.response_headers))?,
        // `validate::slices` sets and checks the slice once every route exists.
        slice: crate::model::DEFAULT_SLICE.to_owned(),
        matcher: matcher(ctx, raw)?,
        action,
        name,
    })
}

fn proxy(
    ctx: Ctx<'_>,
    cluster: Spanned<String>,
    clusters: &BTreeMap<String, Cluster>,
) -> Result<Action, ConfigError> {
    if clusters.contains_key(cluster.get_ref()) {
        return Ok(Action::Proxy {
            cluster: cluster.into_inner(),
        });
    }
    let known: Vec<_> = clusters.keys().map(|k| format!("`{k}`")).collect();
    let known = if known.is_empty() {
        "none".to_owned()
    } else {
        known.join(", ")
    };
    let msg = format!(
        "unknown cluster `{}` (known clusters: {known})",
        cluster.get_ref()
    );
    Err(ctx.err(cluster.span(), msg))
}

fn direct_response(
    ctx: Ctx<'_>,
    raw: Spanned<RawDirectResponse>,
) -> Result<DirectResponse, ConfigError> {
    let span = raw.span();
    let mut raw = raw.into_inner();
    refuse_framing(ctx, &raw.headers)?;
    let (status, location) = status_and_location(ctx, &mut raw, span)?;
    Ok(DirectResponse {
        status,
        location,
        headers: secret::resolve_table(ctx, raw.headers)?,
        body: raw.body,
    })
}

/// A rewrite changes what is forwarded, or the path a redirect names: on an answer that is
/// neither it would do nothing, which is a mistake.
fn route_rewrite(
    ctx: Ctx<'_>,
    raw: Spanned<RawRewrite>,
    action: &Action,
    case_insensitive: bool,
) -> Result<Rewrite, ConfigError> {
    if let Action::Direct(DirectResponse { location: None, .. }) = action {
        let msg = "a rewrite applies to what a route forwards or redirects to; this \
                   direct_response has no `location`";
        return Err(ctx.err(raw.span(), msg));
    }
    rewrite(ctx, raw, case_insensitive)
}

/// Builds the match from what is left of the route once its action and edits are taken.
fn matcher(ctx: Ctx<'_>, raw: RawRoute) -> Result<Match, ConfigError> {
    if let Some(p) = raw
        .path_prefix
        .as_ref()
        .filter(|p| !p.get_ref().starts_with('/'))
    {
        let msg = format!("path_prefix `{}` must start with \"/\"", p.get_ref());
        return Err(ctx.err(p.span(), msg));
    }
    Ok(Match {
        hosts: OneOrMany::into_items(raw.host)
            .iter()
            .map(|h| host(ctx, h))
            .collect::<Result<_, _>>()?,
        path_prefix: raw.path_prefix.map(Spanned::into_inner),
        case_insensitive: raw.case_insensitive,
        methods: raw.methods.into_iter().map(|m| m.0).collect(),
        headers: raw.headers.0.into_iter().map(|(n, v)| (n.0, v.0)).collect(),
        client_cidrs: OneOrMany::into_items(raw.client_cidr)
            .into_iter()
            .map(|c| c.into_inner().0)
            .collect(),
    })
}

fn host(ctx: Ctx<'_>, raw: &Spanned<String>) -> Result<HostMatch, ConfigError> {
    HostMatch::parse(raw.get_ref()).map_err(|e| ctx.err(raw.span(), e))
}

fn edits(ctx: Ctx<'_>, raw: RawHeaderEdits) -> Result<HeaderEdits, ConfigError> {
    refuse_framing(ctx, &raw.set)?;
    Ok(HeaderEdits {
        set: secret::resolve_table(ctx, raw.set)?,
        remove: raw.remove.into_iter().map(|n| n.0).collect(),
    })
}

/// Headers that frame the message or steer the connection are Sluice's to write: setting them
/// from config would desynchronise the HTTP/1.1 stream with the client or the upstream.
const FRAMING_HEADERS: [&str; 7] = [
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

fn refuse_framing(ctx: Ctx<'_>, table: &HeaderTable<Spanned<String>>) -> Result<(), ConfigError> {
    match table
        .0
        .iter()
        .find(|(name, _)| FRAMING_HEADERS.contains(&name.0.as_str()))
    {
        Some((name, value)) => Err(ctx.err(
            value.span(),
            format!(
                "`{}` cannot be set: Sluice manages message framing and connection headers",
                name.0
            ),
        )),
        None => Ok(()),
    }
}
