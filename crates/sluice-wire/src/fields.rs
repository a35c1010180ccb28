//! Header fields by what they are to a proxy: the one table both data paths consult, the
//! fast path over bytes (`h1`) and the hyper path over a `HeaderMap` (`sluice_core::headers`).
//! A new hop-by-hop field, forwarding rule or field Sluice owns is added here, once.

/// What a field is to a proxy, by its name alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Any field the proxy forwards as it is (unless a route edit names it).
    Other,
    /// `Host`.
    Host,
    /// `Content-Length`.
    ContentLength,
    /// Hop-by-hop (RFC 9110 §7.6.1): `Connection`, `Keep-Alive`, `Proxy-Connection`, `TE`,
    /// `Transfer-Encoding`. Never forwarded.
    HopByHop,
    /// `Upgrade`: hop-by-hop, but forwarded with `Connection: upgrade` on a protocol switch.
    Upgrade,
    /// `Expect` (a `100-continue` negotiation).
    Expect,
    /// `X-Forwarded-For`: a chain the proxy appends the client to.
    ForwardedFor,
    /// `Forwarded` (RFC 7239): a chain the proxy appends the client to.
    Forwarded,
    /// `X-Forwarded-Proto`.
    ForwardedProto,
    /// `X-Forwarded-Host`.
    ForwardedHost,
    /// `Sluice-Client-Addr`: Sluice's alone to set (services trust it as the client's
    /// address), so a client's copy never passes.
    ClientAddr,
}

/// The hop-by-hop fields (RFC 9110 §7.6.1), lowercase: removed from every message a proxy
/// forwards, with the fields `Connection` lists.
pub const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// The forwarding fields (lowercase) the proxy writes itself.
pub const FORWARDED_FOR: &str = "x-forwarded-for";
/// `Forwarded`.
pub const FORWARDED: &str = "forwarded";
/// `X-Forwarded-Proto`.
pub const FORWARDED_PROTO: &str = "x-forwarded-proto";
/// `X-Forwarded-Host`.
pub const FORWARDED_HOST: &str = "x-forwarded-host";
/// `Sluice-Client-Addr` (the session protocol's `sluice_session::HEADER_CLIENT_ADDR`).
pub const CLIENT_ADDR: &str = "sluice-client-addr";

/// What the field named `name` (any case) is.
pub fn kind(name: &[u8]) -> Kind {
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    // By length first: most fields are none of these, and this runs on every field.
    match name.len() {
        2 if is("te") => Kind::HopByHop,
        4 if is("host") => Kind::Host,
        6 if is("expect") => Kind::Expect,
        7 if is("upgrade") => Kind::Upgrade,
        9 if is(FORWARDED) => Kind::Forwarded,
        10 if is("connection") || is("keep-alive") => Kind::HopByHop,
        14 if is("content-length") => Kind::ContentLength,
        15 if is(FORWARDED_FOR) => Kind::ForwardedFor,
        16 if is("proxy-connection") => Kind::HopByHop,
        16 if is(FORWARDED_HOST) => Kind::ForwardedHost,
        17 if is("transfer-encoding") => Kind::HopByHop,
        17 if is(FORWARDED_PROTO) => Kind::ForwardedProto,
        18 if is(CLIENT_ADDR) => Kind::ClientAddr,
        _ => Kind::Other,
    }
}

impl Kind {
    /// Whether `Connection` may make a field of this kind hop-by-hop by listing it: not
    /// `Host` or `Content-Length`, or a client could make the upstream see another request
    /// than the one that was routed.
    pub fn connection_may_list(self) -> bool {
        !matches!(self, Kind::Host | Kind::ContentLength)
    }

    /// Whether a client's field of this kind goes upstream as the client sent it, before the
    /// route's edits. The forwarding chains are rewritten (a trusted client's kept and
    /// appended to), `X-Forwarded-Proto` and `-Host` are kept only from a trusted client, and
    /// hop-by-hop fields and `Sluice-Client-Addr` never pass.
    pub fn passes(self, trusted: bool) -> bool {
        match self {
            Kind::Other | Kind::Host | Kind::ContentLength | Kind::Expect => true,
            Kind::ForwardedProto | Kind::ForwardedHost => trusted,
            Kind::ForwardedFor
            | Kind::Forwarded
            | Kind::HopByHop
            | Kind::Upgrade
            | Kind::ClientAddr => false,
        }
    }
}

/// Appends a `Forwarded` parameter value (RFC 7239 §4): a token as it is, anything else (a
/// `host:port`, an IPv6 literal) as a quoted string without `"` and `\`.
pub fn forwarded_value(value: &[u8], out: &mut Vec<u8>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hop_by_hop_field_is_one_whatever_its_case() {
        for name in HOP_BY_HOP {
            let kinds = [name.to_owned(), name.to_uppercase()].map(|n| kind(n.as_bytes()));
            assert!(
                kinds
                    .iter()
                    .all(|k| matches!(k, Kind::HopByHop | Kind::Upgrade)),
                "{name}: {kinds:?}"
            );
            assert!(!kinds[0].passes(true), "{name}");
        }
        assert_eq!(kind(b"X-Forwarded-Proto"), Kind::ForwardedProto);
        assert_eq!(kind(b"accept"), Kind::Other);
    }

    #[test]
    fn connection_cannot_remove_what_the_route_was_chosen_on() {
        assert!(!kind(b"host").connection_may_list());
        assert!(!kind(b"Content-Length").connection_may_list());
        assert!(kind(b"x-forwarded-host").connection_may_list());
    }

    #[test]
    fn forwarding_fields_of_an_untrusted_client_never_pass() {
        for name in [
            FORWARDED_FOR,
            FORWARDED,
            FORWARDED_PROTO,
            FORWARDED_HOST,
            CLIENT_ADDR,
        ] {
            assert!(!kind(name.as_bytes()).passes(false), "{name}");
        }
        assert!(kind(FORWARDED_PROTO.as_bytes()).passes(true));
        assert!(
            !kind(CLIENT_ADDR.as_bytes()).passes(true),
            "not even a trusted one's"
        );
    }

    #[test]
    fn forwarded_values_are_tokens_or_quoted() {
        let quoted = |v: &[u8]| {
            let mut out = Vec::new();
            forwarded_value(v, &mut out);
            String::from_utf8(out).unwrap_or_default()
        };
        assert_eq!(quoted(b"example.com"), "example.com");
        assert_eq!(quoted(b"example.com:8080"), "\"example.com:8080\"");
        assert_eq!(quoted(b"a\"b\\c:1"), "\"abc:1\"");
    }
}
