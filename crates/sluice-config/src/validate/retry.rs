//! A cluster's `retry = { retries, on, non_idempotent, budget_percent, budget_min }`.

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{Retry, RetryOn};
use crate::raw::RawRetry;

/// More attempts than this only multiply a failing upstream's load.
const MAX_RETRIES: u32 = 10;

/// Validates `retry` for a cluster of `kind` (`"static"` or `"reverse"`), from `default` (the
/// kind's).
pub(super) fn retry(
    ctx: Ctx<'_>,
    kind: &str,
    raw: Option<Spanned<RawRetry>>,
    default: Retry,
) -> Result<Retry, ConfigError> {
    let Some(raw) = raw else {
        return Ok(default);
    };
    let raw = raw.into_inner();
    let retries = match raw.retries {
        None => 1,
        Some(r) if *r.get_ref() > MAX_RETRIES => {
            let msg = format!(
                "at most {MAX_RETRIES} retries: more only multiply a failing upstream's load"
            );
            return Err(ctx.err(r.span(), msg));
        }
        Some(r) => r.into_inner(),
    };
    let on = match raw.on {
        None => default.on,
        Some(list) => {
            let span = list.span();
            let on = on(ctx, kind, list.get_ref())?;
            if retries > 0 && !on.reset && on.statuses.is_empty() {
                let msg = "`retries` count `reset` and statuses, and `on` lists neither: add one (e.g. \"reset\", \"503\"), or set `retries = 0`";
                return Err(ctx.err(span, msg));
            }
            on
        }
    };
    let budget_percent = match raw.budget_percent {
        Some(p) if *p.get_ref() > 100 => {
            let msg = "`budget_percent` is a share of the requests in flight: 0 to 100";
            return Err(ctx.err(p.span(), msg));
        }
        p => p.map_or(default.budget_percent, Spanned::into_inner),
    };
    Ok(Retry {
        retries,
        on,
        non_idempotent: raw.non_idempotent.unwrap_or(default.non_idempotent),
        budget_percent,
        budget_min: raw.budget_min.unwrap_or(default.budget_min),
    })
}

/// `on = ["connect-failure", "reset", "502", ...]`.
fn on(ctx: Ctx<'_>, kind: &str, list: &[Spanned<String>]) -> Result<RetryOn, ConfigError> {
    let mut on = RetryOn {
        connect_failure: false,
        reset: false,
        statuses: Vec::new(),
    };
    for item in list {
        let text = item.get_ref().as_str();
        match text {
            "connect-failure" if kind == "reverse" => {
                let msg = "a reverse cluster never connects (its services dial in): `connect-failure` applies to static clusters";
                return Err(ctx.err(item.span(), msg));
            }
            "connect-failure" => on.connect_failure = true,
            "reset" => on.reset = true,
            _ => {
                let status = status(text).map_err(|msg| ctx.err(item.span(), msg))?;
                if !on.statuses.contains(&status) {
                    on.statuses.push(status);
                }
            }
        }
    }
    Ok(on)
}

/// A status worth another attempt: 429 or 500–599.
fn status(text: &str) -> Result<u16, String> {
    let valid = "\"connect-failure\", \"reset\", or a status: \"429\" or \"500\" to \"599\"";
    match text.parse::<u16>() {
        Ok(s) if s == 429 || (500..=599).contains(&s) => Ok(s),
        Ok(s) => Err(format!(
            "a {s} is the upstream's answer, not a failure to retry: use {valid}"
        )),
        Err(_) => Err(format!("unknown retry condition `{text}`: use {valid}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_429_or_5xx() {
        assert_eq!(status("503"), Ok(503));
        assert_eq!(status("429"), Ok(429));
        let refused = |text| status(text).err().unwrap_or_default();
        assert!(refused("404").contains("not a failure"));
        assert!(refused("5xx").contains("unknown retry condition"));
        assert!(status("").is_err());
        assert!(status("99999").is_err());
    }
}
