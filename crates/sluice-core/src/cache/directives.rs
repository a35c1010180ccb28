//! `Cache-Control` (RFC 9111 §5.2) read into [`Directives`], for requests and responses alike.

use std::time::Duration;

/// The directives of one message's `Cache-Control` fields (every field line, in order). A
/// directive given twice counts as first given (§4.2.1); an invalid duration (`max-age=x`,
/// `max-age=-1`) counts as zero, which makes a response stale at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    /// `max-age`.
    pub max_age: Option<Duration>,
    /// `s-maxage` (responses; a shared cache's own `max-age`).
    pub s_maxage: Option<Duration>,
    /// `max-stale` (requests): `Some(None)` for any staleness.
    pub max_stale: Option<Option<Duration>>,
    /// `min-fresh` (requests).
    pub min_fresh: Option<Duration>,
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache` (with no field names, or a request's).
    pub no_cache: bool,
    /// `no-cache="a, b"`: these fields are not served from storage without revalidation
    /// (a cache may leave them out instead, which this one does).
    pub no_cache_fields: Vec<String>,
    /// `private` without field names: never stored by a shared cache.
    pub private: bool,
    /// `private="a, b"`: these fields are left out of what a shared cache stores.
    pub private_fields: Vec<String>,
    /// `public`.
    pub public: bool,
    /// `must-revalidate`.
    pub must_revalidate: bool,
    /// `proxy-revalidate`.
    pub proxy_revalidate: bool,
    /// `only-if-cached` (requests).
    pub only_if_cached: bool,
    /// `stale-if-error` (RFC 5861 §4): how long past its lifetime an answer may still serve
    /// when the upstream fails.
    pub stale_if_error: Option<Duration>,
    /// `stale-while-revalidate` (RFC 5861 §3): how long past its lifetime an answer may
    /// still serve at once while a background request revalidates it.
    pub stale_while_revalidate: Option<Duration>,
}

impl Directives {
    /// The directives of these field values.
    pub fn parse<'a>(values: impl Iterator<Item = &'a [u8]>) -> Self {
        let mut d = Directives::default();
        for value in values {
            for (name, arg) in split(value) {
                d.set(&name, arg);
            }
        }
        d
    }

    fn set(&mut self, name: &str, arg: Option<String>) {
        let seconds = |arg: &Option<String>| Some(delta_seconds(arg.as_deref()));
        match name {
            "max-age" if self.max_age.is_none() => self.max_age = seconds(&arg),
            "s-maxage" if self.s_maxage.is_none() => self.s_maxage = seconds(&arg),
            "min-fresh" if self.min_fresh.is_none() => self.min_fresh = seconds(&arg),
            "max-stale" if self.max_stale.is_none() => {
                self.max_stale = Some(arg.map(|a| delta_seconds(Some(&a))));
            }
            "stale-if-error" if self.stale_if_error.is_none() => {
                self.stale_if_error = seconds(&arg);
            }
            "stale-while-revalidate" if self.stale_while_revalidate.is_none() => {
                self.stale_while_revalidate = seconds(&arg);
            }
            "no-store" => self.no_store = true,
            "no-cache" => match arg {
                Some(fields) => self.no_cache_fields.extend(names(&fields)),
                None => self.no_cache = true,
            },
            "private" => match arg {
                Some(fields) => self.private_fields.extend(names(&fields)),
                None => self.private = true,
            },
            "public" => self.public = true,
            "must-revalidate" => self.must_revalidate = true,
            "proxy-revalidate" => self.proxy_revalidate = true,
            "only-if-cached" => self.only_if_cached = true,
            _ => {}
        }
    }
}

/// `delta-seconds`, quoted or not; anything else (or nothing) is zero. Past `u32` it is
/// 2^31 seconds, as §1.2.2 says.
fn delta_seconds(arg: Option<&str>) -> Duration {
    let Some(arg) = arg.filter(|a| !a.is_empty() && a.bytes().all(|b| b.is_ascii_digit())) else {
        return Duration::ZERO;
    };
    let secs = arg.parse::<u64>().unwrap_or(u64::MAX).min(1 << 31);
    Duration::from_secs(secs)
}

/// The field names of a directive's argument, lowercase.
fn names(list: &str) -> impl Iterator<Item = String> + '_ {
    let names = list.split(',').map(str::trim).filter(|n| !n.is_empty());
    names.map(str::to_ascii_lowercase)
}

/// A field value's directives: names lowercase, arguments unquoted.
fn split(value: &[u8]) -> Vec<(String, Option<String>)> {
    let text = String::from_utf8_lossy(value);
    let mut out = Vec::new();
    let mut rest = text.as_ref();
    while !rest.is_empty() {
        let (item, after) = next_item(rest);
        rest = after;
        let (name, arg) = match item.split_once('=') {
            Some((n, a)) => (n, Some(unquote(a.trim()))),
            None => (item, None),
        };
        let name = name.trim().to_ascii_lowercase();
        if !name.is_empty() {
            out.push((name, arg));
        }
    }
    out
}

/// The text before the next comma outside a quoted string, and what follows it.
fn next_item(text: &str) -> (&str, &str) {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => return (&text[..i], &text[i + 1..]),
            _ => {}
        }
    }
    (text, "")
}

fn unquote(arg: &str) -> String {
    match arg.strip_prefix('"').and_then(|a| a.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => arg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(values: &[&str]) -> Directives {
        Directives::parse(values.iter().map(|v| v.as_bytes()))
    }

    #[test]
    fn reads_durations_flags_and_field_lists() {
        let d = parse(&[
            "Max-Age=60, s-maxage=\"10\"",
            "no-cache=\"Set-Cookie, X-A\", public",
        ]);
        assert_eq!(d.max_age, Some(Duration::from_secs(60)));
        assert_eq!(d.s_maxage, Some(Duration::from_secs(10)));
        assert_eq!(d.no_cache_fields, ["set-cookie", "x-a"]);
        assert!(d.public && !d.no_cache && !d.private);
    }

    #[test]
    fn the_first_of_a_repeated_directive_counts_and_bad_numbers_are_zero() {
        let d = parse(&["max-age=10", "max-age=3600"]);
        assert_eq!(d.max_age, Some(Duration::from_secs(10)));
        for bad in ["max-age=-1", "max-age=1.5", "max-age=", "max-age=a"] {
            assert_eq!(parse(&[bad]).max_age, Some(Duration::ZERO), "{bad}");
        }
        let huge = parse(&["max-age=99999999999999999999999"]);
        assert_eq!(huge.max_age, Some(Duration::from_secs(1 << 31)));
    }

    #[test]
    fn request_directives() {
        let d = parse(&["max-stale, min-fresh=5, only-if-cached, no-store"]);
        assert_eq!(d.max_stale, Some(None));
        assert_eq!(d.min_fresh, Some(Duration::from_secs(5)));
        assert!(d.only_if_cached && d.no_store);
    }
}
