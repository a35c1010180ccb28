//! A `Range` request served from a whole stored answer (RFC 9110 §14): one byte range is a
//! `206` with `Content-Range`, a range past the end a `416`; several ranges, another unit,
//! a malformed field or an `If-Range` that does not match get the whole answer (a `200`),
//! as §14.2 lets a server ignore `Range`.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::StatusCode;

use crate::fields::Fields;
use crate::route_feature::Answer;

/// What a request's `Range` asks of a representation of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranged {
    /// The whole representation (no `Range`, or one this cache does not cut by).
    Whole,
    /// Bytes `first..=last`.
    Part { first: u64, last: u64 },
    /// No byte of it (`416`).
    Unsatisfiable,
}

/// What `range` (a `Range` field's value) asks of `len` bytes: one `bytes` range only.
pub fn parse(range: &[u8], len: u64) -> Ranged {
    let Ok(range) = std::str::from_utf8(range) else {
        return Ranged::Whole;
    };
    let Some((unit, set)) = range.trim().split_once('=') else {
        return Ranged::Whole;
    };
    let set = set.trim();
    if !unit.trim().eq_ignore_ascii_case("bytes") || set.contains(',') {
        return Ranged::Whole;
    }
    let Some((first, last)) = set.split_once('-') else {
        return Ranged::Whole;
    };
    let number = |s: &str| {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().ok())
    };
    match (number(first), number(last)) {
        // A suffix: the last `n` bytes.
        (None, Some(Some(n))) if first.trim().is_empty() => match (n, len) {
            (0, _) | (_, 0) => Ranged::Unsatisfiable,
            (n, len) => Ranged::Part {
                first: len.saturating_sub(n),
                last: len - 1,
            },
        },
        (Some(Some(first)), None) if last.trim().is_empty() => from(first, u64::MAX, len),
        (Some(Some(first)), Some(Some(last))) if first <= last => from(first, last, len),
        (Some(Some(first)), Some(None)) => from(first, u64::MAX, len),
        // Too large to be a position of anything stored: past its end.
        (Some(None), _) => Ranged::Unsatisfiable,
        _ => Ranged::Whole,
    }
}

fn from(first: u64, last: u64, len: u64) -> Ranged {
    match first < len {
        true => Ranged::Part {
            first,
            last: last.min(len - 1),
        },
        false => Ranged::Unsatisfiable,
    }
}

/// Whether a request's `If-Range` lets its `Range` apply to a stored answer with these
/// fields (§13.1.5): absent, or naming the answer's strong entity tag, or exactly its
/// `Last-Modified`.
fn if_range_holds(request: &(impl Fields + ?Sized), stored: &http::HeaderMap) -> bool {
    let Some(if_range) = request.first("if-range") else {
        return true;
    };
    let if_range = if_range.trim_ascii();
    if if_range.starts_with(b"\"") {
        let etag = stored.get(header::ETAG).map(HeaderValue::as_bytes);
        return etag.is_some_and(|e| e.trim_ascii() == if_range);
    }
    let modified = stored.get(header::LAST_MODIFIED).map(HeaderValue::as_bytes);
    modified.is_some_and(|m| m.trim_ascii() == if_range)
}

