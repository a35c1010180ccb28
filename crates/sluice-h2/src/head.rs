//! A request's header block as RFC 9113 §8 says it must be: [`Fields`] takes each decoded field
//! and remembers the first rule it breaks; [`Fields::request`] and [`Fields::trailers`] make
//! what the proxy is handed.

use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, COOKIE, HOST, TE};
use http::{HeaderMap, Method, Request, Uri};

/// Why a header block is not a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// It breaks a rule of RFC 9113 §8 (a stream error, PROTOCOL_ERROR): the reason says which.
    Malformed(&'static str),
    /// Its fields take more than the server's header list limit (answered 431).
    TooLarge,
}

/// The pseudo-fields of a request (RFC 9113 §8.3.1).
#[derive(Debug, Default)]
struct Pseudo {
    method: Option<Vec<u8>>,
    scheme: Option<Vec<u8>>,
    authority: Option<Vec<u8>>,
    path: Option<Vec<u8>>,
}

/// A header block's fields as they are decoded, checked one by one.
#[derive(Debug)]
pub struct Fields {
    pseudo: Pseudo,
    headers: HeaderMap,
    /// Cookie crumbs (RFC 9113 §8.2.3), joined with "; " into one field at the end.
    cookies: Vec<u8>,
    /// The list's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it, and its limit.
    size: usize,
    limit: usize,
    regular_seen: bool,
    refused: Option<Refused>,
}

/// Fields HTTP/2 has no place for (RFC 9113 §8.2.2): a request carrying one is malformed, and
/// an answer from an HTTP/1.1 upstream leaves them out.
pub const CONNECTION_SPECIFIC: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

impl Fields {
    /// An empty list whose fields may take `limit` bytes (name, value and 32 each).
    pub fn new(limit: usize) -> Self {
        Self {
            pseudo: Pseudo::default(),
            headers: HeaderMap::new(),
            cookies: Vec::new(),
            size: 0,
            limit,
            regular_seen: false,
            refused: None,
        }
    }

    fn refuse(&mut self, why: Refused) {
        self.refused.get_or_insert(why);
    }

    /// Takes one decoded field.
    pub fn field(&mut self, name: &[u8], value: &[u8]) {
        if self.refused.is_some() {
            return;
        }
        self.size = self.size.saturating_add(name.len() + value.len() + 32);
        if self.size > self.limit {
            return self.refuse(Refused::TooLarge);
        }
        if let Err(why) = check_value(value) {
            return self.refuse(Refused::Malformed(why));
        }
        match name.strip_prefix(b":") {
            Some(pseudo) => self.pseudo_field(pseudo, value),
            None => self.regular(name, value),
        }
    }

    fn pseudo_field(&mut self, name: &[u8], value: &[u8]) {
        if self.regular_seen {
            return self.refuse(Refused::Malformed("a pseudo-field after a regular field"));
        }
        let slot = match name {
            b"method" => &mut self.pseudo.method,
            b"scheme" => &mut self.pseudo.scheme,
            b"authority" => &mut self.pseudo.authority,
            b"path" => &mut self.pseudo.path,
            _ => return self.refuse(Refused::Malformed("an unknown or a response pseudo-field")),
        };
        if slot.replace(value.to_vec()).is_some() {
            self.refuse(Refused::Malformed("a pseudo-field twice"));
        }
    }

    fn regular(&mut self, name: &[u8], value: &[u8]) {
        self.regular_seen = true;
        if name.iter().any(u8::is_ascii_uppercase) {
            return self.refuse(Refused::Malformed("an uppercase field name"));
        }
        let Ok(name) = HeaderName::from_bytes(name) else {
            return self.refuse(Refused::Malformed("a field name that is not a token"));
        };
        if CONNECTION_SPECIFIC.contains(&name.as_str()) {
            return self.refuse(Refused::Malformed("a connection-specific field"));
        }
        if name == TE && !value.eq_ignore_ascii_case(b"trailers") {
            return self.refuse(Refused::Malformed("TE other than \"trailers\""));
        }
        if name == COOKIE {
            if value.is_empty() {
                // An empty crumb carries nothing; joined, it would end the field in "; ".
                return;
            }
            if !self.cookies.is_empty() {
                self.cookies.extend_from_slice(b"; ");
            }
            return self.cookies.extend_from_slice(value);
        }
        match HeaderValue::from_bytes(value) {
            Ok(value) => {
                self.headers.append(name, value);
            }
            Err(_) => self.refuse(Refused::Malformed("a field value with a control character")),
        }
    }

