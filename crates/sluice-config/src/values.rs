//! Scalar values checked while deserializing, so that toml attaches the value's span to the
//! error: durations, sizes, file modes, groups, addresses, networks, methods, headers and
//! status codes.

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};
use ipnet::IpNet;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

/// A duration written with a unit ("250ms", "2s", "1m"); zero is allowed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dur(pub(crate) Duration);

/// A duration that must be greater than zero (timeouts, intervals, backoffs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeout(pub(crate) Duration);

/// Parses "2s"-style text; a bare number is refused because its unit would be a guess.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!(
            "duration `{text}` has no unit; write a unit like \"5s\""
        ));
    }
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("invalid duration `{text}` ({e}); expected e.g. \"250ms\", \"5s\""))?;
    if d > MAX_DURATION {
        return Err(format!(
            "duration `{text}` is longer than the maximum of 365 days"
        ));
    }
    Ok(d)
}

/// The longest duration accepted: far beyond any sane timeout, and far from overflowing the
/// clocks that add it to "now".
const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration string with a unit, like \"5s\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "duration {v} has no unit; write a string with a unit like \"5s\""
        )))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "duration {v} has no unit; write a string with a unit like \"5s\""
        )))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DurationVisitor).map(Dur)
    }
}

impl<'de> Deserialize<'de> for Timeout {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Dur(value) = Dur::deserialize(d)?;
        if value.is_zero() {
            return Err(de::Error::custom("duration must be greater than zero"));
        }
        Ok(Timeout(value))
    }
}

/// A byte size: an integer number of bytes, or text like "16KiB", "1MiB", "512".
#[derive(Debug, Clone, Copy)]
pub(crate) struct Size(pub(crate) usize);

/// Parses "16KiB"-style sizes. Units are binary (KiB/MiB/GiB); "KB"/"K" mean the same here.
pub(crate) fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = (&text[..split], text[split..].trim());
    let bad = || format!("invalid size `{text}`; expected bytes or e.g. \"16KiB\", \"1MiB\"");
    let number: usize = digits.parse().map_err(|_| bad())?;
    let multiplier: usize = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    number.checked_mul(multiplier).ok_or_else(bad)
}

struct SizeVisitor;

impl Visitor<'_> for SizeVisitor {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a size in bytes, or a string like \"16KiB\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<usize, E> {
        parse_size(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<usize, E> {
        usize::try_from(v).map_err(|_| E::custom(format!("size {v} must not be negative")))
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeVisitor).map(Size)
    }
}

/// Parses a string inside the visitor, so that toml attaches the string's own span to the
/// error even inside an array (errors raised after `deserialize` returns get the array's).
struct ParseStr<T, F> {
    parse: F,
    expecting: &'static str,
    _value: PhantomData<T>,
}

impl<T, F: FnOnce(&str) -> Result<T, String>> Visitor<'_> for ParseStr<T, F> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.parse)(v).map_err(E::custom)
    }
}

/// Deserializes a string and converts it with `parse`, whose error becomes the message.
fn from_str_with<'de, D, T>(
    d: D,
    expecting: &'static str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    d.deserialize_str(ParseStr {
        parse,
        expecting,
        _value: PhantomData,
    })
}

/// A file's permission bits, written as an octal string ("0660"); the owner's read and
/// write bits are required.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileMode(pub(crate) u32);

/// Parses "0660"-style modes: three octal digits, one leading `0` allowed.
pub(crate) fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text
        .strip_prefix('0')
        .filter(|d| d.len() == 3)
        .unwrap_or(text);
    let octal = digits.len() == 3 && digits.bytes().all(|b| (b'0'..=b'7').contains(&b));
    let mode = u32::from_str_radix(digits, 8)
        .ok()
        .filter(|_| octal)
        .ok_or_else(|| {
            format!("invalid mode `{text}`; expected octal permissions like \"0660\"")
        })?;
    if mode & 0o600 != 0o600 {
        return Err(format!(
            "mode `{text}` must let the owner read and write (0600 at least): consumers of the acceptor's own uid connect too"
        ));
    }
    Ok(mode)
}

struct ModeVisitor;

impl Visitor<'_> for ModeVisitor {
    type Value = u32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an octal mode string like \"0660\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u32, E> {
        parse_mode(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u32, E> {
        Err(E::custom(format!(
            "mode {v} is a number; write it as an octal string like \"0660\""
        )))
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ModeVisitor).map(FileMode)
    }
}

/// A group as written: a name (looked up when the file is validated) or a numeric gid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupSpec {
    Name(String),
    Id(u32),
}

struct GroupVisitor;

impl Visitor<'_> for GroupVisitor {
    type Value = GroupSpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a group name or a numeric gid")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<GroupSpec, E> {
        if v.is_empty() {
            return Err(E::custom("the group name is empty"));
        }
        Ok(GroupSpec::Name(v.to_owned()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<GroupSpec, E> {
        u32::try_from(v)
            .map(GroupSpec::Id)
            .map_err(|_| E::custom(format!("gid {v} is out of range (0 to 4294967295)")))
    }
}

impl<'de> Deserialize<'de> for GroupSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(GroupVisitor)
    }
}

/// An `IP:PORT` socket address (no host names: a listener binds an address).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Addr(pub(crate) SocketAddr);

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "an IP:PORT string", |s| {
            s.parse().map(Addr).map_err(|_| {
                format!("invalid socket address `{s}`; expected IP:PORT like \"127.0.0.1:8080\" or \"[::1]:8080\"")
            })
        })
    }
}

/// A network in CIDR notation; a bare IP means that single address (/32 or /128).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cidr(pub(crate) IpNet);

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "a CIDR string", |s| parse_cidr(s).map(Cidr))
    }
}