/// A whole stored `200` answer cut to the request's `Range`: a `206` with its bytes and
/// `Content-Range`, a `416` with `Content-Range: bytes */len`, or the answer as it was.
pub fn cut(request: &(impl Fields + ?Sized), answer: Answer) -> Answer {
    let Some(range) = request.first("range") else {
        return answer;
    };
    let body = answer.body.clone().unwrap_or_default();
    let len = body.len() as u64;
    let stored: http::HeaderMap = answer.fields.iter().cloned().collect();
    if answer.status != StatusCode::OK || !if_range_holds(request, &stored) {
        return answer;
    }
    let (status, content_range, body) = match parse(range, len) {
        Ranged::Whole => return answer,
        Ranged::Part { first, last } => {
            let (from, to) = (first as usize, last as usize + 1);
            let range = format!("bytes {first}-{last}/{len}");
            (StatusCode::PARTIAL_CONTENT, range, body.slice(from..to))
        }
        Ranged::Unsatisfiable => (
            StatusCode::RANGE_NOT_SATISFIABLE,
            format!("bytes */{len}"),
            Bytes::new(),
        ),
    };
    let mut fields: Vec<_> = (answer.fields.into_iter())
        .filter(|(n, _)| *n != header::CONTENT_LENGTH && *n != header::CONTENT_RANGE)
        .collect();
    if let Ok(value) = HeaderValue::from_str(&content_range) {
        fields.push((header::CONTENT_RANGE, value));
    }
    Answer {
        status,
        fields,
        body: Some(body),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http::HeaderMap;

    #[test]
    fn one_byte_range_is_parsed_against_the_length() {
        let part = |first, last| Ranged::Part { first, last };
        assert_eq!(parse(b"bytes=0-1", 10), part(0, 1));
        assert_eq!(parse(b"bytes=3-", 10), part(3, 9));
        assert_eq!(parse(b"bytes=-4", 10), part(6, 9));
        assert_eq!(parse(b"bytes=-40", 10), part(0, 9));
        assert_eq!(parse(b"bytes=5-100", 10), part(5, 9));
        assert_eq!(parse(b"Bytes = 9-9", 10), part(9, 9));
        assert_eq!(parse(b"bytes=10-", 10), Ranged::Unsatisfiable);
        assert_eq!(parse(b"bytes=-0", 10), Ranged::Unsatisfiable);
        assert_eq!(parse(b"bytes=0-", 0), Ranged::Unsatisfiable);
        assert_eq!(
            parse(b"bytes=99999999999999999999999-", 10),
            Ranged::Unsatisfiable
        );
        for whole in [
            "bytes=0-1,3-4",
            "items=0-1",
            "bytes=5-3",
            "bytes=a-b",
            "bytes",
            "0-1",
        ] {
            assert_eq!(parse(whole.as_bytes(), 10), Ranged::Whole, "{whole}");
        }
    }

    fn answer() -> Answer {
        Answer {
            status: StatusCode::OK,
            fields: vec![
                (header::ETAG, HeaderValue::from_static("\"v1\"")),
                (header::CONTENT_LENGTH, HeaderValue::from_static("10")),
            ],
            body: Some(Bytes::from_static(b"0123456789")),
        }
    }

    fn request(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in fields {
            map.append(*n, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn a_stored_answer_is_cut_to_the_range_or_refused_or_left_whole() {
        let cut_by = |fields| cut(&request(fields), answer());
        let part = cut_by(&[("range", "bytes=2-4")]);
        assert_eq!(part.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(part.body.as_deref(), Some(&b"234"[..]));
        let range = part
            .fields
            .iter()
            .find(|(n, _)| *n == header::CONTENT_RANGE);
        assert_eq!(range.unwrap().1, "bytes 2-4/10");
        assert!(!part
            .fields
            .iter()
            .any(|(n, _)| *n == header::CONTENT_LENGTH));
        let none = cut_by(&[("range", "bytes=20-")]);
        assert_eq!(none.status, StatusCode::RANGE_NOT_SATISFIABLE);
        let range = none
            .fields
            .iter()
            .find(|(n, _)| *n == header::CONTENT_RANGE);
        assert_eq!(range.unwrap().1, "bytes */10");
        assert_eq!(none.body.as_deref(), Some(&b""[..]));
        // If-Range naming the stored tag applies the range; another tag gets it all.
        let matched = cut_by(&[("range", "bytes=0-0"), ("if-range", "\"v1\"")]);
        assert_eq!(matched.status, StatusCode::PARTIAL_CONTENT);
        let other = cut_by(&[("range", "bytes=0-0"), ("if-range", "\"v2\"")]);
        assert_eq!(other.status, StatusCode::OK);
        assert_eq!(other.body.as_deref(), Some(&b"0123456789"[..]));
        assert_eq!(cut_by(&[("range", "bytes=0-1,4-5")]).status, StatusCode::OK);
        assert_eq!(cut_by(&[]).status, StatusCode::OK);
    }
}
