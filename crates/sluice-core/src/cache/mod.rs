//! A shared HTTP cache's rules (RFC 9111), without I/O: what a request's key is
//! ([`primary_key`], and `Vary`'s secondary key, [`Variant`]), what may be stored
//! ([`storable`]), for how long it is fresh ([`Stored::freshness_lifetime`],
//! [`Stored::current_age`]), when a stored answer may be used for a request ([`usable`]),
//! how a stale one is revalidated ([`Stored::validators`], [`Stored::refreshed`]), what a
//! client's own conditional request is answered ([`not_modified`]) and which answers make
//! a stored one invalid ([`invalidates`]). The store and the route feature that drives these
//! rules are `sluice`'s `cache` module (memory; request coalescing).

mod directives;
pub mod range;

pub use directives::Directives;

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};

use crate::fields::Fields;

/// The longest heuristic freshness (§4.2.2: a tenth of the time since `Last-Modified`, at
/// most this).
pub const HEURISTIC_CAP: Duration = Duration::from_secs(24 * 3600);

/// The statuses a response may be stored with for heuristic freshness (RFC 9110 §15.1:
/// "heuristically cacheable"); 206 is left out, as this cache stores whole objects only.
const HEURISTIC_STATUSES: [u16; 11] = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501];

/// The fields a stored response never keeps: hop-by-hop ones (RFC 9110 §7.6.1) and the
/// ones a cache sets itself on the way out.
const NOT_STORED: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authentication-info",
    "cache-status",
];

/// The primary key of a request (§4.1: the target URI): scheme, host (with its port, as the
/// client named it) and path with query. A request without a host has none: it is not
/// cached. The host is part of the key, so one host's object is never another's.
pub fn primary_key(
    tls: bool,
    host: Option<&str>,
    path: &str,
    query: Option<&str>,
) -> Option<String> {
    let host = host.filter(|h| !h.is_empty())?;
    let scheme = if tls { "https" } else { "http" };
    let mut key = format!("{scheme}://{}{path}", host.to_ascii_lowercase());
    if let Some(query) = query {
        key.push('?');
        key.push_str(query);
    }
    Some(key)
}

/// A request's values of the fields a stored response varies by (§4.1): each the field's
/// lines joined with `, `, whitespace around commas removed (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Variant(Vec<(String, Option<String>)>);

impl Variant {
    /// The variant of `request` for a response whose `Vary` lists `names` (lowercase).
    pub fn of(names: &[String], request: &(impl Fields + ?Sized)) -> Self {
        let values = names.iter().map(|n| (n.clone(), normalised(request, n)));
        Self(values.collect())
    }

    /// A variant from its fields' names and values, as [`Variant::pairs`] lists them (a
    /// store that keeps it outside memory reads it back so).
    pub fn from_pairs(pairs: Vec<(String, Option<String>)>) -> Self {
        Self(pairs)
    }

    /// Its fields' names (lowercase) and normalised values (`None`: absent).
    pub fn pairs(&self) -> &[(String, Option<String>)] {
        &self.0
    }

    /// Whether `request` is this variant.
    pub fn matches(&self, request: &(impl Fields + ?Sized)) -> bool {
        self.0.iter().all(|(n, v)| normalised(request, n) == *v)
    }
}

fn normalised(request: &(impl Fields + ?Sized), name: &str) -> Option<String> {
    let mut parts = Vec::new();
    for value in request.named(name) {
        let text = String::from_utf8_lossy(value);
        parts.extend(text.split(',').map(|p| p.trim().to_owned()));
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// The field names a response varies by, lowercase (`None`: `Vary: *`, which no request
/// matches, so it is not stored).
pub fn vary_names(fields: &HeaderMap) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for value in fields.get_all(header::VARY) {
        let text = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return None;
            }
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
    }
    Some(names)
}

/// The `Cache-Control` of a message's fields.
pub fn directives(fields: &(impl Fields + ?Sized)) -> Directives {
    Directives::parse(fields.named("cache-control"))
}

