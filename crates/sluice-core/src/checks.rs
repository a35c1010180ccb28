//! What a request must satisfy before it is routed: checks hyper does not make but a proxy
//! must, because the proxy and the upstream could otherwise disagree about the request.

use http::{header, Method, Request, Version};

use crate::error::ProxyError;

/// Inserted by the server's framing guard into the extensions of an HTTP/1 request whose
/// head carried both Content-Length and Transfer-Encoding. hyper removes Content-Length before
/// the service sees the request, so this marker is the only evidence left;
/// [`check_request`] refuses it (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmbiguousFraming;

/// The largest request body forwarded: the route's `max_request_body`, else the listener's
/// (`listener`, from [`ClientInfo`](super::ClientInfo)); `None`: no limit.
pub fn body_limit(route: Option<u64>, listener: Option<u64>) -> Option<u64> {
    route.or(listener)
}

/// Refuses (413) a body that declares more than `limit` bytes (`declared`: its
/// `Content-Length`), before any of it is read; one of unknown length is counted as it comes.
pub fn check_body_length(declared: u64, limit: Option<u64>) -> Result<(), ProxyError> {
    match limit {
        Some(limit) if declared > limit => {
            Err(ProxyError::BodyTooLarge(crate::body::BodyTooLarge(limit)))
        }
        _ => Ok(()),
    }
}

/// Refuses requests that could be read differently by the router and by the upstream.
pub fn check_request<B>(req: &Request<B>) -> Result<(), ProxyError> {
    check_framing(req)?;
    check_host(req)?;
    if req.method() == Method::CONNECT {
        return Err(ProxyError::NotImplemented("CONNECT is not supported"));
    }
    // RFC 9112 §3.2.4: the asterisk-form is only for a server-wide OPTIONS.
    if req.uri().path() == "*" && req.method() != Method::OPTIONS {
        return Err(ProxyError::BadRequest(
            "asterisk-form target is only for OPTIONS",
        ));
    }
    check_target_form(req.uri())
}

/// RFC 9112 §3.2.3: the authority-form (`GET admin HTTP/1.1`) is only for CONNECT; and an
/// absolute-form target names `http` or `https`, the schemes an HTTP proxy serves (RFC 9110
/// §4.2). Routing and forwarding would agree on either, but a request that sends one is not
/// HTTP a server should guess at.
fn check_target_form(uri: &http::Uri) -> Result<(), ProxyError> {
    match uri.scheme_str() {
        None if uri.authority().is_some() => Err(ProxyError::BadRequest(
            "authority-form target is only for CONNECT",
        )),
        Some(scheme)
            if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") =>
        {
            Err(ProxyError::BadRequest(
                "absolute-form target with a scheme other than http or https",
            ))
        }
        _ => Ok(()),
    }
}

/// Both Content-Length and Transfer-Encoding is the classic request-smuggling vector
/// (RFC 9112 §6.3). hyper drops Content-Length from such a request, so Sluice's server marks
/// it with [`AmbiguousFraming`]; the header check covers requests from other servers.
fn check_framing<B>(req: &Request<B>) -> Result<(), ProxyError> {
    let headers = req.headers();
    let both = headers.contains_key(header::TRANSFER_ENCODING)
        && headers.contains_key(header::CONTENT_LENGTH);
    if both || req.extensions().get::<AmbiguousFraming>().is_some() {
        return Err(ProxyError::BadRequest(
            "both Content-Length and Transfer-Encoding",
        ));
    }
    check_transfer_coding(headers)
}

/// A request body may only be chunked, once (RFC 9112 §6.1, §7). hyper decodes the final
/// `chunked` and would forward what is under it as plain content, silently dropping any other
/// coding (`gzip, chunked`); like NGINX, Sluice answers 501 to codings it does not implement.
fn check_transfer_coding(headers: &http::HeaderMap) -> Result<(), ProxyError> {
    let mut chunked = 0;
    for coding in headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty())
    {
        if !coding.eq_ignore_ascii_case(b"chunked") {
            return Err(ProxyError::NotImplemented("unsupported transfer coding"));
        }
        chunked += 1;
    }
    if chunked > 1 {
        return Err(ProxyError::BadRequest(
            "chunked transfer coding applied twice",
        ));
    }
    Ok(())
}

/// RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host (unless its target names the
/// host), and no request may carry two: the router would read one and the upstream another.
fn check_host<B>(req: &Request<B>) -> Result<(), ProxyError> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (_, Some(_)) => Err(ProxyError::BadRequest("more than one Host header")),
        (None, None) if req.version() == Version::HTTP_11 && req.uri().authority().is_none() => {
            Err(ProxyError::BadRequest("missing Host header"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn host_rules() {
        let ok = Request::get("/").header("host", "a").body(()).unwrap();
        assert!(check_host(&ok).is_ok());
        let absolute = Request::get("http://a/").body(()).unwrap();
        assert!(check_host(&absolute).is_ok());
        let missing = Request::get("/").body(()).unwrap();
        assert!(check_host(&missing).is_err());
        let http10 = Request::get("/")
            .version(Version::HTTP_10)
            .body(())
            .unwrap();
        assert!(check_host(&http10).is_ok());
        let two = Request::get("/")
            .header("host", "a")
            .header("host", "b")
            .body(())
            .unwrap();
        assert!(check_host(&two).is_err());
    }

    #[test]
    fn transfer_codings_other_than_one_chunked_are_refused() {
        let te = |values: &[&str]| {
            let mut b = Request::post("/").header("host", "a");
            for v in values {
                b = b.header("transfer-encoding", *v);
            }
            check_request(&b.body(()).unwrap()).map_err(|e| e.status().as_u16())
        };
        assert_eq!(te(&["chunked"]), Ok(()));
        assert_eq!(te(&["Chunked"]), Ok(()));
        assert_eq!(te(&["gzip, chunked"]), Err(501));
        assert_eq!(te(&["chunked, chunked"]), Err(400));
        assert_eq!(te(&["chunked", "chunked"]), Err(400));
    }

    #[test]
    fn asterisk_form_is_for_options_only() {
        let star = |m: Method| {
            let req = Request::builder().method(m).uri("*").header("host", "a");
            check_request(&req.body(()).unwrap()).map_err(|e| e.status().as_u16())
        };
        assert_eq!(star(Method::GET), Err(400));
        assert_eq!(star(Method::OPTIONS), Ok(()));
    }

    #[test]
    fn authority_form_and_other_schemes_are_refused() {
        let target = |uri: &str| {
            let req = Request::get(uri).header("host", "a").body(()).unwrap();
            check_request(&req).map_err(|e| e.status().as_u16())
        };
        assert_eq!(target("admin"), Err(400));
        assert_eq!(target("admin:80"), Err(400));
        assert_eq!(target("foo://secret.example/"), Err(400));
        assert_eq!(target("ftp://a/"), Err(400));
        assert_eq!(target("http://a/x"), Ok(()));
        assert_eq!(target("HTTPS://a/x"), Ok(()));
        assert_eq!(target("/x"), Ok(()));
    }

    #[test]
    fn connect_is_refused() {
        let req = Request::connect("a:443")
            .header("host", "a:443")
            .body(())
            .unwrap();
        assert_eq!(check_request(&req).unwrap_err().status(), 501);
    }
}
