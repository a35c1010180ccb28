//! Header rules every proxy hop applies (RFC 9110 §7.6.1 and RFC 7239).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;
use sluice_config::HeaderEdits;
use sluice_wire::fields;

/// `Forwarded` (RFC 7239).
static FORWARDED: HeaderName = header::FORWARDED;
/// `X-Forwarded-For`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static(fields::FORWARDED_FOR);
/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static(fields::FORWARDED_PROTO);
/// `X-Forwarded-Host`.
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static(fields::FORWARDED_HOST);

/// Removes hop-by-hop headers (RFC 9110 §7.6.1, [`fields::HOP_BY_HOP`]): `Connection` and
/// every header it names, `Keep-Alive`, `Proxy-Connection`, `TE`, `Transfer-Encoding` and
/// `Upgrade`.
///
/// `Connection` may not remove `Host` or `Content-Length`: a client could otherwise make the
/// upstream see a request different from the one that was routed.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Collect the names listed in Connection first: removing while iterating is not possible.
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| fields::kind(name.as_str().as_bytes()).connection_may_list())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in fields::HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Marks a request whose client said `TE: trailers` (hop-by-hop, so removed on the way): an
/// HTTP/2 upstream is told again, as gRPC services require.
#[derive(Debug, Clone, Copy)]
pub struct TrailersWanted;

/// Whether `TE` lists `trailers`.
pub fn wants_trailers(headers: &HeaderMap) -> bool {
    tokens(headers, &header::TE).any(|t| t.eq_ignore_ascii_case("trailers"))
}

/// Whether a request asks to switch protocols (RFC 9110 §7.8): HTTP/1.1, `Connection: upgrade`
/// and an `Upgrade` header. HTTP/2 has no such mechanism, and an `h2c` upgrade is refused:
/// the proxy speaks HTTP/2 to clients itself and only HTTP/1.1 to upstreams.
pub fn wants_upgrade(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_11
        && connection_lists(headers, "upgrade")
        && headers.contains_key(header::UPGRADE)
        && !tokens(headers, &header::UPGRADE).any(|p| p.eq_ignore_ascii_case("h2c"))
}

/// Removes hop-by-hop headers like [`strip_hop_by_hop`] but keeps `Upgrade` and sets
/// `Connection: upgrade`: what a proxy forwards for a protocol switch, both ways.
pub fn strip_hop_by_hop_keep_upgrade(headers: &mut HeaderMap) {
    let upgrade: Vec<HeaderValue> = headers.get_all(header::UPGRADE).iter().cloned().collect();
    strip_hop_by_hop(headers);
    for value in upgrade {
        headers.append(header::UPGRADE, value);
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
}

/// Joins several `Cookie` fields into one, separated by `"; "`.
pub fn join_cookies(headers: &mut HeaderMap) {
    let mut cookies = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (cookies.next(), cookies.next()) else {
        return;
    };
    let mut joined = Vec::with_capacity(first.len() * 2);
    for (i, v) in headers.get_all(header::COOKIE).iter().enumerate() {
        if i > 0 {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(joined)) {
        headers.insert(header::COOKIE, value);
    }
}

/// Whether a `Connection` header asks for the connection to be closed.
pub fn wants_close(headers: &HeaderMap) -> bool {
    connection_lists(headers, "close")
}

/// Whether `Connection` lists `option` (case-insensitive).
fn connection_lists(headers: &HeaderMap, option: &str) -> bool {
    tokens(headers, &header::CONNECTION).any(|t| t.eq_ignore_ascii_case(option))
}

/// The items of a comma-separated list header, trimmed.
fn tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// What the proxy knows about the client side of a request.
#[derive(Debug, Clone)]
pub struct Forwarding<'a> {
    /// The client's address.
    pub client: SocketAddr,
    /// `https` when the client connected over TLS, else `http`.
    pub proto: &'a str,
    /// The host the client asked for (its Host header or :authority), if any.
    pub host: Option<HeaderValue>,
    /// Whether the client is a trusted proxy (`trusted_proxies`) whose forwarding headers are
    /// kept.
    pub trusted: bool,
}

/// Adds the client to `X-Forwarded-For` and `Forwarded`, and sets `X-Forwarded-Proto` and
/// `X-Forwarded-Host`. From a trusted proxy the chains it sent are kept and appended to, and
/// its `X-Forwarded-Proto` and `-Host` are kept; from anyone else all four are replaced, so a
/// client cannot make an upstream believe it came from another address. `Sluice-Client-Addr`
/// is Sluice's alone (sessions trust it as the client's address): a client's copy never
/// passes, to any upstream, trusted or not.
///
/// Runs on every proxied request, so each list header costs one allocation.
pub fn add_forwarding(headers: &mut HeaderMap, fwd: &Forwarding<'_>) {
    headers.remove(fields::CLIENT_ADDR);
    let ip = fwd.client.ip();
    let mut xff = existing_list(headers, &X_FORWARDED_FOR, fwd.trusted);
    let _ = write!(xff, "{ip}");
    set_owned(headers, &X_FORWARDED_FOR, xff);

    let mut forwarded = existing_list(headers, &FORWARDED, fwd.trusted);
    let _ = match ip {
        IpAddr::V4(v4) => write!(forwarded, "for={v4};proto={}", fwd.proto),
        // RFC 7239 §6: IPv6 nodes are quoted and bracketed.
        IpAddr::V6(v6) => write!(forwarded, "for=\"[{v6}]\";proto={}", fwd.proto),
    };
    let mut forwarded = forwarded.into_bytes();
    if let Some(host) = fwd.host.as_ref().and_then(|h| h.to_str().ok()) {
        forwarded.extend_from_slice(b";host=");
        fields::forwarded_value(host.as_bytes(), &mut forwarded);
    }
    set_owned(headers, &FORWARDED, forwarded);

    let keep = |name: &HeaderName| fwd.trusted && headers.contains_key(name);
    let (keep_proto, keep_host) = (keep(&X_FORWARDED_PROTO), keep(&X_FORWARDED_HOST));
    if !keep_proto {
        let proto = HeaderValue::from_static(proto_value(fwd.proto));
        headers.insert(X_FORWARDED_PROTO.clone(), proto);
    }
    if !keep_host {
        match &fwd.host {
            Some(host) => headers.insert(X_FORWARDED_HOST.clone(), host.clone()),
            None => headers.remove(&X_FORWARDED_HOST),
        };
    }
}

fn proto_value(proto: &str) -> &'static str {
    if proto == "https" {
        "https"
    } else {
        "http"
    }
}

