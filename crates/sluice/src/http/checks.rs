//! What a request must satisfy before it is routed: checks hyper does not make but a proxy
//! must, because the proxy and the upstream could otherwise disagree about the request.

use http::{header, Method, Request, Version};

use crate::error::ProxyError;
use crate::server::AmbiguousFraming;

/// Refuses requests that could be read differently by the router and by the upstream.
pub fn check_request<B>(req: &Request<B>) -> Result<(), ProxyError> {
    check_framing(req)?;
    check_host(req)?;
    if req.method() == Method::CONNECT {
        return Err(ProxyError::NotImplemented("CONNECT is not supported"));
    }
    if has_dot_segment(req.uri().path()) {
        return Err(ProxyError::BadRequest("dot-segments in the path"));
    }
    Ok(())
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

/// Whether the path has a `.` or `..` segment, also when percent-encoded (`%2e`). Upstreams
/// normalise those away, so `/public/../admin` would match a `/public/` route and reach
/// `/admin`; refusing them keeps path-prefix routing (and the CIDR rules on it) honest.
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|segment| {
        let mut rest = segment;
        let mut dots = 0;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix('.') {
                rest = r;
            } else if let Some(r) = rest
                .strip_prefix("%2e")
                .or_else(|| rest.strip_prefix("%2E"))
            {
                rest = r;
            } else {
                return false;
            }
            dots += 1;
        }
        dots == 1 || dots == 2
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn dot_segments_plain_and_encoded() {
        for bad in [
            "/a/../b",
            "/./x",
            "/a/..",
            "/a/%2e%2E/b",
            "/a/.%2e",
            "/%2e/x",
        ] {
            assert!(has_dot_segment(bad), "{bad}");
        }
        for good in [
            "/",
            "/a/b",
            "/a/.../b",
            "/a/.hidden",
            "/a/b.",
            "/v1.2/x",
            "/%2e%2e%2e",
        ] {
            assert!(!has_dot_segment(good), "{good}");
        }
    }

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
    fn connect_is_refused() {
        let req = Request::connect("a:443")
            .header("host", "a:443")
            .body(())
            .unwrap();
        assert_eq!(check_request(&req).unwrap_err().status(), 501);
    }
}
