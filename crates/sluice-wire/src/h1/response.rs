//! [`parse_response`]: an upstream's HTTP/1.x response head read into offsets, with the body
//! framing hyper's client would give it (RFC 9112 §6.3), and whether the connection may carry
//! another request.
//!
//! Unlike a request, a response cannot be left to hyper: the fast path forwards it or answers
//! 502 itself. So this parser must agree with hyper's client on everything: informational
//! responses skipped, no body for `HEAD`, 204 and 304, `Transfer-Encoding` framing the body
//! when present (chunked when it is the final coding, else until close, and an error in
//! HTTP/1.0), then `Content-Length` (all values equal, else an error), else until close. A
//! response with both `Transfer-Encoding` and `Content-Length` loses the latter and its
//! connection is not reused, as the header-map path treats it.

use std::ops::Range;

use super::request::{offset, Field, Role, MAX_HEADERS};
use crate::fields::{self, Kind};

/// Why a `101` is refused: the fast path never asks to switch protocols (it leaves upgrades to
/// hyper), so one is always unasked.
pub const UNASKED_SWITCH: &str = "upstream switched protocols unasked";

/// What [`parse_response`] made of the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedResponse {
    /// The head is not complete yet (and within the size limit).
    Partial,
    /// A final response (informational ones before it skipped).
    Head(ResponseHead),
    /// A response hyper's client refuses (the proxy answers 502), and why.
    Invalid(&'static str),
}

/// How a response's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Everything until the upstream closes the connection.
    UntilClose,
}

/// A final response head, as offsets into the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Bytes of the head, informational responses before it included.
    pub len: usize,
    /// The status code.
    pub status: u16,
    /// The reason phrase.
    pub reason: Range<usize>,
    /// Whether the response is HTTP/1.1 (else 1.0).
    pub http11: bool,
    /// The fields in order: `Content-Length` (`Role::ContentLength`; `Role::Dropped` beside
    /// `Transfer-Encoding`), hop-by-hop fields (`Role::HopByHop`) and the rest
    /// (`Role::Plain`).
    pub fields: Vec<Field>,
    /// How the body is framed.
    pub body: ResponseBody,
    /// Whether the connection may carry another request after this response: HTTP/1.1, no
    /// `Connection: close`, framing that ends (not until close), unambiguous (not both
    /// `Transfer-Encoding` and `Content-Length`).
    pub reusable: bool,
}

impl ResponseHead {
    /// Whether the client connection must close to end the body sent on: an HTTP/1.0 answer
    /// without a length cannot be chunked.
    pub fn ends_with_close(&self) -> bool {
        !self.http11 && self.body == ResponseBody::UntilClose
    }
}

/// Parses the response at the start of `buf` to a request whose method was `HEAD` when
/// `head_request`; heads longer than `max_head` are invalid (hyper's buffer limit).
pub fn parse_response(buf: &[u8], head_request: bool, max_head: usize) -> ParsedResponse {
    let mut at = 0;
    loop {
        let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut res = httparse::Response::new(&mut storage);
        let len = match res.parse(&buf[at..]) {
            Ok(httparse::Status::Complete(len)) if at + len <= max_head => len,
            Ok(httparse::Status::Partial) if buf.len() < max_head => {
                return ParsedResponse::Partial
            }
            Ok(_) => return ParsedResponse::Invalid("response head too large"),
            Err(_) => return ParsedResponse::Invalid("malformed response head"),
        };
        match res.code.unwrap_or(0) {
            // Three digits, but `http::StatusCode` (and so hyper) starts at 100.
            0..=99 => return ParsedResponse::Invalid("invalid status code"),
            // The fast path never asks to switch protocols (it leaves upgrades to hyper).
            101 => return ParsedResponse::Invalid(UNASKED_SWITCH),
            100..=199 => {
                at += len;
                continue;
            }
            _ => {}
        }
        return match head(buf, &res, at + len, head_request) {
            Ok(head) => ParsedResponse::Head(head),
            Err(why) => ParsedResponse::Invalid(why),
        };
    }
}

fn head(
    buf: &[u8],
    res: &httparse::Response<'_, '_>,
    len: usize,
    head_request: bool,
) -> Result<ResponseHead, &'static str> {
    let status = res.code.unwrap_or(0);
    let http11 = res.version == Some(1);
    let mut fields: Vec<Field> = res
        .headers
        .iter()
        .map(|h| Field {
            name: offset(buf, h.name.as_bytes()),
            value: offset(buf, h.value),
            role: role(h.name),
        })
        .collect();
    let framing = Framing::of(buf, &fields);
    let body = body(status, head_request, http11, &framing)?;
    let close = framing.close || !framing.ascii_connection;
    mark_listed(buf, &mut fields, &framing);
    Ok(ResponseHead {
        len,
        status,
        reason: offset(buf, res.reason.unwrap_or_default().as_bytes()),
        http11,
        fields,
        body,
        reusable: http11
            && !close
            && !(framing.codings > 0 && framing.lengths > 0)
            && body != ResponseBody::UntilClose,
    })
}

