//! A route's `compression = true` or `{ encodings, min_size, types, level }`.

use std::ops::RangeInclusive;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{Compression, Encoding, Levels};
use crate::raw::{RawCompression, RawCompressionTable, RawLevels};

/// `None` for `compression = false`.
pub(super) fn compression(
    ctx: Ctx<'_>,
    raw: RawCompression,
) -> Result<Option<Compression>, ConfigError> {
    let table = match raw {
        RawCompression::On(false) => return Ok(None),
        RawCompression::On(true) => return Ok(Some(Compression::default())),
        RawCompression::Table(table) => table,
    };
    table_of(ctx, table).map(Some)
}

fn table_of(ctx: Ctx<'_>, raw: RawCompressionTable) -> Result<Compression, ConfigError> {
    let defaults = Compression::default();
    let encodings = match raw.encodings {
        None => defaults.encodings,
        Some(list) => encodings(ctx, list)?,
    };
    let types = match raw.types {
        None => defaults.types,
        Some(list) => list
            .into_iter()
            .map(|t| media_range(t.get_ref()).map_err(|msg| ctx.err(t.span(), msg)))
            .collect::<Result<_, _>>()?,
    };
    Ok(Compression {
        encodings,
        min_size: raw.min_size.map_or(defaults.min_size, |s| s.0 as u64),
        types,
        levels: levels(ctx, raw.level.unwrap_or_default())?,
    })
}

fn encodings(
    ctx: Ctx<'_>,
    list: Spanned<Vec<Spanned<String>>>,
) -> Result<Vec<Encoding>, ConfigError> {
    let span = list.span();
    let mut out = Vec::new();
    for name in list.into_inner() {
        let encoding = encoding(name.get_ref()).map_err(|msg| ctx.err(name.span(), msg))?;
        if out.contains(&encoding) {
            let msg = format!("`{}` is listed twice", name.get_ref());
            return Err(ctx.err(name.span(), msg));
        }
        out.push(encoding);
    }
    if out.is_empty() {
        let msg = "`encodings` is empty: list at least one, or write `compression = false`";
        return Err(ctx.err(span, msg));
    }
    Ok(out)
}

fn encoding(name: &str) -> Result<Encoding, String> {
    match name {
        "zstd" => Ok(Encoding::Zstd),
        "br" => Ok(Encoding::Brotli),
        "gzip" => Ok(Encoding::Gzip),
        _ => Err(format!(
            "unknown encoding `{name}`: use \"zstd\", \"br\" or \"gzip\""
        )),
    }
}

/// `type/subtype` or `type/*`, lowercased; parameters are not part of it.
fn media_range(text: &str) -> Result<String, String> {
    let bad = || {
        format!("`{text}` is not a content type: write \"type/subtype\" or \"type/*\", e.g. \"text/*\", \"application/json\"")
    };
    let (kind, sub) = text.split_once('/').ok_or_else(bad)?;
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    if !token(kind) || !(sub == "*" || token(sub)) {
        return Err(bad());
    }
    Ok(text.to_ascii_lowercase())
}

fn levels(ctx: Ctx<'_>, raw: RawLevels) -> Result<Levels, ConfigError> {
    let defaults = Levels::default();
    Ok(Levels {
        gzip: level(ctx, raw.gzip, 1..=9, "gzip")?.unwrap_or(defaults.gzip),
        br: level(ctx, raw.br, 0..=11, "br")?.unwrap_or(defaults.br),
        zstd: level(ctx, raw.zstd, 1..=19, "zstd")?.unwrap_or(defaults.zstd),
    })
}

fn level<T: PartialOrd + Copy + std::fmt::Display>(
    ctx: Ctx<'_>,
    raw: Option<Spanned<T>>,
    range: RangeInclusive<T>,
    name: &str,
) -> Result<Option<T>, ConfigError> {
    match raw {
        Some(l) if !range.contains(l.get_ref()) => {
            let (low, high) = (range.start(), range.end());
            let msg = format!("a {name} level is {low} to {high}, not {}", l.get_ref());
            Err(ctx.err(l.span(), msg))
        }
        l => Ok(l.map(|l| *l.get_ref())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_ranges_are_types_or_wildcards() {
        assert_eq!(media_range("Text/*").as_deref(), Ok("text/*"));
        let json = media_range("application/vnd.api+json");
        assert_eq!(json.as_deref(), Ok("application/vnd.api+json"));
        for bad in [
            "text",
            "*/*",
            "text/",
            "/json",
            "text/html; charset=utf-8",
            "a b/c",
        ] {
            assert!(media_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn encodings_are_named_by_their_tokens() {
        for e in [Encoding::Zstd, Encoding::Brotli, Encoding::Gzip] {
            assert_eq!(encoding(e.token()), Ok(e));
        }
        assert!(encoding("deflate").is_err());
        assert!(encoding("GZIP").is_err());
    }
}
