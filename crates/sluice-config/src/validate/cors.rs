//! A route's `cors = { origins, methods, headers, expose, credentials, max_age }`.

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{Cors, CorsOrigins, OriginMatch};
use crate::raw::RawCors;

pub(super) fn cors(ctx: Ctx<'_>, raw: Spanned<RawCors>) -> Result<Cors, ConfigError> {
    let span = raw.span();
    let raw = raw.into_inner();
    let origins = if raw.origins.get_ref().iter().any(|o| o == "*") {
        if raw.origins.get_ref().len() > 1 {
            let msg = "`*` allows every origin: list origins or `*`, not both";
            return Err(ctx.err(raw.origins.span(), msg));
        }
        CorsOrigins::Any
    } else {
        let list = raw.origins.get_ref().iter().map(|o| origin(o));
        let list = list.collect::<Result<Vec<_>, _>>();
        CorsOrigins::List(list.map_err(|msg| ctx.err(raw.origins.span(), msg))?)
    };
    if let CorsOrigins::List(list) = &origins {
        if list.is_empty() {
            return Err(ctx.err(
                raw.origins.span(),
                "`origins` is empty: no page could call the route",
            ));
        }
    }
    let credentials = raw.credentials.unwrap_or(false);
    if credentials && origins == CorsOrigins::Any {
        let msg =
            "browsers refuse credentials with `Access-Control-Allow-Origin: *`: list the origins";
        return Err(ctx.err(span, msg));
    }
    let names = |list: Vec<crate::values::Name>| list.into_iter().map(|n| n.0).collect();
    let methods = raw.methods.map_or_else(
        || vec![http::Method::GET, http::Method::HEAD, http::Method::POST],
        |m| m.into_iter().map(|m| m.0).collect(),
    );
    Ok(Cors {
        origins,
        methods,
        headers: names(raw.headers),
        expose: names(raw.expose),
        credentials,
        max_age: raw.max_age.map(|d| d.0),
    })
}

/// `scheme://host[:port]`, lowercase, no path; or `scheme://*.domain` for its subdomains.
fn origin(text: &str) -> Result<OriginMatch, String> {
    let bad = || {
        format!("`{text}` is not an origin: write scheme://host[:port] (e.g. \"https://app.example.com\") or \"https://*.example.com\"")
    };
    let lower = text.to_ascii_lowercase();
    let (scheme, host) = lower.split_once("://").ok_or_else(bad)?;
    if !matches!(scheme, "http" | "https")
        || host.is_empty()
        || host.contains(['/', '?', '#', '@', ' '])
    {
        return Err(bad());
    }
    match host.strip_prefix("*.") {
        Some(domain) if !domain.is_empty() && !domain.contains('*') => Ok(OriginMatch::Subdomains(
            scheme.to_owned(),
            format!(".{domain}"),
        )),
        Some(_) => Err(bad()),
        None if host.contains('*') => Err(bad()),
        None => Ok(OriginMatch::Exact(lower)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_exact_or_subdomains() {
        assert_eq!(
            origin("https://App.Example.com"),
            Ok(OriginMatch::Exact("https://app.example.com".to_owned()))
        );
        assert_eq!(
            origin("https://*.example.com"),
            Ok(OriginMatch::Subdomains(
                "https".to_owned(),
                ".example.com".to_owned()
            ))
        );
        for bad in [
            "app.example.com",
            "ftp://x",
            "https://x/path",
            "https://*",
            "https://a.*.com",
            "https://",
        ] {
            assert!(origin(bad).is_err(), "{bad}");
        }
    }
}
