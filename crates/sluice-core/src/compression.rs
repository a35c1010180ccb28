//! Response compression, without I/O: which encoding a client gets ([`negotiate`], from its
//! `Accept-Encoding`), whether a response is compressed ([`decide`]) and what that does to its
//! head ([`apply`]). The hyper path compresses (`body::Compressed`); the fast path hands a
//! request whose client accepts an encoding to hyper, and asks [`decide`] only whether its
//! response needs `Vary: Accept-Encoding`.

use http::header::{self, HeaderMap, HeaderValue};
use sluice_config::{Compression, Encoding};

/// How many `Accept-Encoding` entries are read; past them a hostile list costs nothing more
/// (real clients send a handful).
const MAX_ENTRIES: usize = 32;

/// A q-value in thousandths (RFC 9110 §12.4.2): 0 refuses, 1000 is the default.
type Weight = u16;

/// The encoding of `offered` that the client's `Accept-Encoding` fields (`values`) weigh
/// highest, the first in `offered` among equals; `None` when it accepts none of them (no
/// field, q=0, unknown codings only) or weighs `identity` higher.
pub fn negotiate<'a>(
    offered: &[Encoding],
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Option<Encoding> {
    let weights = Weights::parse(values);
    let mut best: Option<(Encoding, Weight)> = None;
    for &encoding in offered {
        let q = weights.of(encoding);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((encoding, q));
        }
    }
    let (encoding, q) = best?;
    (weights.identity.is_none_or(|i| i <= q)).then_some(encoding)
}

/// What the client said of each coding Sluice knows; the first mention of each counts.
#[derive(Debug, Default)]
struct Weights {
    zstd: Option<Weight>,
    br: Option<Weight>,
    gzip: Option<Weight>,
    any: Option<Weight>,
    identity: Option<Weight>,
}

impl Weights {
    fn parse<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut weights = Self::default();
        let entries = values
            .into_iter()
            .flat_map(|v| v.split(|b| *b == b','))
            .take(MAX_ENTRIES);
        for entry in entries {
            if let Some((coding, q)) = entry_of(entry) {
                if let Some(slot) = weights.slot(coding) {
                    slot.get_or_insert(q);
                }
            }
        }
        weights
    }

    fn slot(&mut self, coding: &[u8]) -> Option<&mut Option<Weight>> {
        let is = |name: &[u8]| coding.eq_ignore_ascii_case(name);
        Some(match () {
            () if is(b"zstd") => &mut self.zstd,
            () if is(b"br") => &mut self.br,
            // RFC 9110 §8.4.1.3: x-gzip is gzip.
            () if is(b"gzip") || is(b"x-gzip") => &mut self.gzip,
            () if is(b"*") => &mut self.any,
            () if is(b"identity") => &mut self.identity,
            () => return None,
        })
    }

    /// Its own weight, else that of `*`, else refused.
    fn of(&self, encoding: Encoding) -> Weight {
        let own = match encoding {
            Encoding::Zstd => self.zstd,
            Encoding::Brotli => self.br,
            Encoding::Gzip => self.gzip,
        };
        own.or(self.any).unwrap_or(0)
    }
}

/// `coding` or `coding;q=0.5` (other parameters ignored); `None` for a malformed q-value or
/// an empty entry.
fn entry_of(entry: &[u8]) -> Option<(&[u8], Weight)> {
    let mut parts = entry.split(|b| *b == b';');
    let coding = parts.next()?.trim_ascii();
    if coding.is_empty() {
        return None;
    }
    let mut q = 1000;
    for param in parts {
        let param = param.trim_ascii();
        if param.len() >= 2 && param[..2].eq_ignore_ascii_case(b"q=") {
            q = qvalue(&param[2..])?;
        }
    }
    Some((coding, q))
}

