//! `kind = "reverse"` clusters: tokens, queue, limits and buffers.

use toml::Spanned;

use super::kind_keys::{refuse_foreign, static_keys};
use super::{secret, Ctx};
use crate::error::ConfigError;
use crate::model::{ReverseCluster, ReverseOptions, SessionSource, Token};
use crate::raw::RawCluster;

/// Buffers above this would let a few requests pin a lot of memory.
const MAX_BUFFER: usize = 64 * 1024 * 1024;

/// Validates a reverse cluster; unset keys take [`ReverseOptions::default`]'s values.
pub(super) fn cluster(
    ctx: Ctx<'_>,
    name: &str,
    raw: RawCluster,
) -> Result<ReverseCluster, ConfigError> {
    refuse_foreign(ctx, "reverse", &static_keys(&raw))?;
    let d = ReverseOptions::default();
    let options = ReverseOptions {
        queue_max: raw.queue_max.map_or(d.queue_max, Spanned::into_inner),
        queue_timeout: raw
            .queue_timeout
            .map_or(d.queue_timeout, |t| t.into_inner().0),
        no_sessions_wait: raw
            .no_sessions_wait
            .map_or(d.no_sessions_wait, |t| t.into_inner().0),
        startup_wait: raw
            .startup_wait
            .map_or(d.startup_wait, |t| t.into_inner().0),
        max_sessions_per_instance: unlimited_if_zero(raw.max_sessions_per_instance),
        max_sessions: unlimited_if_zero(raw.max_sessions),
        response_timeout: raw.response_timeout.map_or(d.response_timeout, |t| t.0),
        request_buffer: buffer(ctx, raw.request_buffer, d.request_buffer, "request_buffer")?,
        response_buffer: buffer(
            ctx,
            raw.response_buffer,
            d.response_buffer,
            "response_buffer",
        )?,
        retry: super::retry::retry(ctx, "reverse", raw.retry, d.retry.clone())?,
    };
    let source = match (raw.handoff, raw.handoff_idle) {
        (Some(path), idle) => SessionSource::Handoff {
            path: ctx.resolve(path.get_ref()),
            idle: idle
                .map_or(DEFAULT_HANDOFF_IDLE, Spanned::into_inner)
                .max(1),
        },
        (None, Some(idle)) => {
            return Err(ctx.err(
                idle.span(),
                "`handoff_idle` needs `handoff` (the acceptor's socket)",
            ))
        }
        (None, None) => SessionSource::Acceptor,
    };
    Ok(ReverseCluster {
        tokens: tokens(ctx, name, raw.tokens)?,
        options,
        source,
    })
}

/// Idle sessions a consumer keeps per slice unless `handoff_idle` says otherwise.
const DEFAULT_HANDOFF_IDLE: usize = 4;

fn unlimited_if_zero(raw: Option<Spanned<usize>>) -> Option<usize> {
    raw.map(Spanned::into_inner).filter(|&n| n > 0)
}

fn buffer(
    ctx: Ctx<'_>,
    raw: Option<Spanned<crate::values::Size>>,
    default: usize,
    key: &str,
) -> Result<usize, ConfigError> {
    match raw {
        None => Ok(default),
        Some(size) if size.get_ref().0 <= MAX_BUFFER => Ok(size.get_ref().0),
        Some(size) => Err(ctx.err(size.span(), format!("{key} must be at most 64MiB"))),
    }
}

/// Each token is a literal or an `env:`/`file:` secret; none may be empty.
fn tokens(
    ctx: Ctx<'_>,
    cluster: &str,
    raw: Option<Spanned<Vec<Spanned<String>>>>,
) -> Result<Vec<Token>, ConfigError> {
    let raw = raw.map(Spanned::into_inner).unwrap_or_default();
    raw.iter()
        .map(|t| {
            let value = secret::resolve(ctx, t)?;
            if value.is_empty() {
                let msg = format!("a token of cluster `{cluster}` is empty");
                return Err(ctx.err(t.span(), msg));
            }
            Ok(Token(value.as_bytes().to_vec()))
        })
        .collect()
}
