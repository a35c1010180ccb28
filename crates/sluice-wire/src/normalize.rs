//! Normalising a request before it is routed, so that routes judge the request the upstream
//! will see: the path (percent-encoded unreserved characters decoded, slashes merged, encoded
//! slashes refused or handled as configured), the host (validated, lowercase, without a
//! trailing dot) and header names with `_`.
//!
//! Every rewrite is in place and the common case, a request with nothing to normalise, costs a
//! scan and no allocation.

use std::borrow::Cow;
use std::io::Write as _;
use std::net::Ipv6Addr;

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, HeaderName, Request, Uri, Version};

/// Why a request is refused: answered 400 with this reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub &'static str);

/// How a listener normalises what clients send before routing (its `escaped_slashes` and
/// `underscores_in_headers` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestRules {
    /// What a path with an encoded slash (`%2F`, `%5C`) gets. Default [`EscapedSlashes::Reject`].
    pub escaped_slashes: EscapedSlashes,
    /// What a request header whose name has `_` gets. Default [`Underscores::Drop`].
    pub underscores_in_headers: Underscores,
}

/// `escaped_slashes`: what a path with `%2F` or `%5C` (either case) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// 400 (the default): the router and the upstream could split such a path differently.
    #[default]
    Reject,
    /// Forwarded as sent (hex in uppercase); routes see the encoded form.
    Keep,
    /// Decoded to `/` (both), then merged with neighbouring slashes like any other.
    Unescape,
}

/// `underscores_in_headers`: what a request header named with `_` gets. CGI/WSGI-style
/// backends map `_` to `-`, so `Transfer_Encoding` could reach them as `Transfer-Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Underscores {
    /// Removed before forwarding (the default; NGINX's `underscores_in_headers off`).
    #[default]
    Drop,
    /// Forwarded unchanged.
    Allow,
    /// 400.
    Reject,
}

/// Normalises `req`'s path, host and header names in place by `rules`, or says why the request
/// must be refused.
pub fn normalize_request<B>(req: &mut Request<B>, rules: RequestRules) -> Result<(), BadRequest> {
    if let Some(uri) = normalize_uri(req.uri(), rules.escaped_slashes)? {
        *req.uri_mut() = uri;
    }
    normalize_host(req)?;
    underscores(req.headers_mut(), rules.underscores_in_headers)
}

/// The request target with its path normalised; `None` when it needs no change.
fn normalize_uri(uri: &Uri, escaped: EscapedSlashes) -> Result<Option<Uri>, BadRequest> {
    let path = uri.path();
    if path == "*" {
        return Ok(None);
    }
    let Some(normal) = normalize_path(path, escaped)? else {
        return Ok(None);
    };
    let rebuilt = match uri.query() {
        Some(query) => format!("{normal}?{query}"),
        None => normal,
    };
    let path_and_query = PathAndQuery::try_from(rebuilt).map_err(|_| BAD_PATH)?;
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query);
    Uri::from_parts(parts).map(Some).map_err(|_| BAD_PATH)
}

const BAD_PATH: BadRequest = BadRequest("invalid request path");

/// RFC 3986 §6.2.2 normalisation of a path: percent-encoded unreserved characters decoded,
/// other escapes in uppercase hex, runs of `/` merged into one; then `.` and `..` segments are
/// refused. `%2F` and `%5C` (encoded `/` and `\`) are handled by `escaped`. Returns `None`
/// when the path is already normal.
pub fn normalize_path(path: &str, escaped: EscapedSlashes) -> Result<Option<String>, BadRequest> {
    let bytes = path.as_bytes();
    let needs_work =
        bytes.contains(&b'%') || bytes.contains(&b'\\') || bytes.windows(2).any(|w| w == b"//");
    if !needs_work {
        return refuse_dot_segments(path).map(|()| None);
    }
    // Bytes, not chars: the path may hold UTF-8 (hyper passes bytes above 0x7F), which is
    // copied through unchanged; only ASCII escapes and slashes are rewritten.
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let value =
                escape_at(bytes, i).ok_or(BadRequest("invalid percent-encoding in the path"))?;
            push_escape(&mut out, value, escaped)?;
            i += 3;
        } else if b == b'\\' {
            push_backslash(&mut out, escaped)?;
            i += 1;
        } else {
            push_path_byte(&mut out, b);
            i += 1;
        }
    }
    let out = String::from_utf8(out).map_err(|_| BAD_PATH)?;
    refuse_dot_segments(&out)?;
    Ok((out != path).then_some(out))
}

/// The byte a `%XX` at `bytes[i]` encodes, if it is one.
fn escape_at(bytes: &[u8], i: usize) -> Option<u8> {
    let hex = bytes.get(i + 1..i + 3)?;
    let text = std::str::from_utf8(hex).ok()?;
    if !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u8::from_str_radix(text, 16).ok()
}