/// A network as routes take it (`client_cidr`): CIDR notation, or a bare IP for that single
/// address. The error says what was expected.
pub fn parse_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("invalid CIDR `{s}`; expected e.g. \"10.0.0.0/8\" or an IP"))
}

/// An HTTP method as routes take it: case-sensitive, so lowercase is refused rather than
/// never matching.
pub fn parse_method(s: &str) -> Result<Method, String> {
    if s.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(format!(
            "method `{s}` must be uppercase (methods are case-sensitive), e.g. \"{}\"",
            s.to_ascii_uppercase()
        ));
    }
    Method::from_bytes(s.as_bytes()).map_err(|_| format!("invalid HTTP method `{s}`"))
}

/// An HTTP method; methods are case-sensitive, so lowercase is refused rather than never matching.
#[derive(Debug, Clone)]
pub(crate) struct MethodValue(pub(crate) Method);

impl<'de> Deserialize<'de> for MethodValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "an HTTP method string", |s| {
            parse_method(s).map(MethodValue)
        })
    }
}

/// A header name (stored lowercase).
#[derive(Debug, Clone)]
pub(crate) struct Name(pub(crate) HeaderName);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "a header name string", |s| {
            HeaderName::from_bytes(s.as_bytes())
                .map(Name)
                .map_err(|_| format!("invalid header name `{s}`"))
        })
    }
}

/// A literal header value (no `env:`/`file:` resolution; used for matching).
#[derive(Debug, Clone)]
pub(crate) struct Value(pub(crate) HeaderValue);

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, "a header value string", |s| {
            HeaderValue::from_str(s).map(Value).map_err(|_| {
                format!("invalid header value {s:?} (control characters are not allowed)")
            })
        })
    }
}

/// A response status code, 100 to 599.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status(pub(crate) StatusCode);

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let code = i64::deserialize(d)?;
        u16::try_from(code)
            .ok()
            .filter(|c| (100..=599).contains(c))
            .and_then(|c| StatusCode::from_u16(c).ok())
            .map(Status)
            .ok_or_else(|| {
                de::Error::custom(format!("invalid status code {code}; expected 100 to 599"))
            })
    }
}

/// Either one value or an array of them (`host = "a"` or `host = ["a", "b"]`; `tls = { .. }`
/// or `tls = [{ .. }, { .. }]`).
#[derive(Debug, Clone)]
pub(crate) enum OneOrMany<T> {
    One(T),
    Many(Vec<Spanned<T>>),
}

impl<T> OneOrMany<T> {
    /// Every item with its own span; a single item takes the span of the whole value.
    pub(crate) fn into_items(value: Option<Spanned<Self>>) -> Vec<Spanned<T>> {
        let Some(value) = value else {
            return Vec::new();
        };
        let span = value.span();
        match value.into_inner() {
            OneOrMany::One(item) => vec![Spanned::new(span, item)],
            OneOrMany::Many(items) => items,
        }
    }
}

struct OneOrManyVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrManyVisitor<T> {
    type Value = OneOrMany<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("one value or an array of them")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(OneOrMany::One)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        T::deserialize(de::value::StrDeserializer::new(v)).map(OneOrMany::One)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut all = Vec::new();
        while let Some(item) = seq.next_element()? {
            all.push(item);
        }
        Ok(OneOrMany::Many(all))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OneOrManyVisitor(PhantomData))
    }
}

/// A table of headers kept in file order (a `BTreeMap` would sort them).
#[derive(Debug, Clone)]
pub(crate) struct HeaderTable<V>(pub(crate) Vec<(Name, V)>);

impl<V> Default for HeaderTable<V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

struct HeaderTableVisitor<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for HeaderTableVisitor<V> {
    type Value = Vec<(Name, V)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table of header names to values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut all = Vec::new();
        while let Some(entry) = map.next_entry()? {
            all.push(entry);
        }
        Ok(all)
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for HeaderTable<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(HeaderTableVisitor(PhantomData))
            .map(HeaderTable)
    }
}

/// Resolves a static endpoint as the configuration does: `IP:port` as it is, `host:port`
/// through the system resolver (every address it has). The error names the endpoint and why.
pub fn resolve_endpoint(text: &str) -> Result<Vec<std::net::SocketAddr>, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse::<std::net::SocketAddr>() {
        return Ok(vec![addr]);
    }
    let fail = |why: &dyn std::fmt::Display| format!("cannot resolve endpoint `{text}`: {why}");
    if !text.contains(':') {
        return Err(fail(&"expected \"host:port\" or \"IP:port\""));
    }
    let addrs: Vec<_> = text.to_socket_addrs().map_err(|e| fail(&e))?.collect();
    if addrs.is_empty() {
        return Err(fail(&"the name has no addresses"));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        let err = parse_duration("5").expect_err("no unit");
        assert!(err.contains("write a unit like \"5s\""), "{err}");
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn modes_are_octal_and_keep_the_owner() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert_eq!(parse_mode("0777"), Ok(0o777));
        for bad in ["0680", "66", "06600", "rw-rw----", "", "0x1b0"] {
            let err = parse_mode(bad).expect_err(bad);
            assert!(err.contains("expected octal permissions"), "{bad}: {err}");
        }
        let err = parse_mode("0460").expect_err("owner cannot write");
        assert!(err.contains("must let the owner read and write"), "{err}");
    }

    #[test]
    fn sizes_accept_bytes_and_binary_units() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("16KiB"), Ok(16 * 1024));
        assert_eq!(parse_size("1MiB"), Ok(1024 * 1024));
        assert_eq!(parse_size("2 kb"), Ok(2048));
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
    }
}
