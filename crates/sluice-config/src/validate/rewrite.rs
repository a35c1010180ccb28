//! A route's `rewrite`, and the status and `location` of a redirect (`direct_response`).

use http::StatusCode;
use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{BadRewrite, LocationTemplate, Rewrite};
use crate::raw::{RawDirectResponse, RawRewrite};

/// The statuses a redirect may have; 301 by default (NGINX's `return 301`, Envoy's default).
const REDIRECTS: [u16; 5] = [301, 302, 303, 307, 308];

/// `rewrite`: a `prefix` or a `regex`, and the `replace` of either. `case_insensitive`: the
/// route's, which a prefix is compared by.
pub(super) fn rewrite(
    ctx: Ctx<'_>,
    raw: Spanned<RawRewrite>,
    case_insensitive: bool,
) -> Result<Rewrite, ConfigError> {
    let span = raw.span();
    let raw = raw.into_inner();
    let replace = raw.replace.get_ref();
    let rule = match (&raw.prefix, &raw.regex) {
        (Some(prefix), None) => Rewrite::prefix(prefix.get_ref(), replace, case_insensitive),
        (None, Some(regex)) => Rewrite::regex(regex.get_ref(), replace),
        (Some(prefix), Some(_)) => {
            let msg = "a rewrite has a `prefix` or a `regex`, not both";
            return Err(ctx.err(prefix.span(), msg));
        }
        (None, None) => {
            let msg = "a rewrite needs a `prefix` or a `regex` to replace";
            return Err(ctx.err(span, msg));
        }
    };
    rule.map_err(|bad| match bad {
        BadRewrite::Prefix(e) => ctx.err(raw.prefix.map_or(span.clone(), |p| p.span()), e),
        BadRewrite::Pattern(e) => ctx.err(raw.regex.map_or(span.clone(), |r| r.span()), e),
        BadRewrite::Replace(e) => ctx.err(raw.replace.span(), e),
    })
}

/// A direct response's status and, for a redirect, its location: a redirect's status is one
/// of [`REDIRECTS`] (default 301) and its `Location` is the template's alone; any other
/// answer needs a status.
pub(super) fn status_and_location(
    ctx: Ctx<'_>,
    raw: &mut RawDirectResponse,
    span: std::ops::Range<usize>,
) -> Result<(StatusCode, Option<LocationTemplate>), ConfigError> {
    let status = raw.status.take();
    let Some(location) = raw.location.take() else {
        let status = status.ok_or_else(|| ctx.err(span, "direct_response needs a `status`"))?;
        return Ok((status.into_inner().0, None));
    };
    if let Some((_, value)) = raw
        .headers
        .0
        .iter()
        .find(|(n, _)| n.0 == http::header::LOCATION)
    {
        let msg = "`location` is the redirect's own; leave it out of `headers`";
        return Err(ctx.err(value.span(), msg));
    }
    let template =
        LocationTemplate::parse(location.get_ref()).map_err(|e| ctx.err(location.span(), e))?;
    let status = match status {
        None => StatusCode::MOVED_PERMANENTLY,
        Some(s) if REDIRECTS.contains(&s.get_ref().0.as_u16()) => s.into_inner().0,
        Some(s) => {
            let msg = format!(
                "a redirect's status is 301, 302, 303, 307 or 308, not {}",
                s.get_ref().0.as_u16()
            );
            return Err(ctx.err(s.span(), msg));
        }
    };
    Ok((status, Some(template)))
}
