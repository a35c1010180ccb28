//! A route's `cors` (the Fetch standard's CORS protocol), without I/O: whether a request is a
//! preflight and what it is answered, and the fields every answer of the route gets: its
//! [`RouteFeature`] hooks, which `admission` runs for every transport. Its hooks answer and
//! edit answers, which the fast path does not drive: it leaves the route's requests to hyper.
//!
//! A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) never reaches the
//! upstream: an allowed origin, method and fields get 204 with what they may do, anything
//! else 403 with the reason. Every answer of the route — the upstream's, or Sluice's own
//! errors — carries `Access-Control-Allow-Origin` (and the rest) for an allowed origin, over
//! any CORS field the upstream set: the route's policy is the one a browser sees. Answers vary
//! by `Origin` unless any origin is allowed.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use sluice_config::{CorsOrigins, OriginMatch};
use std::sync::Arc;

use crate::error::ProxyError;
use crate::fields::Fields;
use crate::route_feature::{Answer, Asked, Edit, Hooks, Registration, RouteFeature, Verdict};

/// One route's CORS policy, with its fields rendered once.
#[derive(Debug)]
pub struct Cors {
    config: sluice_config::Cors,
    methods: HeaderValue,
    headers: Option<HeaderValue>,
    expose: Option<HeaderValue>,
    max_age: Option<HeaderValue>,
}

/// The CORS fields an upstream may set, which the route's policy replaces.
const CORS_FIELDS: [HeaderName; 6] = [
    header::ACCESS_CONTROL_ALLOW_ORIGIN,
    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
    header::ACCESS_CONTROL_ALLOW_METHODS,
    header::ACCESS_CONTROL_ALLOW_HEADERS,
    header::ACCESS_CONTROL_EXPOSE_HEADERS,
    header::ACCESS_CONTROL_MAX_AGE,
];

fn joined<T: AsRef<str>>(items: &[T]) -> Option<HeaderValue> {
    let text: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    (!text.is_empty())
        .then(|| HeaderValue::from_str(&text.join(", ")).ok())
        .flatten()
}

impl Cors {
    pub fn new(config: &sluice_config::Cors) -> Self {
        let methods: Vec<&str> = config.methods.iter().map(Method::as_str).collect();
        Self {
            config: config.clone(),
            methods: joined(&methods).unwrap_or_else(|| HeaderValue::from_static("GET")),
            headers: joined(&config.headers),
            expose: joined(&config.expose),
            max_age: config.max_age.map(|d| HeaderValue::from(d.as_secs())),
        }
    }

    /// Whether a page of `origin` may read the route's answers.
    fn allows(&self, origin: &[u8]) -> bool {
        let Ok(origin) = std::str::from_utf8(origin) else {
            return false;
        };
        let origin = origin.to_ascii_lowercase();
        let Some((scheme, host)) = parse_origin(&origin) else {
            return false;
        };
        match &self.config.origins {
            CorsOrigins::Any => true,
            CorsOrigins::List(list) => list.iter().any(|m| match m {
                OriginMatch::Exact(o) => *o == origin,
                OriginMatch::Subdomains(s, domain) => {
                    *s == scheme && host.len() > domain.len() && host.ends_with(domain.as_str())
                }
            }),
        }
    }

    /// When the request is a preflight, what it is answered: 204 with these fields, or a
    /// refusal (403) saying why.
    pub fn preflight(
        &self,
        method: &Method,
        fields: &(impl Fields + ?Sized),
    ) -> Option<Result<Vec<(HeaderName, HeaderValue)>, ProxyError>> {
        let asked = fields.first("access-control-request-method")?;
        let origin = fields.first("origin")?;
        if method != Method::OPTIONS {
            return None;
        }
        Some(self.answer_preflight(origin, asked, fields))
    }