    /// The fields with the cookie crumbs joined, if none broke a rule.
    fn finish(mut self) -> Result<(Pseudo, HeaderMap), Refused> {
        if let Some(why) = self.refused {
            return Err(why);
        }
        if !self.cookies.is_empty() {
            let cookie = HeaderValue::from_bytes(&self.cookies)
                .map_err(|_| Refused::Malformed("a cookie with a control character"))?;
            self.headers.insert(COOKIE, cookie);
        }
        Ok((self.pseudo, self.headers))
    }

    /// The request the block is (RFC 9113 §8.3.1), version HTTP/2, its body's declared length
    /// with it. A `Host` field that names another authority than `:authority` is malformed (a
    /// proxy that routed by one and forwarded the other would be fooled).
    pub fn request(self) -> Result<(Request<()>, Option<u64>), Refused> {
        let (pseudo, headers) = self.finish()?;
        let method = pseudo
            .method
            .as_deref()
            .ok_or(Refused::Malformed("no :method"))?;
        let method = Method::from_bytes(method).map_err(|_| Refused::Malformed("a bad :method"))?;
        let uri = uri(&method, pseudo)?;
        if let (Some(host), Some(authority)) = (headers.get(HOST), uri.authority()) {
            if !host
                .as_bytes()
                .eq_ignore_ascii_case(authority.as_str().as_bytes())
            {
                return Err(Refused::Malformed("a Host field other than :authority"));
            }
        }
        let length = content_length(&headers)?;
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.version_mut() = http::Version::HTTP_2;
        *req.headers_mut() = headers;
        Ok((req, length))
    }

    /// The trailers the block is: regular fields only.
    pub fn trailers(self) -> Result<HeaderMap, Refused> {
        let (pseudo, headers) = self.finish()?;
        let Pseudo {
            method,
            scheme,
            authority,
            path,
        } = pseudo;
        if method.or(scheme).or(authority).or(path).is_some() {
            return Err(Refused::Malformed("a pseudo-field in trailers"));
        }
        Ok(headers)
    }
}

/// RFC 9113 §8.2.1: no NUL, CR or LF, no whitespace at either end.
fn check_value(value: &[u8]) -> Result<(), &'static str> {
    if value.iter().any(|&b| matches!(b, 0 | b'\r' | b'\n')) {
        return Err("a field value with NUL, CR or LF");
    }
    let ws = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    if ws(value.first()) || ws(value.last()) {
        return Err("a field value with whitespace at an end");
    }
    Ok(())
}

/// The request's target: CONNECT has `:authority` only; every other method `:scheme` and a
/// non-empty `:path` (`*` only for OPTIONS), `:authority` if the client sent one.
fn uri(method: &Method, pseudo: Pseudo) -> Result<Uri, Refused> {
    if method == Method::CONNECT {
        if pseudo.scheme.is_some() || pseudo.path.is_some() {
            return Err(Refused::Malformed("CONNECT with :scheme or :path"));
        }
        let authority = pseudo
            .authority
            .ok_or(Refused::Malformed("CONNECT without :authority"))?;
        return Uri::builder()
            .authority(authority)
            .build()
            .map_err(|_| Refused::Malformed("a bad :authority"));
    }
    let scheme = pseudo.scheme.ok_or(Refused::Malformed("no :scheme"))?;
    let path = pseudo.path.ok_or(Refused::Malformed("no :path"))?;
    match path.first() {
        None => return Err(Refused::Malformed("an empty :path")),
        Some(b'/') => {}
        Some(b'*') if path.len() == 1 && method == Method::OPTIONS => {}
        Some(_) => return Err(Refused::Malformed("a :path that is not absolute")),
    }
    let scheme = http::uri::Scheme::try_from(scheme.as_slice())
        .map_err(|_| Refused::Malformed("a bad :scheme"))?;
    let path = http::uri::PathAndQuery::try_from(path.as_slice())
        .map_err(|_| Refused::Malformed("a bad :path"))?;
    let uri = match pseudo.authority {
        Some(authority) => Uri::builder().scheme(scheme).authority(authority),
        // `http::Uri` has no scheme without an authority: the target alone, as the `h2`
        // crate makes it.
        None => Uri::builder(),
    };
    uri.path_and_query(path)
        .build()
        .map_err(|_| Refused::Malformed("a bad :authority"))
}

