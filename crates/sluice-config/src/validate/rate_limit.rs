//! A route's `rate_limit = { rate, burst, key }`.

use std::time::Duration;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{RateLimit, RateLimitKey};
use crate::raw::RawRateLimit;

pub(super) fn rate_limit(
    ctx: Ctx<'_>,
    raw: Spanned<RawRateLimit>,
) -> Result<RateLimit, ConfigError> {
    let raw = raw.into_inner();
    let (count, unit) = rate(raw.rate.get_ref()).map_err(|msg| ctx.err(raw.rate.span(), msg))?;
    let burst = match raw.burst {
        None => count,
        Some(b) if *b.get_ref() == 0 => {
            let msg = "`burst` is how many requests may come at once: at least 1";
            return Err(ctx.err(b.span(), msg));
        }
        Some(b) => *b.get_ref(),
    };
    let key = match raw.key {
        None => RateLimitKey::Client,
        Some(k) => key(k.get_ref()).map_err(|msg| ctx.err(k.span(), msg))?,
    };
    Ok(RateLimit {
        period: unit / count,
        burst,
        key,
    })
}

/// `"N/s"`, `"N/m"` or `"N/h"`: N requests per second, minute or hour.
fn rate(text: &str) -> Result<(u32, Duration), String> {
    let bad = || {
        format!(
            "`{text}` is not a rate: write requests per unit, e.g. \"10/s\", \"600/m\", \"1000/h\""
        )
    };
    let (count, unit) = text.split_once('/').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let unit = match unit.trim() {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => return Err(bad()),
    };
    if count == 0 {
        return Err(
            "a rate of 0 refuses every request: use a `direct_response` for that".to_owned(),
        );
    }
    if unit / count < Duration::from_micros(1) {
        return Err(format!("`{text}` is more than a million requests a second"));
    }
    Ok((count, unit))
}

/// `"client"` or `"header:NAME"`.
fn key(text: &str) -> Result<RateLimitKey, String> {
    if text == "client" {
        return Ok(RateLimitKey::Client);
    }
    let name = text.strip_prefix("header:").ok_or_else(|| {
        format!("unknown rate-limit key `{text}`: use \"client\" or \"header:NAME\" (e.g. \"header:x-api-key\")")
    })?;
    http::HeaderName::from_bytes(name.trim().as_bytes())
        .map(RateLimitKey::Header)
        .map_err(|_| format!("invalid field name `{name}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_counts_per_unit() {
        assert_eq!(rate("10/s"), Ok((10, Duration::from_secs(1))));
        assert_eq!(rate("600/m"), Ok((600, Duration::from_secs(60))));
        assert_eq!(rate(" 5 / h "), Ok((5, Duration::from_secs(3600))));
        for bad in ["10", "10/d", "x/s", "-1/s", "0/s", "10/", "2000000/s"] {
            assert!(rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_the_client_or_a_field() {
        assert_eq!(key("client"), Ok(RateLimitKey::Client));
        let api = RateLimitKey::Header(http::HeaderName::from_static("x-api-key"));
        assert_eq!(key("header:X-Api-Key"), Ok(api));
        assert!(key("ip").is_err());
        assert!(key("header:bad name").is_err());
    }
}
