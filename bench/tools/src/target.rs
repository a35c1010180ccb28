//! [`Target`]: the `http://host:port/path` the clients send requests to.

use std::io;
use std::net::SocketAddr;

use bytes::Bytes;

/// A plain-HTTP URL, split into what the clients need: where to connect and what to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port` as written (port 80 when omitted), for connecting and the `Host` header.
    pub authority: String,
    /// The request target: path and query, `/` when the URL has none.
    pub path: String,
}

impl Target {
    /// Parses `http://host[:port][/path][?query]`; any other scheme is refused.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("bad URL {url:?}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{url:?}: only http:// URLs are supported"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{url:?} has no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        Ok(Self {
            authority: format!("{}:{port}", authority.host()),
            path: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
        })
    }

    /// Resolves the host once, so that connecting later costs no lookup.
    pub async fn resolve(&self) -> io::Result<SocketAddr> {
        let lookup = tokio::net::lookup_host(self.authority.as_str()).await;
        let mut addrs = lookup.map_err(|e| {
            io::Error::new(e.kind(), format!("cannot resolve {}: {e}", self.authority))
        })?;
        addrs.next().ok_or_else(|| {
            let msg = format!("{} has no address", self.authority);
            io::Error::new(io::ErrorKind::NotFound, msg)
        })
    }

    /// A keep-alive `GET` of the path, ready to write as is.
    pub fn get_request(&self, agent: &str) -> Bytes {
        let host = self
            .authority
            .strip_suffix(":80")
            .unwrap_or(&self.authority);
        let path = &self.path;
        Bytes::from(format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {agent}\r\n\r\n"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn urls_split_into_authority_and_path() {
        let t = Target::parse("http://127.0.0.1:8080/a?bytes=3").expect("valid");
        assert_eq!(t.authority, "127.0.0.1:8080");
        assert_eq!(t.path, "/a?bytes=3");
        let t = Target::parse("http://localhost").expect("valid");
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("localhost:80", "/")
        );
        let req = t.get_request("x");
        assert!(req.starts_with(b"GET / HTTP/1.1\r\nHost: localhost\r\n"));
    }

    #[test]
    fn other_schemes_and_garbage_are_refused() {
        assert!(Target::parse("https://example.com/").is_err());
        assert!(Target::parse("127.0.0.1:80").is_err());
        assert!(Target::parse("http://").is_err());
    }
}
