//! Route conditions: host, path prefix, method, header values, client CIDR.

use http::{HeaderName, HeaderValue, Method};
use ipnet::IpNet;
use sluice_config::{HostMatch, Match};

use super::route::RequestHead;

/// A compiled route condition; every non-empty part must hold.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    hosts: Vec<HostMatch>,
    path_prefix: Option<String>,
    case_insensitive: bool,
    methods: Vec<Method>,
    headers: Vec<(HeaderName, HeaderValue)>,
    client_cidrs: Vec<IpNet>,
}

impl Matcher {
    /// A matcher that accepts every request.
    pub fn any() -> Self {
        Self::default()
    }

    /// Only requests for this host; `*.example.com` accepts any subdomain. Repeatable (any of).
    pub fn host(mut self, pattern: &str) -> Self {
        let pattern = pattern.to_ascii_lowercase();
        self.hosts.push(match pattern.strip_prefix('*') {
            Some(suffix) => HostMatch::Suffix(suffix.to_owned()),
            None => HostMatch::Exact(pattern),
        });
        self
    }

    /// Only request paths starting with `prefix`.
    pub fn path_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.path_prefix = Some(prefix.into());
        self
    }

    /// Compare the path prefix without regard to ASCII case (default: case-sensitive), for
    /// upstreams that serve `/ADMIN` as `/admin` (IIS, case-insensitive file systems).
    pub fn case_insensitive(mut self) -> Self {
        self.case_insensitive = true;
        self
    }

    /// Only these methods. Repeatable (any of).
    pub fn method(mut self, method: Method) -> Self {
        self.methods.push(method);
        self
    }

    /// Only requests carrying this header with exactly this value. Repeatable (all of).
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Only clients inside this network. Repeatable (any of).
    pub fn client_cidr(mut self, net: IpNet) -> Self {
        self.client_cidrs.push(net);
        self
    }

    /// Whether a condition is on the request's headers.
    pub fn reads_headers(&self) -> bool {
        !self.headers.is_empty()
    }

    /// Whether the request satisfies every condition.
    pub fn matches(&self, head: &RequestHead<'_>) -> bool {
        self.host_ok(head.host)
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| self.prefix_of(p, head.path))
            && (self.methods.is_empty() || self.methods.contains(head.method))
            && self
                .headers
                .iter()
                .all(|(name, value)| head.headers.get_all(name).iter().any(|v| v == value))
            && (self.client_cidrs.is_empty()
                || self
                    .client_cidrs
                    .iter()
                    .any(|net| net.contains(&head.client.ip())))
    }

    fn prefix_of(&self, prefix: &str, path: &str) -> bool {
        if !self.case_insensitive {
            return path.starts_with(prefix);
        }
        let n = prefix.len();
        path.len() >= n && path.as_bytes()[..n].eq_ignore_ascii_case(prefix.as_bytes())
    }

    fn host_ok(&self, host: Option<&str>) -> bool {
        if self.hosts.is_empty() {
            return true;
        }
        let Some(host) = host else { return false };
        self.hosts.iter().any(|m| match m {
            HostMatch::Exact(h) => h == host,
            HostMatch::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_str()),
        })
    }
}

impl From<&Match> for Matcher {
    fn from(m: &Match) -> Self {
        Self {
            hosts: m.hosts.clone(),
            path_prefix: m.path_prefix.clone(),
            case_insensitive: m.case_insensitive,
            methods: m.methods.clone(),
            headers: m.headers.clone(),
            client_cidrs: m.client_cidrs.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use http::{HeaderMap, Uri};

    use super::*;

    fn head<'a>(
        uri: &'a Uri,
        headers: &'a HeaderMap,
        host: Option<&'a str>,
        client: &str,
    ) -> RequestHead<'a> {
        RequestHead {
            method: &Method::GET,
            uri,
            path: uri.path(),
            headers,
            host,
            client: client.parse().unwrap(),
        }
    }

    #[test]
    fn host_exact_and_suffix() {
        let m = Matcher::any().host("API.example.com").host("*.test.io");
        let (uri, h) = (Uri::from_static("/"), HeaderMap::new());
        assert!(m.matches(&head(&uri, &h, Some("api.example.com"), "127.0.0.1:1")));
        assert!(m.matches(&head(&uri, &h, Some("a.b.test.io"), "127.0.0.1:1")));
        assert!(!m.matches(&head(&uri, &h, Some("test.io"), "127.0.0.1:1")));
        assert!(!m.matches(&head(&uri, &h, None, "127.0.0.1:1")));
    }

    #[test]
    fn path_method_header_and_cidr_all_must_hold() {
        let m = Matcher::any()
            .path_prefix("/api/")
            .method(Method::GET)
            .header(
                HeaderName::from_static("x-canary"),
                HeaderValue::from_static("1"),
            )
            .client_cidr("192.168.0.0/24".parse().unwrap());
        let uri = Uri::from_static("/api/users?x=1");
        let mut h = HeaderMap::new();
        h.insert("x-canary", HeaderValue::from_static("1"));
        assert!(m.matches(&head(&uri, &h, None, "192.168.0.77:5000")));
        assert!(!m.matches(&head(&uri, &h, None, "192.168.1.77:5000")));
        let other = Uri::from_static("/apx");
        assert!(!m.matches(&head(&other, &h, None, "192.168.0.77:5000")));
        assert!(!m.matches(&head(&uri, &HeaderMap::new(), None, "192.168.0.77:5000")));
    }

    #[test]
    fn prefixes_match_the_path_without_parameters_and_case_when_asked() {
        let internal = Matcher::any().path_prefix("/internal/");
        let h = HeaderMap::new();
        let uri = Uri::from_static("/internal;x=1/a");
        let stripped = sluice_wire::normalize::match_path(uri.path());
        let with_path = |path| RequestHead {
            path,
            ..head(&uri, &h, None, "127.0.0.1:1")
        };
        assert!(internal.matches(&with_path(&stripped)));
        let admin = Uri::from_static("/ADMIN/x");
        assert!(!Matcher::any().path_prefix("/admin").matches(&head(
            &admin,
            &h,
            None,
            "127.0.0.1:1"
        )));
        let insensitive = Matcher::any().path_prefix("/admin").case_insensitive();
        assert!(insensitive.matches(&head(&admin, &h, None, "127.0.0.1:1")));
        let short = Uri::from_static("/ad");
        assert!(!insensitive.matches(&head(&short, &h, None, "127.0.0.1:1")));
    }
}
