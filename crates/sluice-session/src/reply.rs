//! What the acceptor answers, and the statuses of its refusals.

use crate::protocol::{
    Parsed, CONTROL_TOKEN, DEFAULT_MAX_HEAD, HEADER_PROTOCOL, PROTOCOL_H2, PROTOCOL_HTTP1,
    UPGRADE_TOKEN,
};

/// A refusal: the status and the short reason sent as the body before the connection closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {reason}")]
pub struct Rejection {
    /// 400, 401, 403, 404, 410, 429 or 503.
    pub status: u16,
    /// A short plain-text reason.
    pub reason: String,
}

impl Rejection {
    /// 400: the handshake is malformed.
    pub fn bad_request(reason: &str) -> Self {
        Self {
            status: 400,
            reason: reason.to_owned(),
        }
    }

    /// 401: the token is missing or wrong.
    pub fn unauthorized() -> Self {
        Self {
            status: 401,
            reason: "missing or invalid bearer token".to_owned(),
        }
    }

    /// 403: the peer may not speak for the instance it names (its sessions registered from
    /// another address).
    pub fn forbidden(reason: &str) -> Self {
        Self {
            status: 403,
            reason: reason.to_owned(),
        }
    }

    /// 404: no reverse cluster has this name.
    pub fn unknown_service(service: &str) -> Self {
        Self {
            status: 404,
            reason: format!("unknown service {service:?}"),
        }
    }

    /// 429: a session or handshake-rate limit was reached.
    pub fn limited(what: &str) -> Self {
        Self {
            status: 429,
            reason: format!("limit reached: {what}"),
        }
    }

    /// 410: an operator drained the instance, which stays out until it is resumed; an SDK
    /// stops dialing for it instead of retrying.
    pub fn drained(service: &str, instance: &str) -> Self {
        Self {
            status: 410,
            reason: format!(
                "instance {instance:?} of service {service:?} is drained; resume it with sluice ctl resume"
            ),
        }
    }

    /// 400: a standalone acceptor lends its sessions to other processes, and an HTTP/2
    /// session's connection state cannot move with its socket.
    pub fn lends_http1_only() -> Self {
        Self::bad_request("a standalone acceptor lends HTTP/1.1 sessions only")
    }

    /// 503: the instance is draining or the proxy is shutting down.
    pub fn unavailable(reason: &str) -> Self {
        Self {
            status: 503,
            reason: reason.to_owned(),
        }
    }

    /// The response bytes (the connection is closed after them).
    pub fn encode(&self) -> Vec<u8> {
        let body = format!("{}\n", self.reason);
        format!(
            "HTTP/1.1 {} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.status,
            canonical_reason(self.status),
            body.len()
        )
        .into_bytes()
    }
}

fn canonical_reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        410 => "Gone",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// An acceptor's answer, as the service sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `101` with `Upgrade: sluice-session/1`: the connection is now an HTTP/1.1 session.
    Switched,
    /// The same with `Sluice-Protocol: h2`: the connection is now an HTTP/2 session.
    SwitchedH2,
    /// `101` with `Upgrade: sluice-control/1`: the connection is now a control link.
    Control,
    /// `200`: the drain was accepted.
    Drained,
    /// Anything else: refused (the body's reason is not read here).
    Refused(u16),
}

impl Reply {
    /// The `101` answer to a registration.
    pub fn switching_protocols() -> Vec<u8> {
        format!("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {UPGRADE_TOKEN}\r\n\r\n").into_bytes()
    }

    /// The `101` answer to an HTTP/2 session's registration.
    pub fn switching_protocols_h2() -> Vec<u8> {
        format!("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {UPGRADE_TOKEN}\r\nSluice-Protocol: {PROTOCOL_H2}\r\n\r\n").into_bytes()
    }

    /// The `101` answer to a control link's request.
    pub fn control_switching() -> Vec<u8> {
        format!("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {CONTROL_TOKEN}\r\n\r\n").into_bytes()
    }

    /// The `200` answer to a drain request.
    pub fn drained() -> Vec<u8> {
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\nConnection: close\r\n\r\ndraining\n".to_vec()
    }
}

/// Parses the head of an acceptor's answer, at most [`DEFAULT_MAX_HEAD`]
/// bytes. A `101` must name the session protocol in `Upgrade`; anything that is not HTTP/1.1
/// is an error.
pub fn parse_reply(buf: &[u8]) -> Result<Parsed<Reply>, Rejection> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut res = httparse::Response::new(&mut headers);
    let len = match res.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= DEFAULT_MAX_HEAD => len,
        Ok(httparse::Status::Partial) if buf.len() <= DEFAULT_MAX_HEAD => {
            return Ok(Parsed::Partial)
        }
        Ok(_) => return Err(Rejection::bad_request("acceptor reply head too large")),
        Err(_) => return Err(Rejection::bad_request("malformed acceptor reply")),
    };
    let reply = match res.code {
        Some(101) => {
            let upgrade = res
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("upgrade"));
            match upgrade.map(|h| h.value) {
                Some(v) if v.eq_ignore_ascii_case(UPGRADE_TOKEN.as_bytes()) => {
                    session_protocol(res.headers)?
                }
                Some(v) if v.eq_ignore_ascii_case(CONTROL_TOKEN.as_bytes()) => Reply::Control,
                _ => {
                    return Err(Rejection::bad_request(
                        "101 without Upgrade: sluice-session/1 or sluice-control/1",
                    ))
                }
            }
        }
        Some(200) => Reply::Drained,
        Some(code) => Reply::Refused(code),
        None => return Err(Rejection::bad_request("malformed acceptor reply")),
    };
    Ok(Parsed::Complete(reply, len))
}

/// What a session's `101` says it speaks: `Sluice-Protocol`, absent for HTTP/1.1.
fn session_protocol(headers: &[httparse::Header<'_>]) -> Result<Reply, Rejection> {
    let named = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(HEADER_PROTOCOL));
    match named.map(|h| h.value.trim_ascii()) {
        None | Some(b"") => Ok(Reply::Switched),
        Some(v) if v.eq_ignore_ascii_case(PROTOCOL_HTTP1.as_bytes()) => Ok(Reply::Switched),
        Some(v) if v.eq_ignore_ascii_case(PROTOCOL_H2.as_bytes()) => Ok(Reply::SwitchedH2),
        Some(_) => Err(Rejection::bad_request(
            "101 naming an unknown Sluice-Protocol",
        )),
    }
}