/// The body's framing by hyper's client's rules.
fn body(
    status: u16,
    head_request: bool,
    http11: bool,
    framing: &Framing,
) -> Result<ResponseBody, &'static str> {
    if matches!(status, 204 | 304) || head_request {
        return Ok(ResponseBody::None);
    }
    if framing.codings > 0 {
        return match (http11, framing.chunked_last) {
            (false, _) => Err("transfer-encoding in an HTTP/1.0 response"),
            (true, true) => Ok(ResponseBody::Chunked),
            (true, false) => Ok(ResponseBody::UntilClose),
        };
    }
    match (framing.lengths, framing.length) {
        (0, _) => Ok(ResponseBody::UntilClose),
        (_, Some(0)) => Ok(ResponseBody::None),
        (_, Some(n)) => Ok(ResponseBody::Length(n)),
        (_, None) => Err("invalid content-length"),
    }
}

/// What a response's fields say about its framing and its connection.
#[derive(Debug, Default)]
struct Framing {
    /// `Transfer-Encoding` fields.
    codings: usize,
    /// Whether the last coding of the last `Transfer-Encoding` field is `chunked`.
    chunked_last: bool,
    /// `Content-Length` fields.
    lengths: usize,
    /// Their one value, `None` if they disagree or one is not a number.
    length: Option<u64>,
    /// `Connection: close`.
    close: bool,
    /// Whether every `Connection` value is visible ASCII (the header rules read no others).
    ascii_connection: bool,
    /// The options `Connection` lists.
    listed: Vec<Range<usize>>,
}

impl Framing {
    fn of(buf: &[u8], fields: &[Field]) -> Self {
        let mut f = Self {
            ascii_connection: true,
            ..Self::default()
        };
        let mut lengths = Vec::new();
        for field in fields {
            let (name, value) = (&buf[field.name.clone()], &buf[field.value.clone()]);
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                f.codings += 1;
                // hyper reads only visible-ASCII codings.
                f.chunked_last = visible(value)
                    && value
                        .rsplit(|b| *b == b',')
                        .next()
                        .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if field.role == Role::ContentLength {
                f.lengths += 1;
                lengths.extend(value.split(|b| *b == b',').map(digits));
            } else if name.eq_ignore_ascii_case(b"connection") {
                f.connection(value, field.value.start);
            }
        }
        f.length = match lengths.split_first() {
            Some((first, rest)) if rest.iter().all(|n| n == first) => *first,
            _ => None,
        };
        f
    }

    fn connection(&mut self, value: &[u8], at: usize) {
        if !visible(value) {
            self.ascii_connection = false;
            return;
        }
        let base = value.as_ptr() as usize;
        for option in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
            if option.eq_ignore_ascii_case(b"close") {
                self.close = true;
            }
            let start = at + (option.as_ptr() as usize - base);
            self.listed.push(start..start + option.len());
        }
    }
}

/// Whether a value is visible ASCII, spaces and tabs (what `HeaderValue::to_str` takes).
fn visible(value: &[u8]) -> bool {
    value
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | 0x21..=0x7e))
}

/// hyper's largest body length: it keeps the two values above for "chunked" and "until
/// close", and refuses a `Content-Length` that names them.
const MAX_LENGTH: u64 = u64::MAX - 2;

/// One `Content-Length` value: digits only, trimmed, at most [`MAX_LENGTH`] (hyper's rules),
/// `None` otherwise.
fn digits(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value
        .iter()
        .try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .filter(|n| *n <= MAX_LENGTH)
}

/// A response field's role (`fields`): hop-by-hop (RFC 9110 §7.6.1), `Content-Length`, or
/// plain; a response's forwarding fields are the upstream's own and pass as they are.
fn role(name: &str) -> Role {
    match fields::kind(name.as_bytes()) {
        Kind::ContentLength => Role::ContentLength,
        Kind::HopByHop | Kind::Upgrade => Role::HopByHop,
        _ => Role::Plain,
    }
}

/// Marks the fields `Connection` lists as hop-by-hop (`Host` and `Content-Length` excepted,
/// as for requests), and `Content-Length` beside `Transfer-Encoding` as dropped: the latter
/// frames the body.
fn mark_listed(buf: &[u8], fields: &mut [Field], framing: &Framing) {
    for field in fields.iter_mut() {
        let name = &buf[field.name.clone()];
        let listed = || {
            fields::kind(name).connection_may_list()
                && framing
                    .listed
                    .iter()
                    .any(|o| buf[o.clone()].eq_ignore_ascii_case(name))
        };
        match field.role {
            Role::ContentLength if framing.codings > 0 => field.role = Role::Dropped,
            Role::Plain if listed() => field.role = Role::HopByHop,
            _ => {}
        }
    }
}