/// The body's declared length: every `content-length` field the same number, or none.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Refused> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let n = std::str::from_utf8(value.as_bytes())
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(Refused::Malformed("a bad content-length"))?;
        if length.replace(n).is_some_and(|m| m != n) {
            return Err(Refused::Malformed("content-length twice, differing"));
        }
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn fields(list: &[(&str, &str)]) -> Fields {
        let mut fields = Fields::new(16 * 1024);
        for (n, v) in list {
            fields.field(n.as_bytes(), v.as_bytes());
        }
        fields
    }

    const GET: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "example.test:8443"),
        (":path", "/a?b=c"),
    ];

    #[test]
    fn a_request_is_made_with_its_target_and_fields() {
        let mut list = GET.to_vec();
        list.extend([("cookie", "a=1"), ("x-one", "1"), ("cookie", "b=2")]);
        let (req, length) = fields(&list).request().unwrap();
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.uri().to_string(), "https://example.test:8443/a?b=c");
        assert_eq!(req.version(), http::Version::HTTP_2);
        assert_eq!(
            req.headers()["cookie"],
            "a=1; b=2",
            "crumbs joined (RFC 9113 §8.2.3)"
        );
        assert_eq!(length, None);
        // Empty crumbs (fuzz/h2_fields found them joined into "; ; ", a value that ends in
        // whitespace) are left out.
        let mut list = GET.to_vec();
        list.extend([
            ("cookie", ""),
            ("cookie", "a=1"),
            ("cookie", ""),
            ("cookie", ""),
        ]);
        let (req, _) = fields(&list).request().unwrap();
        assert_eq!(req.headers()["cookie"], "a=1");
        let mut list = GET.to_vec();
        list.extend([("cookie", ""), ("cookie", "")]);
        let (req, _) = fields(&list).request().unwrap();
        assert!(req.headers().get("cookie").is_none());
    }

    #[test]
    fn each_rule_of_section_8_refuses_the_request() {
        let with = |extra: (&'static str, &'static str)| {
            let mut list = GET.to_vec();
            list.push(extra);
            list
        };
        let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
            ("uppercase", with(("X-A", "1"))),
            ("connection", with(("connection", "close"))),
            ("te", with(("te", "gzip"))),
            ("unknown pseudo", with((":protocol", "x"))),
            ("pseudo twice", with((":path", "/b"))),
            ("NUL", with(("x-a", "a\0b"))),
            ("leading space", with(("x-a", " a"))),
            ("trailing tab", with(("x-a", "a\t"))),
            ("host differs", with(("host", "other.test"))),
            ("content-length", with(("content-length", "1x"))),
            ("no path", GET[..3].to_vec()),
            (
                "empty path",
                vec![(":method", "GET"), (":scheme", "http"), (":path", "")],
            ),
            (
                "relative path",
                vec![(":method", "GET"), (":scheme", "http"), (":path", "a")],
            ),
            (
                "connect with path",
                vec![
                    (":method", "CONNECT"),
                    (":authority", "a:1"),
                    (":path", "/"),
                ],
            ),
        ];
        for (name, list) in cases {
            assert!(
                matches!(fields(&list).request(), Err(Refused::Malformed(_))),
                "{name}"
            );
        }
        let mut list = GET.to_vec();
        list.push(("x-big", "v"));
        let mut small = Fields::new(100);
        for (n, v) in &list {
            small.field(n.as_bytes(), v.as_bytes());
        }
        assert_eq!(small.request().unwrap_err(), Refused::TooLarge);
    }

    #[test]
    fn trailers_take_regular_fields_only() {
        assert_eq!(
            fields(&[("grpc-status", "0")]).trailers().unwrap()["grpc-status"],
            "0"
        );
        assert!(fields(&[(":path", "/")]).trailers().is_err());
    }
}