/// The values already in a comma-separated list header, joined and ready for one more item;
/// empty unless `keep`.
fn existing_list(headers: &HeaderMap, name: &HeaderName, keep: bool) -> String {
    let mut joined = String::with_capacity(64);
    if !keep {
        return joined;
    }
    for v in headers.get_all(name).iter().filter_map(|v| v.to_str().ok()) {
        joined.push_str(v);
        joined.push_str(", ");
    }
    joined
}

/// Replaces `name` with `value` without copying it.
fn set_owned(headers: &mut HeaderMap, name: &HeaderName, value: impl Into<Bytes>) {
    if let Ok(value) = HeaderValue::from_maybe_shared(value.into()) {
        headers.insert(name.clone(), value);
    }
}

/// Applies a route's edits: removals first, then sets (replacing existing values).
pub fn apply_edits(headers: &mut HeaderMap, edits: &HeaderEdits) {
    for name in &edits.remove {
        headers.remove(name);
    }
    for (name, value) in &edits.set {
        headers.insert(name.clone(), value.clone());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_session_protocols_client_address_field_is_the_one_never_forwarded() {
        let kind = fields::kind(sluice_session::HEADER_CLIENT_ADDR.as_bytes());
        assert_eq!(kind, fields::Kind::ClientAddr);
        assert!(!kind.passes(true));
    }

    #[test]
    fn strips_connection_and_the_headers_it_names() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn forwarding_from_a_trusted_proxy_appends_to_its_chain() {
        let mut h = HeaderMap::new();
        h.insert(&X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        h.insert(header::FORWARDED, HeaderValue::from_static("for=10.0.0.1"));
        h.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        let fwd = Forwarding {
            client: "192.0.2.1:4000".parse().unwrap(),
            proto: "http",
            host: None,
            trusted: true,
        };
        add_forwarding(&mut h, &fwd);
        assert_eq!(h[&X_FORWARDED_FOR], "10.0.0.1, 192.0.2.1");
        assert_eq!(
            h[header::FORWARDED],
            "for=10.0.0.1, for=192.0.2.1;proto=http"
        );
        assert_eq!(h[&X_FORWARDED_PROTO], "https");
    }

    #[test]
    fn forwarding_from_anyone_else_replaces_the_chain() {
        let mut h = HeaderMap::new();
        h.insert(&X_FORWARDED_FOR, HeaderValue::from_static("6.6.6.6"));
        h.insert(header::FORWARDED, HeaderValue::from_static("for=6.6.6.6"));
        h.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("spoofed"));
        let fwd = Forwarding {
            client: "[2001:db8::1]:4000".parse().unwrap(),
            proto: "https",
            host: Some(HeaderValue::from_static("example.com:8443")),
            trusted: false,
        };
        add_forwarding(&mut h, &fwd);
        assert_eq!(h[&X_FORWARDED_FOR], "2001:db8::1");
        assert_eq!(h[&X_FORWARDED_PROTO], "https");
        assert_eq!(h[&X_FORWARDED_HOST], "example.com:8443");
        assert_eq!(
            h[header::FORWARDED],
            "for=\"[2001:db8::1]\";proto=https;host=\"example.com:8443\""
        );
    }

    #[test]
    fn connection_cannot_remove_host_or_content_length_and_trailer_stays() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("host, content-length"),
        );
        h.insert(header::HOST, HeaderValue::from_static("a"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("1"));
        h.insert(header::TRAILER, HeaderValue::from_static("x-checksum"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 3, "{h:?}");
    }

    #[test]
    fn cookies_are_joined() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1"));
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        join_cookies(&mut h);
        assert_eq!(
            h.get_all(header::COOKIE).iter().collect::<Vec<_>>(),
            ["a=1; b=2"]
        );
    }

    #[test]
    fn upgrade_needs_http11_connection_upgrade_and_upgrade_header() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(Version::HTTP_11, &h));
        assert!(!wants_upgrade(Version::HTTP_2, &h));
        assert!(!wants_upgrade(Version::HTTP_10, &h));
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        assert!(!wants_upgrade(Version::HTTP_11, &h));
        h.remove(header::UPGRADE);
        assert!(!wants_upgrade(Version::HTTP_11, &h));
    }

    #[test]
    fn keep_upgrade_strips_everything_else_hop_by_hop() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, x-secret"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        strip_hop_by_hop_keep_upgrade(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h[header::UPGRADE], "websocket");
        assert_eq!(h[header::CONNECTION], "upgrade");
    }

    #[test]
    fn wants_close_is_case_insensitive_and_list_aware() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, CLOSE"),
        );
        assert!(wants_close(&h));
    }
}
