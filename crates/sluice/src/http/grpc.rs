//! gRPC as the proxy sees it, without I/O: which requests are gRPC calls, their deadline
//! (`grpc-timeout`), and how Sluice's own failures are told to a gRPC client — HTTP 200 with
//! `grpc-status` and `grpc-message` and no body (a trailers-only answer), as gRPC servers and
//! Envoy answer, since a gRPC client reads the status from there and not from the HTTP one.
//! The protocol: <https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md>.

use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};

use crate::body::ProxyBody;
use crate::error::ProxyError;

/// `grpc-status`.
pub(crate) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub(crate) static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-timeout`.
pub(crate) static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// A gRPC status code (the subset Sluice's own answers use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Code {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// Whether a request is a gRPC call: its `Content-Type` is `application/grpc` or one of its
/// `application/grpc+proto`-like variants (gRPC-Web's `application/grpc-web` is not).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes();
    let Some(rest) = value
        .get(..16)
        .filter(|p| p.eq_ignore_ascii_case(b"application/grpc"))
    else {
        return false;
    };
    let rest = &value[rest.len()..];
    rest.is_empty() || rest[0] == b'+' || rest[0] == b';'
}

/// The code a gRPC client is told for Sluice's own failure.
pub(crate) fn code(e: &ProxyError) -> Code {
    match e {
        ProxyError::NoRoute | ProxyError::NotImplemented(_) => Code::Unimplemented,
        ProxyError::ResponseTimeout | ProxyError::ConnectTimeout => Code::DeadlineExceeded,
        // The admission queue is full, or the wait for a session ran out: capacity, as
        // gRPC's own servers say when they shed load.
        ProxyError::Unavailable { .. } | ProxyError::RateLimited { .. } => Code::ResourceExhausted,
        ProxyError::BodyTooLarge(_) => Code::ResourceExhausted,
        ProxyError::NoEndpoint { .. }
        | ProxyError::NoSessions { .. }
        | ProxyError::Connect(_)
        | ProxyError::UpstreamTls { .. }
        | ProxyError::UpstreamProtocol(_)
        | ProxyError::UpstreamInvalid(_) => Code::Unavailable,
        ProxyError::Unauthorized { .. } => Code::Unauthenticated,
        ProxyError::CorsRefused(_) => Code::PermissionDenied,
        ProxyError::BadRequest(_) | ProxyError::ClientBody(_) => Code::InvalidArgument,
        ProxyError::ClientBodyTimeout(_) => Code::DeadlineExceeded,
        ProxyError::Rewrite(_) | ProxyError::HandedBack => Code::Internal,
    }
}

/// Sluice's own failure as a gRPC client is told it: HTTP 200, `content-type:
/// application/grpc`, `grpc-status`, `grpc-message` (the reason, percent-encoded) and the
/// request's `id` when it has one; no body, so HTTP/2 sends it all as one HEADERS frame that
/// ends the stream (trailers-only).
pub(crate) fn response(
    e: &ProxyError,
    id: Option<(&HeaderName, &HeaderValue)>,
) -> Response<ProxyBody> {
    let mut res = Response::new(ProxyBody::empty());
    *res.status_mut() = StatusCode::OK;
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        GRPC_STATUS.clone(),
        HeaderValue::from(u16::from(code(e) as u8)),
    );
    if let Ok(message) = HeaderValue::try_from(percent_encode(&e.reason())) {
        headers.insert(GRPC_MESSAGE.clone(), message);
    }
    if let Some(secs) = e.retry_after() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Some((name, value)) = id {
        headers.insert(name.clone(), value.clone());
    }
    res
}