/// The `Cache-Control` a gateway cache obeys in a response: `CDN-Cache-Control` when the
/// response has one (RFC 9213 §2.1: a cache that uses a targeted field ignores
/// `Cache-Control` then), else `Cache-Control`. A `CDN-Cache-Control` that is no valid
/// Structured Field dictionary (RFC 8941) is ignored.
pub fn response_directives(fields: &HeaderMap) -> Directives {
    let targeted = fields.get_all("cdn-cache-control");
    let valid = targeted.iter().all(|v| sf_dictionary(v.as_bytes()));
    match targeted.iter().next().is_some() && valid {
        true => Directives::parse(targeted.iter().map(HeaderValue::as_bytes)),
        false => directives(fields),
    }
}

/// Whether `value` is a Structured Field dictionary whose duration members are integers.
fn sf_dictionary(value: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(value) else {
        return false;
    };
    text.split(',').map(str::trim).all(|member| {
        let (key, item) = match member.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (member, None),
        };
        let key_ok = key.starts_with(|c: char| c.is_ascii_lowercase() || c == '*')
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.*".contains(&b));
        let duration = matches!(
            key,
            "max-age" | "s-maxage" | "stale-while-revalidate" | "stale-if-error"
        );
        let item_ok = match item {
            None => !duration,
            Some(v) if duration => sf_integer(v),
            Some(v) => sf_integer(v) || sf_token_or_string(v),
        };
        key_ok && item_ok
    })
}

fn sf_integer(v: &str) -> bool {
    let digits = v.strip_prefix('-').unwrap_or(v);
    !digits.is_empty() && digits.len() <= 15 && digits.bytes().all(|b| b.is_ascii_digit())
}

