//! [`write_head`]: the head a proxy sends upstream for a request it took, written by copying
//! the client's field lines with the proxy's edits applied instead of rebuilding a header map:
//! hop-by-hop fields removed, the forwarding fields (`X-Forwarded-For`, `Forwarded`,
//! `X-Forwarded-Proto`, `X-Forwarded-Host`) added by Sluice's rules, a route's removals and
//! sets applied last.

use std::io::Write as _;
use std::net::IpAddr;

use http::{HeaderName, HeaderValue};

use super::request::{BodyFraming, Field, RequestHead, Role};

/// What the proxy knows of the client side, and the route's edits.
#[derive(Debug, Clone, Copy)]
pub struct Forward<'a> {
    /// The client's address.
    pub client: IpAddr,
    /// Whether the client connected over TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// Whether the client is a trusted proxy, whose forwarding fields are kept and appended to;
    /// from anyone else they are replaced.
    pub trusted: bool,
    /// Fields the route removes.
    pub remove: &'a [HeaderName],
    /// Fields the route sets, replacing the client's.
    pub set: &'a [(HeaderName, HeaderValue)],
}

impl Forward<'_> {
    /// Whether a route edit names `name` (so the client's field is not forwarded).
    fn edits(&self, name: &[u8]) -> bool {
        let named = |n: &HeaderName| n.as_str().as_bytes().eq_ignore_ascii_case(name);
        self.remove.iter().any(named) || self.set.iter().any(|(n, _)| named(n))
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
    out.extend_from_slice(head.target(buf));
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
        line(out, name.as_str().as_bytes(), value.as_bytes());
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
    let forward = match field.role {
        Role::Plain | Role::Host | Role::ContentLength => true,
        Role::ForwardedProto | Role::ForwardedHost => fwd.trusted,
        Role::ForwardedFor | Role::Forwarded | Role::HopByHop | Role::Dropped => false,
    };
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
    let ip = fwd.client;
    if !fwd.edits(b"x-forwarded-for") {
        out.extend_from_slice(b"x-forwarded-for: ");
        chain(buf, head, fwd, Role::ForwardedFor, out);
        let _ = write!(out, "{ip}\r\n");
    }
    let host = &buf[head.host.clone()];
    if !fwd.edits(b"forwarded") {
        out.extend_from_slice(b"forwarded: ");
        chain(buf, head, fwd, Role::Forwarded, out);
        let _ = match ip {
            IpAddr::V4(v4) => write!(out, "for={v4};proto={}", fwd.proto()),
            // RFC 7239 §6: IPv6 nodes are quoted and bracketed.
            IpAddr::V6(v6) => write!(out, "for=\"[{v6}]\";proto={}", fwd.proto()),
        };
        out.extend_from_slice(b";host=");
        forwarded_value(host, out);
        out.extend_from_slice(b"\r\n");
    }
    if !kept.proto && !fwd.edits(b"x-forwarded-proto") {
        line(out, b"x-forwarded-proto", fwd.proto().as_bytes());
    }
    if !kept.host && !fwd.edits(b"x-forwarded-host") {
        line(out, b"x-forwarded-host", host);
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

/// A `Forwarded` value: a token as it is, anything else (a port's `:`) quoted.
fn forwarded_value(value: &[u8], out: &mut Vec<u8>) {
    let token = value
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(b));
    if token {
        out.extend_from_slice(value);
        return;
    }
    out.push(b'"');
    out.extend(value.iter().filter(|b| !matches!(b, b'"' | b'\\')));
    out.push(b'"');
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}