/// `grpc-message`'s encoding: printable ASCII but `%` as it is, every other byte as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.trim_end().bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The deadline a call's `grpc-timeout` sets: 1 to 8 digits and a unit (`H`, `M`, `S`, `m`
/// for milliseconds, `u`, `n`); `None` for anything else (the call then has the route's).
pub(crate) fn timeout(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    let (&unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The path of the gRPC health protocol's check.
pub(crate) const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// A `grpc.health.v1.HealthCheckRequest` for `service`, as one gRPC message (the protobuf
/// encoding of its one field, `string service = 1`, behind the 5-byte message prefix).
pub(crate) fn health_request(service: &str) -> bytes::Bytes {
    let mut field = Vec::with_capacity(service.len() + 6);
    if !service.is_empty() {
        field.push(0x0a); // field 1, length-delimited
        varint(service.len() as u64, &mut field);
        field.extend_from_slice(service.as_bytes());
    }
    let mut message = Vec::with_capacity(field.len() + 5);
    message.push(0); // not compressed
    message.extend_from_slice(&(field.len() as u32).to_be_bytes());
    message.extend_from_slice(&field);
    message.into()
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Whether a `grpc.health.v1.HealthCheckResponse` (one gRPC message: the 5-byte prefix, then
/// protobuf) says SERVING (`ServingStatus status = 1`, SERVING = 1); else what it says.
pub(crate) fn serving(message: &[u8]) -> Result<(), String> {
    let Some((prefix, body)) = message.split_first_chunk::<5>() else {
        return Err("no health response message".to_owned());
    };
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if prefix[0] != 0 || body.len() != len {
        return Err("a malformed (or compressed) health response message".to_owned());
    }
    let mut rest = body;
    let mut status = 0; // UNKNOWN, protobuf's default
    while !rest.is_empty() {
        let key = read_varint(&mut rest).ok_or("a malformed health response")?;
        match (key >> 3, key & 7) {
            (1, 0) => status = read_varint(&mut rest).ok_or("a malformed health status")?,
            (_, 0) => {
                read_varint(&mut rest).ok_or("a malformed health response")?;
            }
            (_, 2) => {
                let n = read_varint(&mut rest).ok_or("a malformed health response")?;
                let n = usize::try_from(n).map_err(|_| "a malformed health response")?;
                rest = rest.get(n..).ok_or("a malformed health response")?;
            }
            (_, 1) => rest = rest.get(8..).ok_or("a malformed health response")?,
            (_, 5) => rest = rest.get(4..).ok_or("a malformed health response")?,
            _ => return Err("a malformed health response".to_owned()),
        }
    }
    match status {
        1 => Ok(()),
        0 => Err("health status UNKNOWN".to_owned()),
        2 => Err("health status NOT_SERVING".to_owned()),
        3 => Err("health status SERVICE_UNKNOWN".to_owned()),
        n => Err(format!("health status {n}")),
    }
}

fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(value: &'static str) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
        is_grpc(&headers)
    }

    #[test]
    fn grpc_calls_are_known_by_their_content_type() {
        assert!(typed("application/grpc"));
        assert!(typed("application/grpc+proto"));
        assert!(typed("Application/GRPC+json"));
        assert!(typed("application/grpc; charset=utf-8"));
        assert!(!typed("application/grpc-web"));
        assert!(!typed("application/grpcx"));
        assert!(!typed("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn timeouts_take_every_unit_and_refuse_the_rest() {
        let t = |s: &'static str| timeout(&HeaderValue::from_static(s));
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("2M"), Some(Duration::from_secs(120)));
        assert_eq!(t("3S"), Some(Duration::from_secs(3)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(t("10n"), Some(Duration::from_nanos(10)));
        for bad in ["", "S", "123456789S", "1s", "-1S", "1.5S", "10 S", "1Z"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("no route\n"), "no route");
        assert_eq!(percent_encode("100% é"), "100%25 %C3%A9");
    }

    #[test]
    fn own_failures_answer_200_with_the_status_in_the_fields() {
        let res = response(&ProxyError::NoRoute, None);
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[&GRPC_STATUS], "12");
        assert_eq!(
            res.headers()[&GRPC_MESSAGE],
            "no route matches this request"
        );
        let busy = ProxyError::Unavailable {
            reason: "queue full",
            retry_after: 1,
        };
        assert_eq!(code(&busy), Code::ResourceExhausted);
        assert_eq!(code(&ProxyError::ResponseTimeout), Code::DeadlineExceeded);
        let gone = ProxyError::NoEndpoint {
            cluster: "c".into(),
        };
        assert_eq!(code(&gone), Code::Unavailable);
    }

    #[test]
    fn health_requests_encode_the_service() {
        assert_eq!(&health_request("")[..], &[0, 0, 0, 0, 0]);
        let req = health_request("echo.Echo");
        assert_eq!(&req[..7], &[0, 0, 0, 0, 11, 0x0a, 9]);
        assert_eq!(&req[7..], b"echo.Echo");
    }

    #[test]
    fn health_responses_say_serving_or_why_not() {
        assert_eq!(serving(&[0, 0, 0, 0, 2, 0x08, 1]), Ok(()));
        let why = |m: &[u8]| serving(m).err().unwrap_or_default();
        assert!(why(&[0, 0, 0, 0, 2, 0x08, 2]).contains("NOT_SERVING"));
        assert!(why(&[0, 0, 0, 0, 0]).contains("UNKNOWN"));
        // Unknown fields are skipped.
        assert_eq!(serving(&[0, 0, 0, 0, 5, 0x12, 1, b'x', 0x08, 1]), Ok(()));
        for bad in [
            &[][..],
            &[0, 0, 0, 0, 3, 0x08, 1],
            &[1, 0, 0, 0, 2, 0x08, 1],
            &[0, 0, 0, 0, 1, 0x08],
        ] {
            assert!(serving(bad).is_err(), "{bad:?}");
        }
    }
}
