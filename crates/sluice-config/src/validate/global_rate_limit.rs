//! `[rate_limit_service.NAME]` and a route's `global_rate_limit = { service, descriptors }`.

use std::collections::BTreeMap;
use std::time::Duration;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{DescriptorEntry, EntryValue, FailureMode, GlobalRateLimit, RateLimitService};
use crate::raw::{RawDescriptorEntry, RawGlobalRateLimit, RawRateLimitService};

/// Envoy's default for its rate-limit filter's calls.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(20);

/// Every `[rate_limit_service.NAME]`, by name.
pub(super) fn services(
    ctx: Ctx<'_>,
    raw: BTreeMap<Spanned<String>, Spanned<RawRateLimitService>>,
) -> Result<BTreeMap<String, RateLimitService>, ConfigError> {
    raw.into_iter()
        .map(|(name, s)| {
            let service = service(ctx, name.get_ref(), s.into_inner())?;
            Ok((name.into_inner(), service))
        })
        .collect()
}

fn service(
    ctx: Ctx<'_>,
    name: &str,
    raw: RawRateLimitService,
) -> Result<RateLimitService, ConfigError> {
    let address = address(raw.address.get_ref()).map_err(|m| ctx.err(raw.address.span(), m))?;
    if raw.domain.get_ref().trim().is_empty() {
        let msg = "`domain` is empty: name the domain of the service's configuration";
        return Err(ctx.err(raw.domain.span(), msg));
    }
    let failure_mode = match raw.failure_mode.as_ref().map(|m| (m.get_ref().as_str(), m)) {
        None | Some(("open", _)) => FailureMode::Open,
        Some(("closed", _)) => FailureMode::Closed,
        Some((other, m)) => {
            let msg = format!("unknown `failure_mode = \"{other}\"`: use \"open\" (requests go on when the service fails) or \"closed\" (they get 503)");
            return Err(ctx.err(m.span(), msg));
        }
    };
    Ok(RateLimitService {
        name: name.to_owned(),
        address,
        domain: raw.domain.into_inner(),
        timeout: raw.timeout.map_or(DEFAULT_TIMEOUT, |t| t.0),
        failure_mode,
    })
}

/// `host:port`, as gRPC's plain-text HTTP/2 dials it.
fn address(text: &str) -> Result<String, String> {
    if text.contains("://") {
        return Err(format!(
            "`{text}`: write the service's address as host:port (e.g. \"127.0.0.1:8081\"), without a scheme"
        ));
    }
    let authority: http::uri::Authority = text
        .parse()
        .map_err(|_| format!("`{text}` is not a host:port address (e.g. \"127.0.0.1:8081\")"))?;
    if authority.port_u16().is_none() || authority.as_str().contains('@') {
        return Err(format!(
            "`{text}`: give the service's host and port (e.g. \"127.0.0.1:8081\")"
        ));
    }
    Ok(authority.as_str().to_owned())
}

/// A route's `global_rate_limit`, its service looked up in `services`.
pub(super) fn global_rate_limit(
    ctx: Ctx<'_>,
    raw: Spanned<RawGlobalRateLimit>,
    services: &BTreeMap<String, RateLimitService>,
) -> Result<GlobalRateLimit, ConfigError> {
    let raw = raw.into_inner();
    let Some(service) = services.get(raw.service.get_ref()) else {
        let known: Vec<_> = services.keys().map(|k| format!("`{k}`")).collect();
        let known = match known.is_empty() {
            true => "none: define one as [rate_limit_service.NAME]".to_owned(),
            false => known.join(", "),
        };
        let msg = format!(
            "unknown rate-limit service `{}` (known: {known})",
            raw.service.get_ref()
        );
        return Err(ctx.err(raw.service.span(), msg));
    };
    let span = raw.descriptors.span();
    let descriptors = raw.descriptors.into_inner();
    if descriptors.is_empty() {
        let msg = "`descriptors` is empty: give at least one, e.g. [[{ from = \"client\" }]]";
        return Err(ctx.err(span, msg));
    }
    let descriptors = descriptors
        .into_iter()
        .map(|d| {
            let span = d.span();
            let entries = d.into_inner();
            if entries.is_empty() {
                return Err(ctx.err(span, "a descriptor needs at least one entry"));
            }
            entries.into_iter().map(|e| entry(ctx, e)).collect()
        })
        .collect::<Result<_, _>>()?;
    Ok(GlobalRateLimit {
        service: service.clone(),
        descriptors,
    })
}

/// `{ key, from }` or `{ key, value }`.
fn entry(ctx: Ctx<'_>, raw: Spanned<RawDescriptorEntry>) -> Result<DescriptorEntry, ConfigError> {
    let span = raw.span();
    let raw = raw.into_inner();
    let (value, default_key) = match (&raw.from, raw.value) {
        (Some(from), None) => source(from.get_ref()).map_err(|m| ctx.err(from.span(), m))?,
        (None, Some(value)) => (
            EntryValue::Constant(value.into_inner()),
            "generic_key".to_owned(),
        ),
        (Some(from), Some(_)) => {
            let msg =
                "an entry takes its value `from` the request or is a constant `value`: keep one";
            return Err(ctx.err(from.span(), msg));
        }
        (None, None) => {
            let msg = "an entry needs `from` (\"client\", \"route\", \"path\" or \"header:NAME\") or a constant `value`";
            return Err(ctx.err(span, msg));
        }
    };
    let key = match raw.key {
        Some(k) if k.get_ref().is_empty() => {
            return Err(ctx.err(k.span(), "`key` is empty"));
        }
        Some(k) => k.into_inner(),
        None => default_key,
    };
    Ok(DescriptorEntry { key, value })
}

/// `from`'s value, and the key an entry gets when it names none.
fn source(text: &str) -> Result<(EntryValue, String), String> {
    let simple = |v: EntryValue, key: &str| Ok((v, key.to_owned()));
    match text {
        "client" => simple(EntryValue::Client, "remote_address"),
        "route" => simple(EntryValue::Route, "route"),
        "path" => simple(EntryValue::Path, "path"),
        _ => {
            let name = text.strip_prefix("header:").ok_or_else(|| {
                format!("unknown `from = \"{text}\"`: use \"client\", \"route\", \"path\" or \"header:NAME\"")
            })?;
            let name = http::HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| format!("invalid field name `{name}`"))?;
            let key = name.as_str().to_owned();
            Ok((EntryValue::Header(name), key))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_and_port() {
        assert_eq!(address("127.0.0.1:8081").as_deref(), Ok("127.0.0.1:8081"));
        assert_eq!(
            address("rls.internal:8081").as_deref(),
            Ok("rls.internal:8081")
        );
        assert_eq!(address("[::1]:8081").as_deref(), Ok("[::1]:8081"));
        for bad in ["http://127.0.0.1:8081", "127.0.0.1", "", "a b:1", "u@h:1"] {
            assert!(address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sources_name_their_default_keys() {
        let key = |t| source(t).map(|(_, k)| k);
        assert_eq!(key("client").as_deref(), Ok("remote_address"));
        assert_eq!(key("header:X-Api-Key").as_deref(), Ok("x-api-key"));
        assert!(source("ip").is_err());
        assert!(source("header:bad name").is_err());
    }
}
