//! The heads a proxy writes, by copying the sender's field lines with the proxy's edits
//! applied instead of rebuilding a header map: [`write_head`] for a request it sends upstream
//! (the target a route rewrote, hop-by-hop fields removed, the forwarding fields `X-Forwarded-For`, `Forwarded`,
//! `X-Forwarded-Proto` and `X-Forwarded-Host` added by Sluice's rules, a route's removals and
//! sets applied last), [`write_response_head`] for the upstream's response it sends the client
//! (hop-by-hop fields removed, the route's edits, framing and `Date` as hyper's server writes
//! them).

use std::io::Write as _;
use std::net::IpAddr;

use http::{HeaderName, HeaderValue};

use super::request::{BodyFraming, Field, RequestHead, Role};
use super::response::{ResponseBody, ResponseHead};
use crate::fields;

/// A client's address and its text as the forwarding fields carry it, formatted once: all of
/// a connection's requests come from one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp {
    ip: IpAddr,
    text: String,
}

impl ClientIp {
    /// `ip` and its text (`192.0.2.1`, `2001:db8::1`).
    pub fn new(ip: IpAddr) -> Self {
        Self {
            ip,
            text: ip.to_string(),
        }
    }
}

/// What the proxy knows of the client side, and the route's edits.
#[derive(Debug, Clone, Copy)]
pub struct Forward<'a> {
    /// The request target sent upstream when it is not the client's (a route rewrote it);
    /// origin form, already checked. `None`: the client's.
    pub target: Option<&'a [u8]>,
    /// The client's address.
    pub client: &'a ClientIp,
    /// Whether the client connected over TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// Whether the client is a trusted proxy, whose forwarding fields are kept and appended to;
    /// from anyone else they are replaced.
    pub trusted: bool,
    /// Fields the route removes.
    pub remove: &'a [HeaderName],
    /// Fields the route sets, replacing the client's.
    pub set: &'a [(HeaderName, HeaderValue)],
    /// Fields the proxy sets last, over the client's and the route's (a reverse session's
    /// `Sluice-Client-Addr`, the request's ID): lowercase names and values.
    pub stamps: &'a [(&'a str, &'a [u8])],
}

