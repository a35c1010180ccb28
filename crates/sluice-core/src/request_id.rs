//! Request IDs (`[request_id]`): the rule of both data paths, without I/O. Every request gets
//! an ID in one field: the one a trusted client sent (a proxy in front that already named the
//! request), else a new one, so that a client cannot choose the ID a log or a service trusts.
//! The ID goes upstream in place of any copy (after the route's edits, as the client address
//! does), into the access log and into Sluice's own error answers.

use http::{HeaderName, HeaderValue};

/// Request IDs in the field `name`. Cloning is cheap.
#[derive(Debug, Clone)]
pub struct RequestIds {
    name: HeaderName,
}

impl RequestIds {
    /// IDs in the field `name` (e.g. `x-request-id`).
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }

    /// The field's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    /// The ID of a request whose first copy of the field is `sent`, from a client that is
    /// `trusted` or not: the client's when it is trusted and sent a usable one (visible ASCII,
    /// at most 200 bytes), else a new one.
    pub fn decide(&self, sent: Option<&[u8]>, trusted: bool) -> HeaderValue {
        sent.filter(|v| trusted && usable(v))
            .and_then(|v| HeaderValue::from_bytes(v).ok())
            .unwrap_or_else(generate)
    }
}

/// The longest ID kept from a client: longer ones are replaced (a log line is no place for a
/// client's kilobytes).
const MAX_KEPT: usize = 200;

fn usable(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= MAX_KEPT && v.iter().all(|b| (0x21..0x7f).contains(b))
}

/// A random (version 4) UUID, `8-4-4-4-12` lowercase hex, as Envoy's `x-request-id`. From the
/// thread's fast generator, not the OS: an ID must be unique, not secret, and a syscall per
/// request would cost more than the rest of this.
fn generate() -> HeaderValue {
    let mut bits = fastrand::u128(..);
    // Version 4 (random) and the RFC 9562 variant.
    bits = (bits & !(0xf << 76)) | (0x4 << 76);
    bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = [b'-'; 36];
    let digits = (0..36).filter(|i| ![8, 13, 18, 23].contains(i));
    for (n, at) in digits.enumerate() {
        id[at] = HEX[(bits >> (124 - 4 * n)) as usize & 0xf];
    }
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> RequestIds {
        RequestIds::new(HeaderName::from_static("x-request-id"))
    }

    #[test]
    fn a_trusted_clients_id_is_kept() {
        assert_eq!(ids().decide(Some(b"abc-123"), true), "abc-123");
    }

    #[test]
    fn an_untrusted_clients_id_is_replaced() {
        let id = ids().decide(Some(b"abc-123"), false);
        assert_ne!(id, "abc-123");
        assert_eq!(id.len(), 36);
    }

    #[test]
    fn an_unusable_id_is_replaced_even_from_a_trusted_client() {
        for sent in [&b""[..], b"a b", &[b'x'; 201]] {
            assert_eq!(ids().decide(Some(sent), true).len(), 36, "{sent:?}");
        }
    }

    #[test]
    fn new_ids_are_version_4_uuids_and_differ() {
        let a = ids().decide(None, true);
        let b = ids().decide(None, true);
        assert_ne!(a, b);
        let a = a.to_str().unwrap_or_default();
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{a}");
        assert_eq!(&a[14..15], "4", "{a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