fn push_escape(out: &mut Vec<u8>, value: u8, escaped: EscapedSlashes) -> Result<(), BadRequest> {
    let slash = value == b'/' || value == b'\\';
    match escaped {
        _ if is_unreserved(value) => out.push(value),
        EscapedSlashes::Reject if slash => {
            return Err(BadRequest("encoded slash (%2F or %5C) in the path"))
        }
        EscapedSlashes::Unescape if slash => push_path_byte(out, b'/'),
        _ => {
            let _ = write!(out, "%{value:02X}");
        }
    }
    Ok(())
}

/// A raw `\` is what IIS and Windows file servers read as `/`, so it gets what `%5C` gets:
/// 400 by default, kept as sent, or a `/`.
fn push_backslash(out: &mut Vec<u8>, escaped: EscapedSlashes) -> Result<(), BadRequest> {
    match escaped {
        EscapedSlashes::Reject => return Err(BadRequest("backslash in the path")),
        EscapedSlashes::Keep => out.push(b'\\'),
        EscapedSlashes::Unescape => push_path_byte(out, b'/'),
    }
    Ok(())
}

/// Appends one path byte, merging a `/` into a `/` before it.
fn push_path_byte(out: &mut Vec<u8>, b: u8) {
    if b == b'/' && out.last() == Some(&b'/') {
        return;
    }
    out.push(b);
}

/// RFC 3986 §2.3.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// `.` and `..` segments: upstreams resolve them, so `/public/../admin` would match a
/// `/public/` route and reach `/admin`. They are refused rather than resolved: no browser sends
/// them, and a request that carries one is probing.
///
/// Tomcat, Jetty and Spring remove a segment's `;` parameters before they resolve it, so
/// `/public/..;/admin` is `/admin` to them, and `/;x=y/admin` is `//admin`: a segment that is
/// `.`, `..` or empty once its parameters are removed is refused too.
fn refuse_dot_segments(path: &str) -> Result<(), BadRequest> {
    let dot = |s: &str| s == "." || s == "..";
    let bad = path
        .split('/')
        .any(|segment| match segment.split_once(';') {
            None => dot(segment),
            Some((bare, _)) => bare.is_empty() || dot(bare),
        });
    if bad {
        return Err(BadRequest("dot-segments in the path"));
    }
    Ok(())
}

/// The path routes match: `path` with each segment's `;` parameters removed, as Tomcat,
/// Jetty and Spring read it, so that `/internal;jsessionid=1/x` meets a `/internal/` rule.
/// The upstream still gets the path as sent. Borrowed when the path has no `;`.
pub fn match_path(path: &str) -> Cow<'_, str> {
    if !path.contains(';') {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(segment.split_once(';').map_or(segment, |(bare, _)| bare));
    }
    Cow::Owned(out)
}

/// Validates the host the request names (`:authority`, the absolute-form target's authority,
/// or `Host`) and rewrites it lowercase without a trailing dot. An HTTP/2 or HTTP/3 request whose
/// `Host` names another host than its `:authority` is refused (RFC 9113 §8.3.1, RFC 9114
/// §4.3.1).
fn normalize_host<B>(req: &mut Request<B>) -> Result<(), BadRequest> {
    if let Some(authority) = req.uri().authority() {
        let normal = normal_authority(authority.as_str())?;
        if req.version() >= Version::HTTP_2 {
            if let Some(host) = req.headers().get(header::HOST) {
                if normal_authority(host.to_str().map_err(|_| BAD_HOST)?)? != normal {
                    return Err(BadRequest("Host differs from :authority"));
                }
            }
        }
        if let Cow::Owned(normal) = normal {
            let authority = Authority::try_from(normal).map_err(|_| BAD_HOST)?;
            let mut parts = req.uri().clone().into_parts();
            parts.authority = Some(authority);
            *req.uri_mut() = Uri::from_parts(parts).map_err(|_| BAD_HOST)?;
        }
        return Ok(());
    }
    let Some(host) = req.headers().get(header::HOST) else {
        return Ok(());
    };
    let normal = normal_authority(host.to_str().map_err(|_| BAD_HOST)?)?;
    if let Cow::Owned(normal) = normal {
        let value = HeaderValue::try_from(normal).map_err(|_| BAD_HOST)?;
        req.headers_mut().insert(header::HOST, value);
    }
    Ok(())
}

const BAD_HOST: BadRequest = BadRequest("invalid Host");