impl Forward<'_> {
    /// Whether a route edit or the stamp names `name` (so the client's field is not
    /// forwarded).
    fn edits(&self, name: &[u8]) -> bool {
        let named = |n: &HeaderName| n.as_str().as_bytes().eq_ignore_ascii_case(name);
        self.remove.iter().any(named)
            || self.set.iter().any(|(n, _)| named(n))
            || self.stamped(name)
    }

    fn stamped(&self, name: &[u8]) -> bool {
        self.stamps
            .iter()
            .any(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
    }

    fn proto(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
}

/// Appends to `out` the head to send upstream for `head`, parsed from `buf`.
pub fn write_head(buf: &[u8], head: &RequestHead, fwd: &Forward<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(head.method(buf));
    out.push(b' ');
    out.extend_from_slice(fwd.target.unwrap_or(head.target(buf)));
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let sent = |role| fwd.trusted && head.fields.iter().any(|f| f.role == role);
    let kept = Kept {
        proto: sent(Role::ForwardedProto),
        host: sent(Role::ForwardedHost),
    };
    for field in &head.fields {
        copy_field(buf, field, fwd, out);
    }
    write_forwarding(buf, head, fwd, &kept, out);
    for (name, value) in fwd.set {
        if !fwd.stamped(name.as_str().as_bytes()) {
            line(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    for (name, value) in fwd.stamps {
        line(out, name.as_bytes(), value);
    }
    if head.body == BodyFraming::Chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The forwarding fields a trusted client sent, which it keeps.
#[derive(Debug)]
struct Kept {
    proto: bool,
    host: bool,
}

/// Copies the client's field line unless it is hop-by-hop, dropped, one of the forwarding
/// chains (rewritten whole), a forwarding field of an untrusted client, or edited.
fn copy_field(buf: &[u8], field: &Field, fwd: &Forward<'_>, out: &mut Vec<u8>) {
    let name = &buf[field.name.clone()];
    let forward = field.role.kind().is_some_and(|k| k.passes(fwd.trusted));
    if forward && !fwd.edits(name) {
        line(out, name, &buf[field.value.clone()]);
    }
}

/// `X-Forwarded-For` and `Forwarded` with the client appended (to the trusted client's
/// chains), `X-Forwarded-Proto` and `-Host` unless a trusted client sent its own.
fn write_forwarding(
    buf: &[u8],
    head: &RequestHead,
    fwd: &Forward<'_>,
    kept: &Kept,
    out: &mut Vec<u8>,
) {
    let ip = fwd.client.text.as_bytes();
    if !fwd.edits(fields::FORWARDED_FOR.as_bytes()) {
        field_name(out, fields::FORWARDED_FOR);
        chain(buf, head, fwd, Role::ForwardedFor, out);
        out.extend_from_slice(ip);
        out.extend_from_slice(b"\r\n");
    }
    let host = &buf[head.host.clone()];
    if !fwd.edits(fields::FORWARDED.as_bytes()) {
        field_name(out, fields::FORWARDED);
        chain(buf, head, fwd, Role::Forwarded, out);
        // RFC 7239 §6: IPv6 nodes are quoted and bracketed.
        let (open, close): (&[u8], &[u8]) = match fwd.client.ip {
            IpAddr::V4(_) => (b"for=", b""),
            IpAddr::V6(_) => (b"for=\"[", b"]\""),
        };
        for part in [open, ip, close, b";proto=", fwd.proto().as_bytes()] {
            out.extend_from_slice(part);
        }
        out.extend_from_slice(b";host=");
        fields::forwarded_value(host, out);
        out.extend_from_slice(b"\r\n");
    }
    if !kept.proto && !fwd.edits(fields::FORWARDED_PROTO.as_bytes()) {
        line(
            out,
            fields::FORWARDED_PROTO.as_bytes(),
            fwd.proto().as_bytes(),
        );
    }
    if !kept.host && !fwd.edits(fields::FORWARDED_HOST.as_bytes()) {
        line(out, fields::FORWARDED_HOST.as_bytes(), host);
    }
}

/// A trusted client's values of a list field, each followed by `, `; values that are not
/// visible ASCII are left out, as the header-map path leaves them.
fn chain(buf: &[u8], head: &RequestHead, fwd: &Forward<'_>, role: Role, out: &mut Vec<u8>) {
    if !fwd.trusted {
        return;
    }
    for field in head.fields.iter().filter(|f| f.role == role) {
        let value = &buf[field.value.clone()];
        if HeaderValue::from_bytes(value).is_ok_and(|v| v.to_str().is_ok()) {
            out.extend_from_slice(value);
            out.extend_from_slice(b", ");
        }
    }
}

/// How the proxy answers the client with an upstream's response.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// Whether the request was `HEAD` (the response's `Content-Length` stays as it is).
    pub head_request: bool,
    /// Whether the client connection closes after this response (`Connection: close`).
    pub close: bool,
    /// The current date in HTTP form, sent when the upstream sent none.
    pub date: &'a [u8],
    /// Fields the route removes from responses.
    pub remove: &'a [HeaderName],
    /// Fields the route sets on responses.
    pub set: &'a [(HeaderName, HeaderValue)],
    /// Field lines added after all others as they are, each ending in CRLF (e.g. a `Vary`
    /// that adds to the upstream's); usually empty.
    pub append: &'a [u8],
    /// Fields the listener sets on every answer (`Alt-Svc` where it serves HTTP/3), over the
    /// upstream's and the route's, as hyper's server sets them last; usually none.
    pub listener: &'a [(HeaderName, HeaderValue)],
}

impl Answer<'_> {
    fn edits(&self, name: &[u8]) -> bool {
        let named = |n: &HeaderName| n.as_str().as_bytes().eq_ignore_ascii_case(name);
        self.remove.iter().any(named)
            || self.set.iter().any(|(n, _)| named(n))
            || self.listener.iter().any(|(n, _)| named(n))
    }
}

/// Appends to `out` the head to send the client for `head`, parsed from `buf`; the body that
/// follows is framed by `Content-Length` as the upstream framed it, else chunked, except in an
/// HTTP/1.0 answer, which ends when the client connection closes
/// ([`ResponseHead::ends_with_close`]).
pub fn write_response_head(
    buf: &[u8],
    head: &ResponseHead,
    answer: &Answer<'_>,
    out: &mut Vec<u8>,
) {
    // hyper's server keeps the upstream's version, so an HTTP/1.0 answer stays one.
    let version = if head.http11 { "1.1" } else { "1.0" };
    let _ = write!(out, "HTTP/{version} {:03} ", head.status);
    out.extend_from_slice(&buf[head.reason.clone()]);
    out.extend_from_slice(b"\r\n");
    let mut date = answer.set.iter().any(|(n, _)| n == http::header::DATE);
    let mut lengths = 0;
    for field in &head.fields {
        let name = &buf[field.name.clone()];
        let copy = match field.role {
            Role::Plain => true,
            Role::ContentLength => {
                lengths += 1;
                answer.head_request
                    || (lengths == 1 && matches!(head.body, ResponseBody::Length(_)))
            }
            _ => false,
        };
        if copy && !answer.edits(name) {
            date |= name.eq_ignore_ascii_case(b"date");
            line(out, name, &buf[field.value.clone()]);
        }
    }
    let listeners = |name: &HeaderName| answer.listener.iter().any(|(n, _)| n == name);
    for (name, value) in answer.set.iter().filter(|(n, _)| !listeners(n)) {
        line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    out.extend_from_slice(answer.append);
    for (name, value) in answer.listener {
        line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    let bodiless = matches!(head.status, 100..=199 | 204 | 304);
    match head.body {
        _ if answer.head_request || bodiless => {}
        ResponseBody::None => out.extend_from_slice(b"content-length: 0\r\n"),
        ResponseBody::Chunked | ResponseBody::UntilClose if head.http11 => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        // HTTP/1.0 has no chunks: the body ends when the client connection closes.
        ResponseBody::Chunked | ResponseBody::UntilClose => {}
        ResponseBody::Length(_) => {}
    }
    if !date {
        line(out, b"date", answer.date);
    }
    if answer.close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// `name: ` starting a field line.
fn field_name(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h1::{parse_request, Parsed};
    use crate::RequestRules;

    /// The forwarding fields name the client as the hyper path's writer does, for an IPv4
    /// client and an IPv6 one (quoted and bracketed in `Forwarded`, RFC 7239 §6).
    #[test]
    fn forwarding_fields_name_a_v4_or_v6_client() {
        let buf = b"GET / HTTP/1.1\r\nHost: example.com:8443\r\n\r\n";
        let Parsed::Take(head) = parse_request(buf, 8192, RequestRules::default()) else {
            panic!("the fast path takes a plain GET");
        };
        let cases = [
            (
                IpAddr::from([192, 0, 2, 1]),
                "x-forwarded-for: 192.0.2.1\r\n\
                 forwarded: for=192.0.2.1;proto=https;host=\"example.com:8443\"\r\n",
            ),
            (
                IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1]),
                "x-forwarded-for: 2001:db8::1\r\n\
                 forwarded: for=\"[2001:db8::1]\";proto=https;host=\"example.com:8443\"\r\n",
            ),
        ];
        for (ip, fields) in cases {
            let client = ClientIp::new(ip);
            let fwd = Forward {
                target: None,
                client: &client,
                tls: true,
                trusted: false,
                remove: &[],
                set: &[],
                stamps: &[],
            };
            let mut out = Vec::new();
            write_head(buf, &head, &fwd, &mut out);
            let text = String::from_utf8_lossy(&out);
            assert!(text.contains(fields), "{ip}: {text}");
        }
    }

    #[test]
    fn a_rewritten_target_replaces_the_clients() {
        let buf = b"GET /api/users?id=1 HTTP/1.1\r\nHost: a\r\n\r\n";
        let Parsed::Take(head) = parse_request(buf, 8192, RequestRules::default()) else {
            panic!("the fast path takes a plain GET");
        };
        let client = ClientIp::new(IpAddr::from([192, 0, 2, 1]));
        let fwd = Forward {
            target: Some(b"/users?id=1"),
            client: &client,
            tls: false,
            trusted: false,
            remove: &[],
            set: &[],
            stamps: &[],
        };
        let mut out = Vec::new();
        write_head(buf, &head, &fwd, &mut out);
        assert!(out.starts_with(b"GET /users?id=1 HTTP/1.1\r\nHost: a\r\n"));
    }

    #[test]
    fn stamps_replace_every_copy_and_come_last() {
        let buf = b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: mine\r\n\
                    Sluice-Client-Addr: 6.6.6.6:666\r\nx-request-id: again\r\n\r\n";
        let Parsed::Take(head) = parse_request(buf, 8192, RequestRules::default()) else {
            panic!("the fast path takes a plain GET");
        };
        let client = ClientIp::new(IpAddr::from([192, 0, 2, 1]));
        let set = [(
            HeaderName::from_static("x-request-id"),
            HeaderValue::from_static("route"),
        )];
        let fwd = Forward {
            target: None,
            client: &client,
            tls: false,
            trusted: true,
            remove: &[],
            set: &set,
            stamps: &[
                ("sluice-client-addr", b"192.0.2.1:40000"),
                ("x-request-id", b"decided"),
            ],
        };
        let mut out = Vec::new();
        write_head(buf, &head, &fwd, &mut out);
        let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
        assert_eq!(text.matches("x-request-id:").count(), 1, "{text}");
        assert_eq!(text.matches("sluice-client-addr:").count(), 1, "{text}");
        assert!(
            text.ends_with("sluice-client-addr: 192.0.2.1:40000\r\nx-request-id: decided\r\n\r\n"),
            "{text}"
        );
    }
}