fn sf_token_or_string(v: &str) -> bool {
    let quoted = v.len() >= 2 && v.starts_with('"') && v.ends_with('"');
    let token = v.starts_with(|c: char| c.is_ascii_alphabetic() || c == '*')
        && v.bytes()
            .all(|b| b.is_ascii_graphic() && !br#""(),;<=>?@[\]{}"#.contains(&b));
    quoted || token || v == "?0" || v == "?1"
}

/// What a request asks of a cache: its `Cache-Control`, with `Pragma: no-cache` read as
/// `no-cache` when it has none (RFC 9111 §5.4).
pub fn request_directives(fields: &(impl Fields + ?Sized)) -> Directives {
    let mut d = directives(fields);
    if fields.first("cache-control").is_none() {
        let pragma = fields.named("pragma").map(String::from_utf8_lossy);
        d.no_cache |= pragma
            .flat_map(|p| {
                p.split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .any(|p| p == "no-cache");
    }
    d
}

/// Whether a shared cache may store the answer to a request (§3, §3.5): a `GET`, neither
/// side saying `no-store`, the answer not `private`, a final status the cache can reuse
/// whole (not 206, 304), not `Vary: *`, with an explicit lifetime or a status reusable by
/// heuristic; a request with `Authorization` only when the answer says it may be shared
/// (`public`, `s-maxage`, `must-revalidate`); one that sets a cookie never, as NGINX and
/// Varnish do by default (RFC 9111 §7.3 leaves it to the cache: a cookie stored would be
/// handed to every client).
pub fn storable(
    method: &Method,
    request: &(impl Fields + ?Sized),
    status: StatusCode,
    response: &HeaderMap,
) -> bool {
    storable_with(method, request, status, response, false)
}

/// [`storable`], for a cache whose configuration gives an answer that states no lifetime one
/// of its own (`assigned`, NGINX's `proxy_cache_valid`): then whatever its status.
pub fn storable_with(
    method: &Method,
    request: &(impl Fields + ?Sized),
    status: StatusCode,
    response: &HeaderMap,
    assigned: bool,
) -> bool {
    let req = request_directives(request);
    let res = response_directives(response);
    let final_status = !status.is_informational() && !matches!(status.as_u16(), 206 | 304);
    let shareable = request.first("authorization").is_none()
        || res.public
        || res.s_maxage.is_some()
        || res.must_revalidate;
    let explicit = res.max_age.is_some()
        || res.s_maxage.is_some()
        || response.contains_key(header::EXPIRES)
        || res.public;
    let heuristic = HEURISTIC_STATUSES.contains(&status.as_u16());
    method == Method::GET
        && final_status
        && !req.no_store
        && !res.no_store
        && !res.private
        && shareable
        && (explicit || heuristic || res.no_cache || assigned)
        && !response.contains_key(header::SET_COOKIE)
        && vary_names(response).is_some()
}

/// Whether an answer of `status` to a request of `method` makes the stored answers for its
/// target invalid (§4.4: an unsafe method's non-error answer).
pub fn invalidates(method: &Method, status: StatusCode) -> bool {
    let safe = matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    !safe && (status.is_success() || status.is_redirection())
}

/// A stored answer: its head and body, and when it was asked for and received.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The status.
    pub status: StatusCode,
    /// Its fields as stored (hop-by-hop and `private`/`no-cache` listed fields left out).
    pub fields: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// The request's variant (the values of the fields it varies by).
    pub variant: Variant,
    /// When the request went upstream.
    pub request_time: SystemTime,
    /// When the answer came back.
    pub response_time: SystemTime,
    /// The lifetime the cache's configuration gives it if it states none (NGINX's
    /// `proxy_cache_valid`); `None`: the RFC's heuristic.
    pub assigned: Option<Duration>,
}

impl Stored {
    /// An answer as stored: the fields it may keep.
    pub fn new(
        status: StatusCode,
        fields: &HeaderMap,
        variant: Variant,
        times: (SystemTime, SystemTime),
    ) -> Self {
        Self {
            status,
            fields: kept_fields(fields),
            body: Bytes::new(),
            variant,
            request_time: times.0,
            response_time: times.1,
            assigned: None,
        }
    }

    /// Bytes it holds, roughly: what a store bounded in bytes weighs it by.
    pub fn weight(&self) -> usize {
        let fields: usize = self
            .fields
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 32)
            .sum();
        self.body.len() + fields + 256
    }

    /// Its freshness lifetime (§4.2.1): `s-maxage`, else `max-age`, else `Expires` less
    /// `Date`, else the lifetime the cache's configuration assigns, else a heuristic (§4.2.2)
    /// from `Last-Modified` for a status that allows one.
    pub fn freshness_lifetime(&self) -> Duration {
        let cc = response_directives(&self.fields);
        if let Some(lifetime) = cc.s_maxage.or(cc.max_age) {
            return lifetime;
        }
        if self.fields.contains_key(header::EXPIRES) {
            let expires = date(&self.fields, header::EXPIRES);
            let date = date(&self.fields, header::DATE).unwrap_or(self.response_time);
            // An invalid `Expires` ("0") is a time in the past.
            return expires
                .and_then(|e| e.duration_since(date).ok())
                .unwrap_or_default();
        }
        if let Some(assigned) = self.assigned {
            return assigned;
        }
        let heuristic = HEURISTIC_STATUSES.contains(&self.status.as_u16()) || cc.public;
        let modified = date(&self.fields, header::LAST_MODIFIED);
        match (heuristic, modified) {
            (true, Some(modified)) => {
                let date = date(&self.fields, header::DATE).unwrap_or(self.response_time);
                let since = date.duration_since(modified).unwrap_or_default();
                (since / 10).min(HEURISTIC_CAP)
            }
            _ => Duration::ZERO,
        }
    }

    /// Its age at `now` (§4.2.3); of a list-based `Age`, the first member counts, and an
    /// invalid one is ignored (§5.1).
    pub fn current_age(&self, now: SystemTime) -> Duration {
        let age_value = self
            .fields
            .get(header::AGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next()?.trim().parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_secs);
        let date = date(&self.fields, header::DATE).unwrap_or(self.response_time);
        let apparent = self.response_time.duration_since(date).unwrap_or_default();
        let delay = self
            .response_time
            .duration_since(self.request_time)
            .unwrap_or_default();
        let corrected_initial = apparent.max(age_value + delay);
        let resident = now.duration_since(self.response_time).unwrap_or_default();
        corrected_initial + resident
    }

    /// The fields a revalidation of it sends (§4.3.1): `If-None-Match` with its entity tag,
    /// else `If-Modified-Since` with its `Last-Modified`.
    pub fn validators(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::new();
        if let Some(etag) = self.fields.get(header::ETAG) {
            out.push((header::IF_NONE_MATCH, etag.clone()));
        }
        if let Some(modified) = self.fields.get(header::LAST_MODIFIED) {
            out.push((header::IF_MODIFIED_SINCE, modified.clone()));
        }
        out
    }

    /// Whether it can be revalidated.
    pub fn has_validators(&self) -> bool {
        self.fields.contains_key(header::ETAG) || self.fields.contains_key(header::LAST_MODIFIED)
    }

    /// It, refreshed by a `304` (§4.3.4): the 304's fields over its own (but the framing),
    /// its times those of the revalidation.
    pub fn refreshed(&self, not_modified: &HeaderMap, times: (SystemTime, SystemTime)) -> Self {
        let mut fields = self.fields.clone();
        for name in not_modified.keys() {
            if *name == header::CONTENT_LENGTH || NOT_STORED.contains(&name.as_str()) {
                continue;
            }
            fields.remove(name);
            for value in not_modified.get_all(name) {
                fields.append(name.clone(), value.clone());
            }
        }
        Self {
            status: self.status,
            fields: kept_fields(&fields),
            body: self.body.clone(),
            variant: self.variant.clone(),
            request_time: times.0,
            response_time: times.1,
            assigned: self.assigned,
        }
    }
}

/// The fields a shared cache keeps of an answer: not the ones `Connection` names, nor the
/// hop-by-hop ones, nor the ones `private="…"` and `no-cache="…"` name.
fn kept_fields(fields: &HeaderMap) -> HeaderMap {
    let cc = response_directives(fields);
    let mut kept = fields.clone();
    for value in fields.get_all(header::CONNECTION) {
        let text = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            kept.remove(name);
        }
    }
    for name in NOT_STORED.iter().copied() {
        kept.remove(name);
    }
    for name in cc.private_fields.iter().chain(&cc.no_cache_fields) {
        kept.remove(name.as_str());
    }
    kept
}