/// `0`, `0.5`, `1`, `1.000` (at most three decimals, never above 1).
fn qvalue(text: &[u8]) -> Option<Weight> {
    let (int, frac) = match text.iter().position(|b| *b == b'.') {
        Some(dot) => (&text[..dot], &text[dot + 1..]),
        None => (text, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths: Weight = 0;
    for (i, digit) in frac.iter().enumerate() {
        thousandths += Weight::from(digit - b'0') * [100, 10, 1][i];
    }
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// What [`decide`] reads of a response, gathered from either path's form of its head.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseFacts<'a> {
    /// The status code.
    pub status: u16,
    /// Whether it answers a `HEAD` request.
    pub head_request: bool,
    /// `Content-Type`, as sent.
    pub content_type: Option<&'a [u8]>,
    /// Whether it has a `Content-Encoding` already.
    pub encoded: bool,
    /// Whether `Cache-Control` says `no-transform`.
    pub no_transform: bool,
    /// Whether it carries a `Content-Range`.
    pub range: bool,
    /// Its body's length, when known before the body (`Content-Length`).
    pub length: Option<u64>,
}

/// What becomes of a response on a route that compresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Compress it with this encoding; `flush` after every chunk (an event stream).
    Compress { encoding: Encoding, flush: bool },
    /// Sent as it is only because the client accepts no encoding offered: caches must know
    /// that it varies with `Accept-Encoding`.
    Vary,
    /// Sent as it is, whoever asks.
    Leave,
}

/// Whether the response `res` is compressed on a route with `config` for a client that
/// accepts `accepted` (see [`negotiate`]): only one that has a body (not 1xx, 204, 304, nor
/// the answer to `HEAD`), is not encoded or a range already, does not forbid it
/// (`no-transform`), has a listed type, and is at least `min_size` long or of unknown length.
pub fn decide(
    config: &Compression,
    accepted: Option<Encoding>,
    res: &ResponseFacts<'_>,
) -> Decision {
    let bodiless = res.head_request || matches!(res.status, 100..=199 | 204 | 304);
    let small = res.length.is_some_and(|n| n == 0 || n < config.min_size);
    let listed = res.content_type.is_some_and(|t| listed(&config.types, t));
    if bodiless || small || res.encoded || res.no_transform || res.range || res.status == 206 {
        return Decision::Leave;
    }
    match accepted {
        _ if !listed => Decision::Leave,
        Some(encoding) => Decision::Compress {
            encoding,
            flush: res
                .content_type
                .is_some_and(super::read_ahead::is_event_stream),
        },
        None => Decision::Vary,
    }
}

/// Whether `content_type` (parameters ignored) is one of `types` (`type/subtype`, `type/*`).
fn listed(types: &[String], content_type: &[u8]) -> bool {
    let media = content_type
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default();
    let media = media.trim_ascii();
    types.iter().any(|t| match t.strip_suffix('*') {
        Some(prefix) => {
            media.len() > prefix.len()
                && media[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
        }
        None => media.eq_ignore_ascii_case(t.as_bytes()),
    })
}

impl<'a> ResponseFacts<'a> {
    /// The facts of a response head held in a header map.
    pub fn of(status: u16, head_request: bool, headers: &'a HeaderMap) -> Self {
        let length = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
        Self {
            status,
            head_request,
            content_type: headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes),
            encoded: headers.contains_key(header::CONTENT_ENCODING),
            no_transform: headers
                .get_all(header::CACHE_CONTROL)
                .iter()
                .any(|v| no_transform(v.as_bytes())),
            range: headers.contains_key(header::CONTENT_RANGE),
            length,
        }
    }
}

/// Whether a `Cache-Control` value has the `no-transform` directive.
pub fn no_transform(value: &[u8]) -> bool {
    value
        .split(|b| *b == b',')
        .any(|d| d.trim_ascii().eq_ignore_ascii_case(b"no-transform"))
}

/// Whether `Vary` values already cover `Accept-Encoding` (named, or `*`).
pub fn varies<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> bool {
    values
        .into_iter()
        .flat_map(|v| v.split(|b| *b == b','))
        .any(|name| {
            let name = name.trim_ascii();
            name == b"*" || name.eq_ignore_ascii_case(b"accept-encoding")
        })
}

/// The field the head of a response that varies with `Accept-Encoding` gets.
pub const VARY_LINE: &[u8] = b"vary: accept-encoding\r\n";

/// Edits the head of a response as `decision` says: a compressed one loses `Content-Length`
/// (its length is no longer known), names its encoding and has its strong `ETag` weakened (the
/// bytes differ; RFC 9110 §8.8.1); both it and a [`Decision::Vary`] one get `Vary:
/// Accept-Encoding` appended, unless their `Vary` covers it already.
pub fn apply(headers: &mut HeaderMap, decision: Decision) {
    let encoding = match decision {
        Decision::Leave => return,
        Decision::Vary => None,
        Decision::Compress { encoding, .. } => Some(encoding),
    };
    if !varies(
        headers
            .get_all(header::VARY)
            .iter()
            .map(HeaderValue::as_bytes),
    ) {
        let value = HeaderValue::from_static("accept-encoding");
        headers.append(header::VARY, value);
    }
    let Some(encoding) = encoding else { return };
    headers.remove(header::CONTENT_LENGTH);
    let token = HeaderValue::from_static(encoding.token());
    headers.insert(header::CONTENT_ENCODING, token);
    if let Some(etag) = headers.get(header::ETAG) {
        if !etag.as_bytes().starts_with(b"W/") {
            let mut weak = b"W/".to_vec();
            weak.extend_from_slice(etag.as_bytes());
            if let Ok(weak) = HeaderValue::from_bytes(&weak) {
                headers.insert(header::ETAG, weak);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Encoding; 3] = [Encoding::Zstd, Encoding::Brotli, Encoding::Gzip];

    fn pick(offered: &[Encoding], ae: &str) -> Option<Encoding> {
        negotiate(offered, [ae.as_bytes()])
    }

    #[test]
    fn the_highest_q_wins_and_the_server_order_breaks_ties() {
        assert_eq!(pick(&ALL, "gzip, br"), Some(Encoding::Brotli));
        assert_eq!(pick(&ALL, "gzip, br;q=0.5"), Some(Encoding::Gzip));
        assert_eq!(pick(&ALL, "br;q=0.8, zstd;q=0.8"), Some(Encoding::Zstd));
        assert_eq!(pick(&[Encoding::Gzip], "zstd, br"), None);
        assert_eq!(pick(&ALL, "x-gzip"), Some(Encoding::Gzip));
        assert_eq!(pick(&ALL, "GZIP ; Q=1.000"), Some(Encoding::Gzip));
    }

    #[test]
    fn q0_refuses_and_star_stands_for_the_rest() {
        assert_eq!(pick(&ALL, "gzip;q=0"), None);
        assert_eq!(pick(&ALL, "*"), Some(Encoding::Zstd));
        assert_eq!(pick(&ALL, "zstd;q=0, *"), Some(Encoding::Brotli));
        assert_eq!(pick(&ALL, "*;q=0, gzip"), Some(Encoding::Gzip));
        assert_eq!(pick(&ALL, "*;q=0"), None);
        assert_eq!(pick(&ALL, ""), None);
        assert_eq!(negotiate(&ALL, []), None);
    }

    #[test]
    fn identity_weighed_higher_wins() {
        assert_eq!(pick(&ALL, "gzip;q=0.5, identity"), None);
        assert_eq!(pick(&ALL, "gzip, identity;q=0.5"), Some(Encoding::Gzip));
        assert_eq!(pick(&ALL, "identity"), None);
    }

    #[test]
    fn malformed_entries_are_skipped() {
        for bad in [
            "gzip;q=2",
            "gzip;q=0.5555",
            "gzip;q=x",
            "gzip;q=-1",
            "gzip;q=",
            ";;,,",
        ] {
            assert_eq!(pick(&ALL, bad), None, "{bad}");
        }
        assert_eq!(pick(&ALL, "gzip;q=2, br"), Some(Encoding::Brotli));
        assert_eq!(pick(&ALL, "gzip;foo=bar"), Some(Encoding::Gzip));
    }

    #[test]
    fn a_hostile_list_is_read_only_so_far() {
        let long = format!("{}gzip", "x,".repeat(100_000));
        assert_eq!(pick(&ALL, &long), None);
        let fields = vec![b"a;q=0.1".as_slice(); 100_000];
        assert_eq!(negotiate(&ALL, fields), None);
        assert_eq!(pick(&ALL, "\u{0}\u{ff},gzip"), Some(Encoding::Gzip));
    }

    fn text(length: Option<u64>) -> ResponseFacts<'static> {
        ResponseFacts {
            status: 200,
            content_type: Some(b"text/html; charset=utf-8"),
            length,
            ..ResponseFacts::default()
        }
    }

    #[test]
    fn only_listed_bodies_large_enough_are_compressed() {
        let c = Compression::default();
        let gzip = Some(Encoding::Gzip);
        let compress = Decision::Compress {
            encoding: Encoding::Gzip,
            flush: false,
        };
        assert_eq!(decide(&c, gzip, &text(Some(4096))), compress);
        assert_eq!(decide(&c, gzip, &text(None)), compress);
        assert_eq!(decide(&c, None, &text(None)), Decision::Vary);
        assert_eq!(decide(&c, gzip, &text(Some(100))), Decision::Leave);
        let image = ResponseFacts {
            content_type: Some(b"image/png"),
            ..text(None)
        };
        assert_eq!(decide(&c, None, &image), Decision::Leave);
        for res in [
            ResponseFacts {
                status: 204,
                ..text(None)
            },
            ResponseFacts {
                status: 304,
                ..text(None)
            },
            ResponseFacts {
                status: 206,
                ..text(None)
            },
            ResponseFacts {
                head_request: true,
                ..text(None)
            },
            ResponseFacts {
                encoded: true,
                ..text(None)
            },
            ResponseFacts {
                no_transform: true,
                ..text(None)
            },
            ResponseFacts {
                range: true,
                ..text(None)
            },
            ResponseFacts {
                content_type: None,
                ..text(None)
            },
        ] {
            assert_eq!(decide(&c, gzip, &res), Decision::Leave, "{res:?}");
        }
        let events = ResponseFacts {
            content_type: Some(b"text/event-stream"),
            ..text(None)
        };
        let flushed = Decision::Compress {
            encoding: Encoding::Gzip,
            flush: true,
        };
        assert_eq!(decide(&c, gzip, &events), flushed);
    }

    #[test]
    fn the_head_names_the_encoding_and_keeps_other_vary_fields() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5000"));
        headers.insert(header::VARY, HeaderValue::from_static("origin"));
        headers.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
        let decision = Decision::Compress {
            encoding: Encoding::Brotli,
            flush: false,
        };
        apply(&mut headers, decision);
        assert!(!headers.contains_key(header::CONTENT_LENGTH));
        assert_eq!(headers[header::CONTENT_ENCODING], "br");
        assert_eq!(headers[header::ETAG], "W/\"abc\"");
        let vary: Vec<_> = headers.get_all(header::VARY).iter().collect();
        assert_eq!(vary, ["origin", "accept-encoding"]);
        apply(&mut headers, Decision::Vary);
        assert_eq!(headers.get_all(header::VARY).iter().count(), 2);
    }
}
