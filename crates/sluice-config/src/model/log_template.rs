//! An access log line template (`[access_log] format = "{client} {request} {status}"`), NGINX's
//! `log_format` idea: text with fields in braces, `{{` and `}}` for a brace itself.

/// A parsed template: text and fields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTemplate(pub Vec<LogPiece>);

/// A piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogPiece {
    /// Written as it is.
    Text(String),
    /// Written from the request; `-` when it has no value.
    Field(LogField),
}

/// What a template's `{field}` writes. The names and meanings are in `docs/access-log.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogField {
    /// `{client}`: the client's IP address.
    Client,
    /// `{client_port}`: the client's TCP port.
    ClientPort,
    /// `{time}`: the time the line is written, as the Common Log Format writes it
    /// (`23/Nov/2026:09:00:00 +0000`).
    Time,
    /// `{time_iso8601}`: the same in ISO 8601 (`2026-11-23T09:00:00Z`).
    TimeIso8601,
    /// `{method}`: the request's method.
    Method,
    /// `{target}`: the request target in origin form (`/path?query`).
    Target,
    /// `{protocol}`: `HTTP/1.1`, `HTTP/2.0`, ...
    Protocol,
    /// `{request}`: `METHOD target protocol`, NGINX's `$request`.
    Request,
    /// `{status}`: the response status.
    Status,
    /// `{bytes}`: the response body's bytes sent, NGINX's `$body_bytes_sent`.
    Bytes,
    /// `{request_bytes}`: the request body's length, when its framing said it.
    RequestBytes,
    /// `{request_time}`: seconds from the request to the response body's end, with
    /// milliseconds, NGINX's `$request_time` (`0.003`).
    RequestTime,
    /// `{duration_ms}`: the same in milliseconds, with microseconds.
    DurationMs,
    /// `{route}`: the route that matched.
    Route,
    /// `{upstream_addr}`: the static endpoint that answered.
    UpstreamAddr,
    /// `{instance}`: the reverse cluster instance whose session answered.
    Instance,
    /// `{queue_ms}`: how long the request waited for a session, in milliseconds.
    QueueMs,
    /// `{user_agent}`: the `User-Agent`.
    UserAgent,
    /// `{referer}`: the `Referer`.
    Referer,
    /// `{complete}`: `true` when the whole body went out, `false` when it was cut short.
    Complete,
    /// `{request_id}`: the request's ID (`[request_id]`).
    RequestId,
    /// `{cache_status}`: the `Cache-Status` a route's cache gave the answer
    /// (`Sluice; hit`, `Sluice; fwd=miss; stored`, ...).
    CacheStatus,
}

/// Every field by its name in a template.
const FIELDS: [(&str, LogField); 22] = [
    ("client", LogField::Client),
    ("client_port", LogField::ClientPort),
    ("time", LogField::Time),
    ("time_iso8601", LogField::TimeIso8601),
    ("method", LogField::Method),
    ("target", LogField::Target),
    ("protocol", LogField::Protocol),
    ("request", LogField::Request),
    ("status", LogField::Status),
    ("bytes", LogField::Bytes),
    ("request_bytes", LogField::RequestBytes),
    ("request_time", LogField::RequestTime),
    ("duration_ms", LogField::DurationMs),
    ("route", LogField::Route),
    ("upstream_addr", LogField::UpstreamAddr),
    ("instance", LogField::Instance),
    ("queue_ms", LogField::QueueMs),
    ("user_agent", LogField::UserAgent),
    ("referer", LogField::Referer),
    ("complete", LogField::Complete),
    ("request_id", LogField::RequestId),
    ("cache_status", LogField::CacheStatus),
];

impl LogTemplate {
    /// Parses `text`; the error says what is wrong and lists the fields when one is unknown.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(['{', '}']) {
            literal.push_str(&rest[..at]);
            let brace = &rest[at..at + 1];
            let after = &rest[at + 1..];
            if after.starts_with(brace) {
                literal.push_str(brace);
                rest = &after[1..];
                continue;
            }
            if brace == "}" {
                return Err("a `}` without its `{` (write `}}` for a brace)".into());
            }
            let Some(end) = after.find('}') else {
                return Err("a `{` without its `}` (write `{{` for a brace)".into());
            };
            if !literal.is_empty() {
                pieces.push(LogPiece::Text(std::mem::take(&mut literal)));
            }
            pieces.push(LogPiece::Field(field(&after[..end])?));
            rest = &after[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(LogPiece::Text(literal));
        }
        Ok(Self(pieces))
    }
}

fn field(name: &str) -> Result<LogField, String> {
    FIELDS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .ok_or_else(|| {
            let known: Vec<_> = FIELDS.iter().map(|(n, _)| *n).collect();
            format!("unknown field `{{{name}}}`; known: {}", known.join(", "))
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn text_and_fields_in_order_with_escaped_braces() {
        let t = LogTemplate::parse("{client} [{{x}}] {status}ms").unwrap();
        assert_eq!(
            t.0,
            [
                LogPiece::Field(LogField::Client),
                LogPiece::Text(" [{x}] ".into()),
                LogPiece::Field(LogField::Status),
                LogPiece::Text("ms".into()),
            ]
        );
    }

    #[test]
    fn an_unknown_field_is_named_with_the_known_ones() {
        let e = LogTemplate::parse("{client} {upstream}").unwrap_err();
        assert!(e.contains("unknown field `{upstream}`"), "{e}");
        assert!(e.contains("upstream_addr"), "{e}");
    }

    #[test]
    fn unmatched_braces_are_refused() {
        assert!(LogTemplate::parse("{client")
            .unwrap_err()
            .contains("without its `}`"));
        assert!(LogTemplate::parse("x}")
            .unwrap_err()
            .contains("without its `{`"));
    }
}