fn date(fields: &HeaderMap, name: HeaderName) -> Option<SystemTime> {
    let value = fields.get(name)?.to_str().ok()?;
    httpdate::parse_http_date(value.trim()).ok()
}

/// How a stored answer may serve a request ([`usable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// As it is: fresh enough for the request.
    Fresh,
    /// Only after the origin says it is still good (stale, or `no-cache`).
    Revalidate,
}

/// How `stored` may serve a request with directives `req` at `now` (§4.2, §4.2.4, §5.2.1):
/// fresh for its lifetime less the request's `min-fresh`, within the request's `max-age`,
/// and stale within `max-stale` only when the answer allows serving stale.
pub fn usable(stored: &Stored, req: &Directives, now: SystemTime) -> Use {
    let res = response_directives(&stored.fields);
    if res.no_cache || req.no_cache {
        return Use::Revalidate;
    }
    let age = stored.current_age(now);
    let mut lifetime = stored.freshness_lifetime();
    if let Some(max_age) = req.max_age {
        lifetime = lifetime.min(max_age);
    }
    let wanted = age + req.min_fresh.unwrap_or_default();
    if wanted < lifetime {
        return Use::Fresh;
    }
    let stale_ok = !(res.must_revalidate || res.proxy_revalidate || res.s_maxage.is_some());
    let within = match req.max_stale {
        Some(None) => true,
        Some(Some(max)) => age < lifetime + max,
        None => false,
    };
    match stale_ok && within && req.max_age.is_none() {
        true => Use::Fresh,
        false => Use::Revalidate,
    }
}