    fn answer_preflight(
        &self,
        origin: &[u8],
        asked: &[u8],
        fields: &(impl Fields + ?Sized),
    ) -> Result<Vec<(HeaderName, HeaderValue)>, ProxyError> {
        let refused = |why| Err(ProxyError::CorsRefused(why));
        if !self.allows(origin) {
            return refused("CORS: origin not allowed");
        }
        let method = Method::from_bytes(asked).ok();
        let safelisted = [Method::GET, Method::HEAD, Method::POST];
        let allowed =
            method.is_some_and(|m| safelisted.contains(&m) || self.config.methods.contains(&m));
        if !allowed {
            return refused("CORS: method not allowed");
        }
        let asked = fields.named("access-control-request-headers");
        let names = asked.flat_map(|v| v.split(|b| *b == b','));
        let mut names = names.map(<[u8]>::trim_ascii).filter(|n| !n.is_empty());
        let unlisted = names.any(|n| {
            !self
                .config
                .headers
                .iter()
                .any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(n))
        });
        if unlisted {
            return refused("CORS: request field not allowed");
        }
        let mut out = vec![(header::ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone())];
        out.extend(
            self.headers
                .clone()
                .map(|h| (header::ACCESS_CONTROL_ALLOW_HEADERS, h)),
        );
        out.extend(
            self.max_age
                .clone()
                .map(|a| (header::ACCESS_CONTROL_MAX_AGE, a)),
        );
        let vary = "Access-Control-Request-Method, Access-Control-Request-Headers";
        out.push((header::VARY, HeaderValue::from_static(vary)));
        Ok(out)
    }

    /// Puts the route's CORS fields on an answer to a request from `origin`, over any the
    /// upstream set (a preflight's answer gets them first, then its own).
    pub fn apply(&self, origin: Option<&HeaderValue>, out: &mut HeaderMap) {
        self.dressing(origin).apply(out);
    }

    /// The route's CORS fields for a request from `origin`, decided once and put on its
    /// answer later ([`Dressing::apply`]).
    pub fn dressing(&self, origin: Option<&HeaderValue>) -> Dressing {
        let any = self.config.origins == CorsOrigins::Any && !self.config.credentials;
        let allow = origin
            .filter(|o| self.allows(o.as_bytes()))
            .map(|origin| match any {
                true => HeaderValue::from_static("*"),
                false => origin.clone(),
            });
        Dressing {
            vary: !any,
            credentials: allow.is_some() && self.config.credentials,
            expose: allow.as_ref().and(self.expose.clone()),
            allow,
        }
    }
}

/// A route's CORS fields for one request's origin ([`Cors::dressing`]).
#[derive(Debug, Clone)]
pub struct Dressing {
    /// `Vary: Origin` (unless any origin is allowed).
    vary: bool,
    /// `Access-Control-Allow-Origin`, for an allowed origin.
    allow: Option<HeaderValue>,
    /// `Access-Control-Allow-Credentials: true`.
    credentials: bool,
    /// `Access-Control-Expose-Headers`.
    expose: Option<HeaderValue>,
}

impl Dressing {
    /// Puts the fields on an answer, replacing any CORS field the upstream set.
    pub fn apply(self, out: &mut HeaderMap) {
        for name in &CORS_FIELDS {
            out.remove(name);
        }
        if self.vary {
            out.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        let Some(allow) = self.allow else {
            return;
        };
        out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        if self.credentials {
            let yes = HeaderValue::from_static("true");
            out.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, yes);
        }
        if let Some(expose) = self.expose {
            out.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, expose);
        }
    }
}

/// The registration of a route's `cors` (`sluice`'s `registry::REGISTERED`).
pub const REGISTRATION: Registration = Registration {
    key: "cors",
    cargo_feature: None,
    built: true,
    wanted: |route| route.cors.is_some(),
    build: |route, _| {
        let cors = route.cors.as_ref()?;
        Some(Arc::new(Cors::new(cors)) as Arc<dyn RouteFeature>)
    },
};

/// A CORS route answers allowed preflights itself and puts its fields on every answer but a
/// refused preflight's.
impl RouteFeature for Cors {
    fn name(&self) -> &'static str {
        "cors"
    }

    fn hooks(&self) -> Hooks {
        Hooks::REFUSE.and(Hooks::ANSWER).and(Hooks::EDIT)
    }

    fn edit(&self, asked: &Asked<'_>) -> Option<Edit> {
        let origin = asked.fields.first("origin");
        let origin = origin.and_then(|o| HeaderValue::from_bytes(o).ok());
        let dressing = self.dressing(origin.as_ref());
        Some(Box::new(move |out: &mut HeaderMap| dressing.apply(out)))
    }

    fn admit<'a>(&'a self, asked: &Asked<'a>) -> Verdict<'a> {
        match self.preflight(asked.method, asked.fields) {
            None => Verdict::Pass,
            Some(Ok(fields)) => Verdict::Answer(Answer::bare(StatusCode::NO_CONTENT, fields)),
            Some(Err(refused)) => Verdict::Refuse(refused),
        }
    }
}

