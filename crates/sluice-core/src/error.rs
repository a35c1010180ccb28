//! Typed proxy errors: where a failure came from and what the client is told.

use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::body::ProxyBody;

/// Who caused a failure; decides the status code and whether a retry makes sense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The downstream client sent something we cannot forward.
    Client,
    /// The upstream endpoint failed or misbehaved.
    Upstream,
    /// Sluice itself (configuration, capacity).
    Internal,
}

/// The response to a failed request: one builder ([`ProxyError::answer`]), two renderers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its fields, besides framing, `Date` and `Connection`.
    pub fields: Vec<(HeaderName, HeaderValue)>,
    /// Its plain-text body (a line).
    pub body: String,
}

/// A failure while proxying one request. Each maps to one status and a short reason.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No route matched the request.
    #[error("no route matches this request")]
    NoRoute,
    /// Every endpoint of the cluster is ejected, unhealthy or removed.
    #[error("no healthy endpoint in cluster {cluster}")]
    NoEndpoint {
        /// The cluster's name (logged, never sent to the client).
        cluster: String,
    },
    /// The cluster has no endpoint because a name it follows in DNS (`resolve`) has not
    /// resolved yet (the lookup failed since the proxy started).
    #[error("cluster {cluster}: endpoint name {name} has not resolved ({why})")]
    Unresolved {
        /// The cluster's name (logged, never sent to the client).
        cluster: String,
        /// The endpoint name, `host:port` (logged, never sent to the client).
        name: String,
        /// Why its last lookup failed.
        why: String,
    },
    /// No service has a session registered for the slice (none started, all gone or drained);
    /// answered at once, or after the cluster's `no_sessions_wait`.
    #[error("no sessions registered for cluster {cluster} (slice {slice})")]
    NoSessions {
        /// The cluster's name (logged, never sent to the client).
        cluster: String,
        /// The slice's name (logged, never sent to the client).
        slice: String,
    },
    /// The cluster has no capacity for the request now (admission queue full or wait expired);
    /// the client may retry after `retry_after` seconds.
    #[error("{reason}")]
    Unavailable {
        /// A short reason for the client.
        reason: &'static str,
        /// Seconds the client should wait before retrying (`Retry-After`).
        retry_after: u32,
    },
    /// The TCP connect to an endpoint failed.
    #[error("upstream connect failed: {0}")]
    Connect(#[source] std::io::Error),
    /// The TCP connect to an endpoint did not finish in time.
    #[error("upstream connect timed out")]
    ConnectTimeout,
    /// The TLS handshake with an endpoint failed; `check` says which check, for the client.
    #[error("upstream TLS handshake failed: {check} ({detail})")]
    UpstreamTls {
        /// Which check failed, in a few words ("certificate expired").
        check: &'static str,
        /// What rustls said (logged, never sent to the client).
        detail: String,
    },
    /// The upstream did not send a response head in time.
    #[error("upstream response timed out")]
    ResponseTimeout,
    /// The request's own deadline (a gRPC call's `grpc-timeout`, sooner than the cluster's
    /// response timeout) passed before the response head came: the client's limit, not an
    /// upstream failure.
    #[error("the request's deadline passed before its response")]
    DeadlineExceeded,
    /// The upstream broke the protocol or closed the connection early.
    #[error("upstream protocol error: {0}")]
    UpstreamProtocol(#[source] hyper::Error),
    /// The upstream's response could not be read (the fast path's parser, which refuses what
    /// hyper's client refuses): a malformed head or framing, or a connection closed early.
    #[error("upstream protocol error: {0}")]
    UpstreamInvalid(&'static str),
    /// The client's request body failed (bad framing, reset) while being forwarded.
    #[error("invalid request body: {0}")]
    ClientBody(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The client stopped sending its request body for longer than the listener's
    /// `client_body_timeout`.
    #[error("{0}")]
    ClientBodyTimeout(crate::body::BodyTimedOut),
    /// The request body is larger than the route's or listener's `max_request_body`.
    #[error("{0}")]
    BodyTooLarge(crate::body::BodyTooLarge),
    /// The request is malformed in a way hyper let through but a proxy must refuse.
    #[error("{0}")]
    BadRequest(&'static str),
    /// The route's `rate_limit` has no token left for the request's client (or key), or its
    /// `global_rate_limit`'s service answered over the limit; a retry may pass in
    /// `retry_after` seconds.
    #[error("too many requests")]
    RateLimited {
        /// Seconds until the client may try again (`Retry-After`).
        retry_after: u32,
        /// More fields of the answer (a rate-limit service's, e.g. `X-RateLimit-Limit`);
        /// none for the route's own limit.
        fields: Box<[(HeaderName, HeaderValue)]>,
    },
    /// The route's `basic_auth` did not find a user's credentials in the request.
    #[error("authentication required")]
    Unauthorized {
        /// The realm the client is told (`WWW-Authenticate`).
        realm: String,
    },
    /// A CORS preflight the route's `cors` does not allow (origin, method or field).
    #[error("{0}")]
    CorsRefused(&'static str),
    /// The request asks for something the proxy does not do (e.g. CONNECT tunnels).
    #[error("{0}")]
    NotImplemented(&'static str),
    /// The route's `rewrite` made no valid path of this request's (or its redirect no valid
    /// `Location`): the rule is at fault, not the request, which was valid.
    #[error("invalid rewrite: {0}")]
    Rewrite(&'static str),
    /// The HTTP/1 fast path leased a session it does not drive (an HTTP/2 session that
    /// registered as the request was routed) and gave it back: hyper's path serves the
    /// request instead. Never answered to a client.
    #[error("the fast path handed the request to hyper's path")]
    HandedBack,
}

impl From<sluice_wire::BadRequest> for ProxyError {
    fn from(e: sluice_wire::BadRequest) -> Self {
        Self::BadRequest(e.0)
    }
}

impl ProxyError {
    /// A failure of the client's request body, found on its own or in what an upstream
    /// connection that was sending it reported: its timeout, or anything else it broke.
    pub fn client_body(error: Box<dyn std::error::Error + Send + Sync>) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
        while let Some(e) = cause {
            if let Some(timed_out) = e.downcast_ref::<crate::body::BodyTimedOut>() {
                return Self::ClientBodyTimeout(*timed_out);
            }
            if let Some(too_large) = e.downcast_ref::<crate::body::BodyTooLarge>() {
                return Self::BodyTooLarge(*too_large);
            }
            cause = e.source();
        }
        Self::ClientBody(error)
    }

    /// The status code the client receives.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NoRoute => StatusCode::NOT_FOUND,
            Self::NoEndpoint { .. }
            | Self::Unresolved { .. }
            | Self::NoSessions { .. }
            | Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Connect(_)
            | Self::UpstreamTls { .. }
            | Self::UpstreamProtocol(_)
            | Self::UpstreamInvalid(_) => StatusCode::BAD_GATEWAY,
            Self::ConnectTimeout | Self::ResponseTimeout | Self::DeadlineExceeded => {
                StatusCode::GATEWAY_TIMEOUT
            }
            Self::ClientBody(_) | Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::ClientBodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Self::CorsRefused(_) => StatusCode::FORBIDDEN,
            Self::Rewrite(_) | Self::HandedBack => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Who caused this failure.
    pub fn origin(&self) -> Origin {
        match self {
            Self::NoRoute
            | Self::ClientBody(_)
            | Self::ClientBodyTimeout(_)
            | Self::BodyTooLarge(_)
            | Self::BadRequest(_)
            | Self::NotImplemented(_)
            | Self::RateLimited { .. }
            | Self::Unauthorized { .. }
            | Self::CorsRefused(_)
            | Self::DeadlineExceeded => Origin::Client,
            Self::NoEndpoint { .. }
            | Self::Unresolved { .. }
            | Self::NoSessions { .. }
            | Self::Unavailable { .. }
            | Self::Rewrite(_)
            | Self::HandedBack => Origin::Internal,
            Self::Connect(_)
            | Self::UpstreamTls { .. }
            | Self::ConnectTimeout
            | Self::ResponseTimeout
            | Self::UpstreamProtocol(_)
            | Self::UpstreamInvalid(_) => Origin::Upstream,
        }
    }

    /// Seconds a client should wait before retrying, when the failure is temporary.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            Self::Unavailable { retry_after, .. } | Self::RateLimited { retry_after, .. } => {
                Some(*retry_after)
            }
            // Services that are starting register within seconds.
            Self::NoSessions { .. } => Some(1),
            _ => None,
        }
    }

    /// Whether the client connection should be closed after the error response: a client at
    /// fault may be out of step with the framing, but not one that asked for a missing route,
    /// too often, without credentials, or for a cross-origin call it may not make.
    pub fn closes_connection(&self) -> bool {
        let in_step = matches!(
            self,
            Self::NoRoute
                | Self::RateLimited { .. }
                | Self::Unauthorized { .. }
                | Self::CorsRefused(_)
                | Self::DeadlineExceeded
        );
        self.origin() == Origin::Client && !in_step
    }

    /// What the client is answered, on either data path: the hyper path renders it as a
    /// `Response` (`proxy::error_response`), the fast path as bytes (`proxy::fast::answer`).
    /// `Connection: close` is the renderer's, when [`closes_connection`](Self::closes_connection)
    /// and the connection is HTTP/1.
    /// The request's `id` (`[request_id]`), when it has one, is one of its fields.
    pub fn answer(&self, id: Option<(&HeaderName, &HeaderValue)>) -> Answer {
        let mut answer = self.answer_alone();
        if let Some((name, value)) = id {
            answer.fields.push((name.clone(), value.clone()));
        }
        answer
    }

    fn answer_alone(&self) -> Answer {
        // An upstream's unasked `101` is answered with its own text, and no content type.
        if let Self::UpstreamInvalid(why) = self {
            if *why == sluice_wire::h1::UNASKED_SWITCH {
                return Answer {
                    status: self.status(),
                    fields: Vec::new(),
                    body: format!("{why}\n"),
                };
            }
        }
        let mut fields = vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )];
        if let Some(secs) = self.retry_after() {
            fields.push((header::RETRY_AFTER, HeaderValue::from(secs)));
        }
        if let Self::RateLimited { fields: more, .. } = self {
            fields.extend(more.iter().cloned());
        }
        if let Self::Unauthorized { realm } = self {
            // The configuration allows no quote, backslash or control character in a realm.
            let challenge = format!("Basic realm=\"{realm}\", charset=\"UTF-8\"");
            if let Ok(value) = HeaderValue::try_from(challenge) {
                fields.push((header::WWW_AUTHENTICATE, value));
            }
        }
        Answer {
            status: self.status(),
            fields,
            body: format!("{}\n", self.reason()),
        }
    }

    /// `answer` as the hyper path sends it; on HTTP/1 the connection closes
    /// after it when the client is at fault (its connection may be out of sync).
    pub fn response(&self, http1: bool) -> Response<ProxyBody> {
        self.response_with_id(http1, None)
    }

    /// [`response`](Self::response) with the request's `id` among its fields.
    pub fn response_with_id(
        &self,
        http1: bool,
        id: Option<(&HeaderName, &HeaderValue)>,
    ) -> Response<ProxyBody> {
        let answer = self.answer(id);
        let mut res = Response::new(ProxyBody::full(answer.body));
        *res.status_mut() = answer.status;
        let headers = res.headers_mut();
        headers.extend(answer.fields);
        if http1 && self.closes_connection() {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        res
    }

    /// The short plain-text reason sent as the response body.
    pub fn reason(&self) -> String {
        match self {
            // Details of upstream and client errors go to the log, not to the client.
            Self::Connect(_) => "upstream connect failed".to_owned(),
            Self::UpstreamTls { check, .. } => format!("upstream TLS handshake failed: {check}"),
            Self::UpstreamProtocol(_) | Self::UpstreamInvalid(_) => {
                "upstream protocol error".to_owned()
            }
            Self::ClientBody(_) => "invalid request body".to_owned(),
            Self::ClientBodyTimeout(_) => "request body timed out".to_owned(),
            Self::BodyTooLarge(_) => "request body too large".to_owned(),
            // The cluster's name is internal; the log has it.
            Self::NoEndpoint { .. } => "no healthy upstream".to_owned(),
            Self::Unresolved { .. } => "upstream name has not resolved".to_owned(),
            Self::NoSessions { .. } => "no sessions registered for this service".to_owned(),
            other => other.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capacity_answer_says_when_to_retry_and_hides_the_cluster() {
        let e = ProxyError::NoSessions {
            cluster: "internal-name".into(),
            slice: "default".into(),
        };
        let answer = e.answer(None);
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.body, "no sessions registered for this service\n");
        let field = |name| answer.fields.iter().find(|(n, _)| *n == name).map(|f| &f.1);
        assert_eq!(
            field(header::RETRY_AFTER).map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        assert!(field(header::CONTENT_TYPE).is_some());
    }

    #[test]
    fn an_unasked_switch_is_a_bare_502_with_its_own_text() {
        let e = ProxyError::UpstreamInvalid(sluice_wire::h1::UNASKED_SWITCH);
        let answer = e.answer(None);
        assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
        assert_eq!(answer.body, "upstream switched protocols unasked\n");
        assert!(answer.fields.is_empty());
    }
}