/// A `host[:port]` checked against RFC 3986 §3.2.2 (a registered name of letters, digits,
/// `-`, `.` and `_`; an IPv4 address; or a bracketed IPv6 address) with an optional numeric
/// port, lowercase and with one trailing dot removed. Userinfo, spaces, commas, quotes and
/// slashes are refused. Borrowed when already normal; an empty value stays empty.
pub fn normal_authority(raw: &str) -> Result<Cow<'_, str>, BadRequest> {
    if raw.is_empty() {
        return Ok(Cow::Borrowed(raw));
    }
    let (host, port) = split_port(raw)?;
    if let Some(port) = port {
        if port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(BAD_HOST);
        }
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(BAD_HOST)?;
        inner.parse::<Ipv6Addr>().map_err(|_| BAD_HOST)?;
        return Ok(lowercase(raw));
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let valid = !name.is_empty()
        && name.split('.').all(|label| !label.is_empty())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !valid {
        return Err(BAD_HOST);
    }
    if name.len() == host.len() {
        return Ok(lowercase(raw));
    }
    let mut normal = name.to_ascii_lowercase();
    if let Some(port) = port {
        normal.push(':');
        normal.push_str(port);
    }
    Ok(Cow::Owned(normal))
}

/// Splits `host[:port]`; a bracketed IPv6 address keeps its brackets.
fn split_port(raw: &str) -> Result<(&str, Option<&str>), BadRequest> {
    if raw.starts_with('[') {
        let end = raw.find(']').ok_or(BAD_HOST)?;
        let (host, rest) = raw.split_at(end + 1);
        return match rest.strip_prefix(':') {
            Some(port) => Ok((host, Some(port))),
            None if rest.is_empty() => Ok((host, None)),
            None => Err(BAD_HOST),
        };
    }
    Ok(match raw.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (raw, None),
    })
}

fn lowercase(raw: &str) -> Cow<'_, str> {
    if raw.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(raw.to_ascii_lowercase())
    } else {
        Cow::Borrowed(raw)
    }
}

/// Applies `underscores_in_headers`: CGI/WSGI-style backends map `_` to `-`, so
/// `Transfer_Encoding` would reach them as `Transfer-Encoding` behind the proxy's back.
fn underscores(headers: &mut HeaderMap, policy: Underscores) -> Result<(), BadRequest> {
    if policy == Underscores::Allow || !headers.keys().any(has_underscore) {
        return Ok(());
    }
    if policy == Underscores::Reject {
        return Err(BadRequest("header name with an underscore"));
    }
    let named: Vec<HeaderName> = headers
        .keys()
        .filter(|n| has_underscore(n))
        .cloned()
        .collect();
    for name in named {
        tracing::debug!(header = %name, "dropped a request header whose name has an underscore");
        headers.remove(name);
    }
    Ok(())
}

