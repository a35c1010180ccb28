//! Where a redirect sends the client (`direct_response = { location = "https://{host}{uri}" }`),
//! Caddy's placeholders in NGINX's `return 301 URL`. Checked here so that no request can
//! choose the host a redirect names, nor make it protocol-relative; the proxy's core
//! (`sluice_core::redirect`) fills it in.

/// A parsed location: text and placeholders, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationTemplate(pub Vec<LocationPiece>);

/// A piece of a location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocationPiece {
    /// Written as it is.
    Text(String),
    /// `{scheme}`: `https` when the client connected over TLS, else `http`.
    Scheme,
    /// `{host}`: the host the client asked for, normalised (lowercase, no trailing dot),
    /// without its port.
    Host,
    /// `{path}`: the path, normalised (and rewritten, when the route has a `rewrite`), without
    /// the query.
    Path,
    /// `{query}`: the query as sent, without `?` (empty when there is none).
    Query,
    /// `{uri}`: `{path}`, then `?` and the query when there is one (NGINX's `$request_uri`).
    Uri,
}

/// Every placeholder by its name.
const PLACEHOLDERS: [(&str, LocationPiece); 5] = [
    ("scheme", LocationPiece::Scheme),
    ("host", LocationPiece::Host),
    ("path", LocationPiece::Path),
    ("query", LocationPiece::Query),
    ("uri", LocationPiece::Uri),
];

const SHAPE: &str = "a location is an absolute URL (\"https://…\", \"{scheme}://…\") or a path \
                     starting with one \"/\"";

impl LocationTemplate {
    /// Parses `text`: placeholders in braces, visible ASCII around them. It must be an
    /// absolute `http`/`https` URL whose host part only `{host}` fills, or a path that cannot
    /// start with `//`. The error says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let template = Self(pieces(text)?);
        template.check_shape()?;
        Ok(template)
    }

    fn check_shape(&self) -> Result<(), String> {
        let (first, next) = (self.0.first(), self.0.get(1));
        match (first, next) {
            (Some(LocationPiece::Path | LocationPiece::Uri), _) => Ok(()),
            (Some(LocationPiece::Scheme), Some(LocationPiece::Text(t))) if t.starts_with("://") => {
                self.check_authority(1, 3)
            }
            (Some(LocationPiece::Text(t)), _) => match scheme_len(t) {
                Some(len) => self.check_authority(0, len),
                None => relative(t, next),
            },
            _ => Err(SHAPE.into()),
        }
    }

    /// The host part, from byte `at` of piece `index` up to the first `/`, `?` or `#` (or
    /// `{path}`, `{uri}`, which start with `/`): only text a host may have, and `{host}`; not
    /// empty.
    fn check_authority(&self, index: usize, at: usize) -> Result<(), String> {
        let mut empty = true;
        for (i, piece) in self.0.iter().enumerate().skip(index) {
            let text = match piece {
                LocationPiece::Host => {
                    empty = false;
                    continue;
                }
                LocationPiece::Path | LocationPiece::Uri => break,
                LocationPiece::Text(t) if i == index => &t[at..],
                LocationPiece::Text(t) => t.as_str(),
                _ => return Err("only {host} may fill the host part of a location".into()),
            };
            let end = text.find(['/', '?', '#']).unwrap_or(text.len());
            host_text(&text[..end])?;
            empty &= end == 0;
            if end < text.len() {
                break;
            }
        }
        if empty {
            return Err("a location's URL needs a host (\"https://{host}{uri}\")".into());
        }
        Ok(())
    }
}

/// The length of `http://` or `https://` (any case) at the start of `text`.
fn scheme_len(text: &str) -> Option<usize> {
    ["http://", "https://"]
        .into_iter()
        .find(|s| {
            text.get(..s.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(s))
        })
        .map(str::len)
}

/// A path location: one `/`, never followed by another (in the text or through `{path}` or
/// `{uri}`, which start with one), nor by `\`, which browsers read as `/`.
fn relative(text: &str, next: Option<&LocationPiece>) -> Result<(), String> {
    let second = text.as_bytes().get(1);
    let doubled = matches!(second, Some(b'/' | b'\\'))
        || (text == "/" && matches!(next, Some(LocationPiece::Path | LocationPiece::Uri)));
    if !text.starts_with('/') || doubled {
        return Err(SHAPE.into());
    }
    Ok(())
}

/// What the literal host part of a location may hold: a name, an address, a port.
fn host_text(text: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._:[]".contains(c);
    match text.chars().find(|c| !allowed(*c)) {
        Some(c) => Err(format!("`{c}` cannot be in the host part of a location")),
        None => Ok(()),
    }
}

/// The pieces of `text`, with every placeholder known and every character visible ASCII.
fn pieces(text: &str) -> Result<Vec<LocationPiece>, String> {
    if let Some(c) = text.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!("{c:?} cannot be in a location; percent-encode it"));
    }
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(['{', '}']) {
        if rest[at..].starts_with('}') {
            return Err("a `}` without its `{` in the location".into());
        }
        if at > 0 {
            pieces.push(LocationPiece::Text(rest[..at].to_owned()));
        }
        let after = &rest[at + 1..];
        let end = after
            .find('}')
            .ok_or("a `{` without its `}` in the location")?;
        pieces.push(placeholder(&after[..end])?);
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        pieces.push(LocationPiece::Text(rest.to_owned()));
    }
    Ok(pieces)
}

fn placeholder(name: &str) -> Result<LocationPiece, String> {
    PLACEHOLDERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, p)| p.clone())
        .ok_or_else(|| {
            let known: Vec<_> = PLACEHOLDERS
                .iter()
                .map(|(n, _)| format!("{{{n}}}"))
                .collect();
            format!(
                "unknown placeholder `{{{name}}}` in the location; known: {}",
                known.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_usual_redirects_parse() {
        let t = LocationTemplate::parse("https://{host}{uri}").unwrap();
        assert_eq!(
            t.0,
            [
                LocationPiece::Text("https://".into()),
                LocationPiece::Host,
                LocationPiece::Uri,
            ]
        );
        for ok in [
            "{scheme}://{host}:8443{path}?{query}",
            "https://www.example.com{uri}",
            "HTTP://[::1]:8080/",
            "{uri}",
            "/new{path}",
            "/search?q={query}",
        ] {
            assert!(LocationTemplate::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn an_unknown_placeholder_is_named_with_the_known_ones() {
        let e = LocationTemplate::parse("https://{host}{request_uri}").unwrap_err();
        assert!(e.contains("unknown placeholder `{request_uri}`"), "{e}");
        assert!(e.contains("{uri}"), "{e}");
    }

    #[test]
    fn no_request_can_choose_the_host_nor_make_it_protocol_relative() {
        for (bad, why) in [
            ("https://{path}", "needs a host"),
            ("https://{query}.example.com/", "only {host}"),
            ("{scheme}://{uri}", "needs a host"),
            ("https://{host}{query}/", "only {host}"),
            ("{scheme}://{scheme}.example/", "only {host}"),
            ("https://good.example@{host}/", "`@`"),
            ("https:///x", "needs a host"),
            ("//{host}{uri}", "absolute URL"),
            ("/{path}", "absolute URL"),
            ("/\\evil.example", "absolute URL"),
            ("{host}{uri}", "absolute URL"),
            ("ftp://{host}/", "absolute URL"),
            ("https://{host} {uri}", "percent-encode"),
            ("https://{host{uri}", "unknown placeholder"),
            ("https://{host}{uri", "without its `}`"),
        ] {
            let e = LocationTemplate::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
