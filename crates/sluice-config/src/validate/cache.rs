//! A route's `cache = true` or `{ memory, max_object, lock_timeout }`.

use std::time::Duration;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{Action, Cache};
use crate::raw::RawCache;

/// The longest `lock_timeout`: a waiting client is not held longer than this.
const MAX_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// `None` for `cache = false`.
pub(super) fn cache(
    ctx: Ctx<'_>,
    raw: Spanned<RawCache>,
    action: &Action,
) -> Result<Option<Cache>, ConfigError> {
    let span = raw.span();
    let table = match raw.into_inner() {
        RawCache::On(false) => return Ok(None),
        RawCache::On(true) => None,
        RawCache::Table(table) => Some(table),
    };
    if matches!(action, Action::Direct(_)) {
        let msg = "`cache` needs a `cluster`: a `direct_response` is answered without one";
        return Err(ctx.err(span, msg));
    }
    let Some(raw) = table else {
        return Ok(Some(Cache::default()));
    };
    let defaults = Cache::default();
    let memory = raw
        .memory
        .as_ref()
        .map_or(defaults.memory, |m| m.get_ref().0 as u64);
    if let Some(m) = raw.memory.as_ref().filter(|m| m.get_ref().0 == 0) {
        return Err(ctx.err(m.span(), "`memory` is 0: the cache could store nothing"));
    }
    let max_object = raw
        .max_object
        .as_ref()
        .map_or(defaults.max_object.min(memory), |m| m.get_ref().0 as u64);
    if let Some(m) = raw.max_object.as_ref() {
        if max_object == 0 || max_object > memory {
            let msg = format!("`max_object` must be between 1 byte and `memory` ({memory} bytes)");
            return Err(ctx.err(m.span(), msg));
        }
    }
    let lock_timeout = raw
        .lock_timeout
        .as_ref()
        .map_or(defaults.lock_timeout, |t| t.get_ref().0);
    if let Some(t) = raw
        .lock_timeout
        .as_ref()
        .filter(|_| lock_timeout > MAX_LOCK_TIMEOUT)
    {
        let msg = "`lock_timeout` is at most 60s: a waiting client is not held longer";
        return Err(ctx.err(t.span(), msg));
    }
    Ok(Some(Cache {
        memory,
        max_object,
        lock_timeout,
    }))
}
