//! A redirect's `Location` for one request ([`location`]), from the route's template
//! (`sluice_config::LocationTemplate`, whose shape the configuration checked: only `{host}`
//! fills a URL's host, and a path cannot start with `//`).
//!
//! What fills it in was normalised before routing: the host is a name, an IPv4 address or a
//! bracketed IPv6 address (`sluice_wire::normalize::normal_authority`), so it cannot carry a
//! `/`, `@`, a space or a line break; the path never starts with `//`. Both paths fill it in
//! through [`Place::of`] and `proxy::direct_response`.

use http::uri::PathAndQuery;
use http::{HeaderValue, Uri};
use sluice_config::{LocationPiece, LocationTemplate};

use crate::error::ProxyError;

/// What a location is filled in from.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// Whether the client connected over TLS (`{scheme}`).
    pub tls: bool,
    /// The host the client asked for, without its port (`{host}`); `None` when it named none.
    pub host: Option<&'a str>,
    /// The normalised path, rewritten when the route rewrites (`{path}`).
    pub path: &'a str,
    /// The query, without `?` (`{query}`).
    pub query: Option<&'a str>,
}

impl<'a> Place<'a> {
    /// Where a request went: `host` as the path that routed it read it (without its port),
    /// the path the route's rewrite made (`target`) or else the request's own, and its query.
    pub fn of(
        tls: bool,
        host: Option<&'a str>,
        uri: &'a Uri,
        target: Option<&'a PathAndQuery>,
    ) -> Self {
        Self {
            tls,
            host,
            path: target.map_or(uri.path(), PathAndQuery::path),
            query: uri.query(),
        }
    }
}

/// The `Location` `template` names for the request at `place`. A request that named no host
/// (HTTP/1.0, an empty `Host`) cannot be sent to `{host}`: 400.
pub fn location(template: &LocationTemplate, place: &Place<'_>) -> Result<HeaderValue, ProxyError> {
    let mut out = String::with_capacity(64 + place.path.len());
    for piece in &template.0 {
        match piece {
            LocationPiece::Text(text) => out.push_str(text),
            LocationPiece::Scheme => out.push_str(if place.tls { "https" } else { "http" }),
            LocationPiece::Host => match place.host {
                Some(host) if !host.is_empty() => out.push_str(host),
                _ => return Err(ProxyError::BadRequest("no Host to redirect to")),
            },
            LocationPiece::Path => push_path(&mut out, place.path),
            LocationPiece::Query => out.push_str(place.query.unwrap_or("")),
            LocationPiece::Uri => {
                push_path(&mut out, place.path);
                if let Some(query) = place.query {
                    out.push('?');
                    out.push_str(query);
                }
            }
        }
    }
    HeaderValue::try_from(out)
        .map_err(|_| ProxyError::Rewrite("the redirect's location is not a valid field value"))
}

/// `path` into a location with every `\` written `%5C`: a listener that keeps raw backslashes
/// (`escaped_slashes = "keep"`) must not make `/\evil.com` a location browsers read as
/// `//evil.com`, another host.
fn push_path(out: &mut String, path: &str) {
    for (i, part) in path.split('\\').enumerate() {
        if i > 0 {
            out.push_str("%5C");
        }
        out.push_str(part);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const PLACE: Place<'static> = Place {
        tls: false,
        host: Some("example.com"),
        path: "/a/b",
        query: Some("x=1&y"),
    };

    fn render(template: &str, place: &Place<'_>) -> Result<HeaderValue, ProxyError> {
        location(&LocationTemplate::parse(template).unwrap(), place)
    }

    #[test]
    fn a_backslash_in_the_path_cannot_make_another_host() {
        let place = Place {
            path: "/\\evil.com/x",
            ..PLACE
        };
        assert_eq!(render("{uri}", &place).unwrap(), "/%5Cevil.com/x?x=1&y");
        assert_eq!(render("{path}", &place).unwrap(), "/%5Cevil.com/x");
    }

    #[test]
    fn placeholders_are_filled_in() {
        let cases = [
            ("https://{host}{uri}", "https://example.com/a/b?x=1&y"),
            ("https://{host}{path}", "https://example.com/a/b"),
            (
                "{scheme}://{host}:8443{path}?{query}",
                "http://example.com:8443/a/b?x=1&y",
            ),
            ("/new{uri}", "/new/a/b?x=1&y"),
        ];
        for (template, want) in cases {
            assert_eq!(render(template, &PLACE).unwrap(), want, "{template}");
        }
        let bare = Place {
            query: None,
            ..PLACE
        };
        assert_eq!(
            render("https://{host}{uri}", &bare).unwrap(),
            "https://example.com/a/b"
        );
    }

    #[test]
    fn no_host_is_the_clients_mistake() {
        for host in [None, Some("")] {
            let place = Place { host, ..PLACE };
            let e = render("https://{host}{uri}", &place).unwrap_err();
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
        }
        let place = Place {
            host: None,
            ..PLACE
        };
        assert_eq!(
            render("https://example.org{uri}", &place).unwrap(),
            "https://example.org/a/b?x=1&y"
        );
    }
}