fn has_underscore(name: &HeaderName) -> bool {
    name.as_str().contains('_')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn path(p: &str, escaped: EscapedSlashes) -> Result<String, u16> {
        normalize_path(p, escaped)
            .map(|n| n.unwrap_or_else(|| p.to_owned()))
            .map_err(|_| 400u16)
    }

    #[test]
    fn unreserved_escapes_are_decoded_and_slashes_merged() {
        let r = EscapedSlashes::Reject;
        assert_eq!(path("/%61dmin", r).unwrap(), "/admin");
        assert_eq!(path("//admin", r).unwrap(), "/admin");
        assert_eq!(path("/a///b//", r).unwrap(), "/a/b/");
        assert_eq!(path("/%7euser/%2D", r).unwrap(), "/~user/-");
        assert_eq!(path("/a%20b/%c3%a9", r).unwrap(), "/a%20b/%C3%A9");
        assert_eq!(path("/plain/path", r).unwrap(), "/plain/path");
        // Found by the `normalize` fuzz target: UTF-8 passes through byte for byte.
        assert_eq!(path("//\u{5a8}é/%61", r).unwrap(), "/\u{5a8}é/a");
    }

    #[test]
    fn encoded_slashes_follow_the_rule() {
        for p in ["/%2fadmin", "/%2Fadmin", "/%5cadmin", "/%5Cadmin"] {
            assert_eq!(path(p, EscapedSlashes::Reject), Err(400), "{p}");
            assert_eq!(path(p, EscapedSlashes::Unescape).unwrap(), "/admin", "{p}");
        }
        assert_eq!(path("/a%2fb", EscapedSlashes::Keep).unwrap(), "/a%2Fb");
    }

    #[test]
    fn dot_segments_plain_and_encoded_are_refused() {
        for bad in [
            "/a/../b",
            "/./x",
            "/a/..",
            "/a/%2e%2E/b",
            "/a/.%2e",
            "/%2e/x",
            "/a/%2E",
        ] {
            assert_eq!(path(bad, EscapedSlashes::Reject), Err(400), "{bad}");
        }
        for good in [
            "/",
            "/a/b",
            "/a/.../b",
            "/a/.hidden",
            "/a/b.",
            "/v1.2/x",
            "/%2e%2e%2e",
        ] {
            assert!(path(good, EscapedSlashes::Reject).is_ok(), "{good}");
        }
    }

    #[test]
    fn segments_that_are_dot_or_empty_without_their_parameters_are_refused() {
        for bad in [
            "/x/..;/admin",
            "/..;/admin",
            "/x/%2e%2e;/admin",
            "/;/admin",
            "/.;/admin",
            "/;x=y/admin",
            "/a/..;jsessionid=1",
            "/a/.%2E;x/b",
        ] {
            assert_eq!(path(bad, EscapedSlashes::Reject), Err(400), "{bad}");
        }
        for good in [
            "/a;x=1/b",
            "/internal;/x",
            "/a/b;v=2",
            "/a/...;x",
            "/.hidden;x",
        ] {
            assert!(path(good, EscapedSlashes::Reject).is_ok(), "{good}");
        }
    }

    #[test]
    fn routes_match_paths_without_their_parameters() {
        assert_eq!(match_path("/internal;/x"), "/internal/x");
        assert_eq!(match_path("/a;jsessionid=1/b;v=2"), "/a/b");
        assert_eq!(match_path("/plain/path"), "/plain/path");
        assert!(matches!(match_path("/plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_raw_backslash_is_an_encoded_slash() {
        assert_eq!(path("/\\admin", EscapedSlashes::Reject), Err(400));
        assert_eq!(path("/a\\b", EscapedSlashes::Unescape).unwrap(), "/a/b");
        assert_eq!(
            path("/\\admin", EscapedSlashes::Unescape).unwrap(),
            "/admin"
        );
        assert_eq!(path("/a\\b", EscapedSlashes::Keep).unwrap(), "/a\\b");
    }

    #[test]
    fn broken_escapes_are_refused() {
        for bad in ["/%", "/%4", "/%zz", "/a%g1"] {
            assert_eq!(path(bad, EscapedSlashes::Keep), Err(400), "{bad}");
        }
    }

    #[test]
    fn hosts_are_validated_and_normalised() {
        let ok = |h: &str| normal_authority(h).unwrap().into_owned();
        assert_eq!(ok("Secret.Example."), "secret.example");
        assert_eq!(ok("secret.example.:80"), "secret.example:80");
        assert_eq!(ok("a.internal.example."), "a.internal.example");
        assert_eq!(ok("127.0.0.1:8080"), "127.0.0.1:8080");
        assert_eq!(ok("[::1]:8080"), "[::1]:8080");
        assert_eq!(ok("under_score.local"), "under_score.local");
        for bad in [
            "a b",
            "a,b",
            "a/b",
            "a@b",
            "u:p@evil.example",
            "x\";for=6.6.6.6;by=\"y",
            "a..b",
            ".a",
            "a..",
            ".",
            "a:b:c",
            "a:8x",
            "a:123456",
            "[::1",
            "[zz]",
            "[::1]x",
        ] {
            assert!(normal_authority(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_are_rewritten_in_place() {
        let mut req = Request::get("/%61dmin//x?q=%2f")
            .header("host", "Secret.Example.:8080")
            .header("x_forwarded_for", "1.2.3.4")
            .header("x-ok", "1")
            .body(())
            .unwrap();
        normalize_request(&mut req, RequestRules::default()).unwrap();
        assert_eq!(req.uri(), "/admin/x?q=%2f");
        assert_eq!(req.headers()["host"], "secret.example:8080");
        assert!(!req.headers().contains_key("x_forwarded_for"));
        assert!(req.headers().contains_key("x-ok"));
    }

    #[test]
    fn http2_authority_is_normalised_and_must_agree_with_host() {
        let mut req = Request::get("https://Secret.Example./%61")
            .version(Version::HTTP_2)
            .body(())
            .unwrap();
        normalize_request(&mut req, RequestRules::default()).unwrap();
        assert_eq!(req.uri(), "https://secret.example/a");
        let mut split = Request::get("https://a.example/")
            .version(Version::HTTP_2)
            .header("host", "b.example")
            .body(())
            .unwrap();
        assert!(normalize_request(&mut split, RequestRules::default()).is_err());
    }

    #[test]
    fn underscore_rules() {
        let req = || {
            Request::get("/")
                .header("transfer_encoding", "chunked")
                .body(())
                .unwrap()
        };
        let rules = |u| RequestRules {
            underscores_in_headers: u,
            ..RequestRules::default()
        };
        let mut allowed = req();
        normalize_request(&mut allowed, rules(Underscores::Allow)).unwrap();
        assert!(allowed.headers().contains_key("transfer_encoding"));
        assert!(normalize_request(&mut req(), rules(Underscores::Reject)).is_err());
    }
}
