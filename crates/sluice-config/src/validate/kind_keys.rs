//! The keys of a `[cluster.NAME]` table that belong to one kind only, so that each kind's
//! validation can refuse the other's.

use std::ops::Range;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::raw::RawCluster;

/// Refuses the first key in `keys` that is set, as not applying to `kind`.
pub(super) fn refuse_foreign(
    ctx: Ctx<'_>,
    kind: &str,
    keys: &[(&str, Option<Range<usize>>)],
) -> Result<(), ConfigError> {
    match keys.iter().find_map(|(k, span)| Some((k, span.clone()?))) {
        Some((key, span)) => Err(ctx.err(
            span,
            format!("`{key}` does not apply to a cluster of kind = \"{kind}\""),
        )),
        None => Ok(()),
    }
}

/// The static-only keys that are set, with their spans.
pub(super) fn static_keys(raw: &RawCluster) -> [(&'static str, Option<Range<usize>>); 10] {
    [
        ("endpoints", raw.endpoints.as_ref().map(Spanned::span)),
        ("lb", raw.lb.as_ref().map(Spanned::span)),
        (
            "connect_timeout",
            raw.connect_timeout.as_ref().map(Spanned::span),
        ),
        ("pool", raw.pool.as_ref().map(Spanned::span)),
        ("ejection", raw.ejection.as_ref().map(Spanned::span)),
        ("health_check", raw.health_check.as_ref().map(Spanned::span)),
        ("tls", raw.tls.as_ref().map(Spanned::span)),
        ("protocol", raw.protocol.as_ref().map(Spanned::span)),
        ("h2", raw.h2.as_ref().map(Spanned::span)),
        ("resolve", raw.resolve.as_ref().map(Spanned::span)),
    ]
}

/// The reverse-only keys that are set, with their spans.
pub(super) fn reverse_keys(raw: &RawCluster) -> [(&'static str, Option<Range<usize>>); 11] {
    [
        ("handoff", raw.handoff.as_ref().map(Spanned::span)),
        ("handoff_idle", raw.handoff_idle.as_ref().map(Spanned::span)),
        ("tokens", raw.tokens.as_ref().map(Spanned::span)),
        ("queue_max", raw.queue_max.as_ref().map(Spanned::span)),
        (
            "queue_timeout",
            raw.queue_timeout.as_ref().map(Spanned::span),
        ),
        (
            "no_sessions_wait",
            raw.no_sessions_wait.as_ref().map(Spanned::span),
        ),
        ("startup_wait", raw.startup_wait.as_ref().map(Spanned::span)),
        (
            "max_sessions_per_instance",
            raw.max_sessions_per_instance.as_ref().map(Spanned::span),
        ),
        ("max_sessions", raw.max_sessions.as_ref().map(Spanned::span)),
        (
            "request_buffer",
            raw.request_buffer.as_ref().map(Spanned::span),
        ),
        (
            "response_buffer",
            raw.response_buffer.as_ref().map(Spanned::span),
        ),
    ]
}
