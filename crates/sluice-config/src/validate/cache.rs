//! A route's `cache = true` or `{ memory, max_object, lock_timeout, valid, disk }`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{Action, Cache, CacheDisk, CacheValid};
use crate::raw::{RawCache, RawCacheDisk, RawRoute};
use crate::values::Dur;

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
        RawCache::Table(table) => Some(*table),
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
    let valid = raw.valid.map(|v| valid(ctx, v)).transpose()?;
    let disk = raw.disk.map(|d| disk(ctx, d, max_object)).transpose()?;
    Ok(Some(Cache {
        memory,
        max_object,
        lock_timeout,
        valid: valid.unwrap_or_default(),
        disk,
    }))
}

/// `valid = { "200" = "10m", any = "1m" }`: statuses a cache may store whole (200 to 599 but
/// 206 and 304) or `any`, each with a lifetime above zero.
fn valid(
    ctx: Ctx<'_>,
    raw: Spanned<BTreeMap<String, Spanned<Dur>>>,
) -> Result<CacheValid, ConfigError> {
    let span = raw.span();
    let mut out = CacheValid::default();
    for (status, lifetime) in raw.into_inner() {
        let (span_of_lifetime, lifetime) = (lifetime.span(), lifetime.into_inner().0);
        if lifetime.is_zero() {
            let msg = format!("`valid` gives `{status}` 0s: leave it out instead");
            return Err(ctx.err(span_of_lifetime, msg));
        }
        if status == "any" {
            out.any = Some(lifetime);
            continue;
        }
        match status.parse::<u16>() {
            Ok(code) if (200..=599).contains(&code) && code != 206 && code != 304 => {
                out.statuses.insert(code, lifetime);
            }
            _ => {
                let msg = format!(
                    "`valid` names `{status}`: a status from 200 to 599 (not 206 or 304), or `any`"
                );
                return Err(ctx.err(span, msg));
            }
        }
    }
    Ok(out)
}

/// `disk = { path, max_size }`: `max_size` holds at least one object of `max_object`.
fn disk(
    ctx: Ctx<'_>,
    raw: Spanned<RawCacheDisk>,
    max_object: u64,
) -> Result<CacheDisk, ConfigError> {
    let raw = raw.into_inner();
    if raw.path.get_ref().is_empty() {
        return Err(ctx.err(
            raw.path.span(),
            "`path` is empty: name the disk tier's directory",
        ));
    }
    let max_size = raw
        .max_size
        .as_ref()
        .map_or(CacheDisk::DEFAULT_MAX_SIZE, |m| m.get_ref().0 as u64);
    if let Some(m) = raw.max_size.as_ref().filter(|_| max_size < max_object) {
        let msg = format!(
            "`max_size` must hold one object of `max_object` ({max_object} bytes) at least"
        );
        return Err(ctx.err(m.span(), msg));
    }
    Ok(CacheDisk {
        path: ctx.resolve(raw.path.get_ref()),
        max_size,
    })
}

/// Refuses a disk tier's directory named by two routes: each tier removes the files it
/// does not know, so two would evict each other's.
pub(super) fn one_route_per_directory(
    ctx: Ctx<'_>,
    routes: &[Spanned<RawRoute>],
) -> Result<(), ConfigError> {
    let mut seen: HashMap<PathBuf, usize> = HashMap::new();
    for (i, route) in routes.iter().enumerate() {
        let Some(RawCache::Table(table)) = route.get_ref().cache.as_ref().map(|c| c.get_ref())
        else {
            continue;
        };
        let Some(disk) = &table.disk else {
            continue;
        };
        let path = &disk.get_ref().path;
        if let Some(first) = seen.insert(ctx.resolve(path.get_ref()), i + 1) {
            let msg = format!(
                "`{}` is the disk tier of route {first} already: give each cache a directory of its own",
                path.get_ref()
            );
            return Err(ctx.err(path.span(), msg));
        }
    }
    Ok(())
}