/// Whether `stored` may answer a request with directives `req` at `now` when the upstream
/// failed (RFC 5861 §4): within `stale-if-error` (the request's, else the answer's) past its
/// lifetime, unless the answer forbids serving it stale.
pub fn stale_if_error(stored: &Stored, req: &Directives, now: SystemTime) -> bool {
    let res = response_directives(&stored.fields);
    let Some(window) = req.stale_if_error.or(res.stale_if_error) else {
        return false;
    };
    let forbidden = res.must_revalidate || res.proxy_revalidate || res.s_maxage.is_some();
    !forbidden && stored.current_age(now) < stored.freshness_lifetime() + window
}

/// Whether `stored`, no longer fresh for a request with directives `req` at `now`, may
/// answer it at once while a background request revalidates it (RFC 5861 §3): within the
/// answer's `stale-while-revalidate` past its lifetime, unless the answer forbids serving it
/// stale (`must-revalidate`, `proxy-revalidate`, `s-maxage`, `no-cache`) or the request asks
/// for a fresher one (`no-cache`, `max-age`, `min-fresh`).
pub fn stale_while_revalidate(stored: &Stored, req: &Directives, now: SystemTime) -> bool {
    let res = response_directives(&stored.fields);
    let Some(window) = res.stale_while_revalidate else {
        return false;
    };
    let forbidden = res.must_revalidate || res.proxy_revalidate || res.s_maxage.is_some();
    let fresher = req.no_cache || req.max_age.is_some() || req.min_fresh.is_some();
    !(forbidden || fresher || res.no_cache)
        && stored.current_age(now) < stored.freshness_lifetime() + window
}

/// Whether a `200` to a `HEAD` with these `fields` updates the stored answer to a `GET`
/// (RFC 9111 §4.3.5, selected as §4.3.4 selects what a `304` updates): the same entity tag,
/// else the same `Last-Modified`, else neither has a validator.
pub fn head_updates(stored: &Stored, fields: &HeaderMap) -> bool {
    for name in [header::ETAG, header::LAST_MODIFIED] {
        let (old, new) = (stored.fields.get(&name), fields.get(&name));
        if old.is_some() || new.is_some() {
            return old == new;
        }
    }
    true
}

/// Whether a client's own conditional `GET`/`HEAD` is answered `304` from `stored` (RFC
/// 9110 §13.1.2, §13.1.3): `If-None-Match` naming its entity tag (weakly) or `*`, or, without
/// `If-None-Match`, `If-Modified-Since` at or after its `Last-Modified` (or `Date`).
pub fn not_modified(request: &(impl Fields + ?Sized), stored: &Stored) -> bool {
    if stored.status != StatusCode::OK {
        return false;
    }
    let tags: Vec<&[u8]> = request.named("if-none-match").collect();
    if !tags.is_empty() {
        let Some(etag) = stored.fields.get(header::ETAG) else {
            return tags.iter().any(|t| t.trim_ascii() == b"*");
        };
        let ours = weak_stripped(etag.as_bytes());
        let mut listed = tags.iter().flat_map(|t| t.split(|b| *b == b','));
        return listed.any(|t| {
            let t = t.trim_ascii();
            t == b"*" || weak_stripped(t) == ours
        });
    }
    let since = request.first("if-modified-since").and_then(|v| {
        let text = std::str::from_utf8(v).ok()?;
        httpdate::parse_http_date(text.trim()).ok()
    });
    let modified =
        date(&stored.fields, header::LAST_MODIFIED).or_else(|| date(&stored.fields, header::DATE));
    matches!((since, modified), (Some(since), Some(modified)) if modified <= since)
}

fn weak_stripped(tag: &[u8]) -> &[u8] {
    let tag = tag.trim_ascii();
    tag.strip_prefix(b"W/").unwrap_or(tag)
}

/// The fields a `304` from storage carries (RFC 9110 §15.4.5): the stored ones that would
/// have been sent in a 200, content fields aside.
pub fn not_modified_fields(stored: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let kept = [
        header::CACHE_CONTROL,
        header::CONTENT_LOCATION,
        header::DATE,
        header::ETAG,
        header::EXPIRES,
        header::VARY,
        header::LAST_MODIFIED,
    ];
    let fields = stored.iter().filter(|(n, _)| kept.contains(n));
    fields.map(|(n, v)| (n.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests;
