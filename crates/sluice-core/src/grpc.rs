//! gRPC as the proxy sees it, without I/O: which requests are gRPC calls, their deadline
//! (`grpc-timeout`), and how Sluice's own failures are told to a gRPC client — HTTP 200 with
//! `grpc-status` and `grpc-message` and no body (a trailers-only answer), as gRPC servers and
//! Envoy answer, since a gRPC client reads the status from there and not from the HTTP one.
//! The protocol: <https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md>.

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};

use crate::body::ProxyBody;
use crate::error::ProxyError;

/// `grpc-status`.
pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-timeout`.
pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// A gRPC status code (the subset Sluice's own answers use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
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
pub fn is_grpc(headers: &HeaderMap) -> bool {
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
pub fn code(e: &ProxyError) -> Code {
    match e {
        ProxyError::NoRoute | ProxyError::NotImplemented(_) => Code::Unimplemented,
        ProxyError::ResponseTimeout | ProxyError::ConnectTimeout => Code::DeadlineExceeded,
        ProxyError::DeadlineExceeded => Code::DeadlineExceeded,
        // The admission queue is full, or the wait for a session ran out: capacity, as
        // gRPC's own servers say when they shed load.
        ProxyError::Unavailable { .. } | ProxyError::RateLimited { .. } => Code::ResourceExhausted,
        ProxyError::BodyTooLarge(_) => Code::ResourceExhausted,
        ProxyError::NoEndpoint { .. }
        | ProxyError::Unresolved { .. }
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
pub fn response(e: &ProxyError, id: Option<(&HeaderName, &HeaderValue)>) -> Response<ProxyBody> {
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
        assert_eq!(code(&ProxyError::DeadlineExceeded), Code::DeadlineExceeded);
        let gone = ProxyError::NoEndpoint {
            cluster: "c".into(),
        };
        assert_eq!(code(&gone), Code::Unavailable);
    }
}