/// An origin as browsers serialise it (RFC 6454 §6.1, lowercased): `scheme://host[:port]`,
/// the host a DNS name of letters, digits and hyphens in non-empty dot-separated labels, or
/// an IP literal; its scheme and host. Anything else — a path, a query, a fragment, user
/// info, a backslash, an empty label, `null` — is no origin a pattern may match.
fn parse_origin(origin: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = origin.split_once("://")?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_lowercase())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
    if !scheme_ok {
        return None;
    }
    let (host, port) = match rest.strip_prefix('[') {
        Some(v6) => {
            let (ip, after) = v6.split_once(']')?;
            ip.parse::<std::net::Ipv6Addr>().ok()?;
            (
                &rest[..ip.len() + 2],
                after.strip_prefix(':').map_or(Some(after), Some)?,
            )
        }
        None => match rest.rsplit_once(':') {
            Some((host, port)) => (host, port),
            None => (rest, ""),
        },
    };
    let port_ok = port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    let name_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let host_ok = host.starts_with('[') || host.split('.').all(name_ok);
    let had_port = rest.len() > host.len();
    (port_ok && host_ok && (!had_port || !port.is_empty())).then_some((scheme, host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: CorsOrigins, credentials: bool) -> Cors {
        Cors::new(&sluice_config::Cors {
            origins,
            methods: vec![Method::GET, Method::PUT],
            headers: vec![HeaderName::from_static("content-type")],
            expose: vec![HeaderName::from_static("x-request-id")],
            credentials,
            max_age: Some(std::time::Duration::from_secs(600)),
        })
    }

    fn listed() -> CorsOrigins {
        CorsOrigins::List(vec![
            OriginMatch::Exact("https://app.example.com".to_owned()),
            OriginMatch::Subdomains("https".to_owned(), ".example.org".to_owned()),
        ])
    }

    /// Issue 47's probe: `*.example.org` reflected these, with credentials.
    #[test]
    fn malformed_origins_match_no_pattern() {
        let c = cors(listed(), true);
        for bad in [
            "https://evil.com#.example.org",
            "https://evil.com/.example.org",
            "https://evil.com?.example.org",
            "https://evil.com\\.example.org",
            "https://user@a.example.org",
            "https://a..example.org",
            "https://a.example.org:",
            "https://a.example.org:99999x",
            "https://a.example.org/",
            "null",
            "https://app.example.com/",
        ] {
            assert!(!c.allows(bad.as_bytes()), "{bad}");
        }
        for ok in ["https://a-b.example.org", "https://x.example.org:443"] {
            assert!(c.allows(ok.as_bytes()), "{ok}");
        }
        assert_eq!(parse_origin("http://[::1]:8080"), Some(("http", "[::1]")));
        assert_eq!(
            parse_origin("http://127.0.0.1"),
            Some(("http", "127.0.0.1"))
        );
        assert!(parse_origin("http://[::1]x").is_none());
    }

    #[test]
    fn origins_match_exactly_or_as_subdomains() {
        let c = cors(listed(), true);
        for ok in [
            "https://app.example.com",
            "HTTPS://APP.example.com",
            "https://a.example.org",
            "https://a.b.example.org:8443",
        ] {
            assert!(c.allows(ok.as_bytes()), "{ok}");
        }
        for no in [
            "http://app.example.com",
            "https://app.example.com.evil",
            "https://example.org",
            "https://evilexample.org",
            "null",
        ] {
            assert!(!c.allows(no.as_bytes()), "{no}");
        }
    }

    fn preflight(
        c: &Cors,
        method: &str,
        fields: &str,
    ) -> Option<Result<Vec<(HeaderName, HeaderValue)>, ProxyError>> {
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://app.example.com"),
        );
        h.insert(
            header::ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_str(method).unwrap_or(HeaderValue::from_static("GET")),
        );
        if !fields.is_empty() {
            h.insert(
                header::ACCESS_CONTROL_REQUEST_HEADERS,
                HeaderValue::from_str(fields).unwrap_or(HeaderValue::from_static("x")),
            );
        }
        c.preflight(&Method::OPTIONS, &h)
    }

    #[test]
    fn a_preflight_is_allowed_only_for_its_methods_and_fields() {
        let c = cors(listed(), true);
        assert!(matches!(preflight(&c, "PUT", "Content-Type"), Some(Ok(_))));
        assert!(
            matches!(preflight(&c, "POST", ""), Some(Ok(_))),
            "safelisted"
        );
        assert!(matches!(
            preflight(&c, "DELETE", ""),
            Some(Err(ProxyError::CorsRefused(_)))
        ));
        assert!(matches!(
            preflight(&c, "PUT", "content-type, x-secret"),
            Some(Err(_))
        ));
        let plain = HeaderMap::new();
        assert!(
            c.preflight(&Method::OPTIONS, &plain).is_none(),
            "an OPTIONS without Origin"
        );
    }

    #[test]
    fn answers_get_the_origin_echoed_and_upstream_fields_replaced() {
        let c = cors(listed(), true);
        let mut out = HeaderMap::new();
        out.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        let origin = HeaderValue::from_static("https://app.example.com");
        c.apply(Some(&origin), &mut out);
        assert_eq!(
            out[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://app.example.com"
        );
        assert_eq!(out[header::ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        assert_eq!(out[header::ACCESS_CONTROL_EXPOSE_HEADERS], "x-request-id");
        assert_eq!(out[header::VARY], "Origin");
        let mut other = HeaderMap::new();
        other.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        c.apply(
            Some(&HeaderValue::from_static("https://evil.test")),
            &mut other,
        );
        assert!(other.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none());
        let any = cors(CorsOrigins::Any, false);
        let mut out = HeaderMap::new();
        any.apply(Some(&origin), &mut out);
        assert_eq!(out[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert!(out.get(header::VARY).is_none());
    }
}
