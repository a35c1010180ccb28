//! A route's path rewrite applied to a request ([`target`]): the one rule both data paths
//! forward by (the hyper path as its `Uri`, the fast path as the target it writes), and that a
//! redirect's `{path}` names.
//!
//! The rewritten path is normalised as a client's is (`sluice_wire::normalize`): runs of `/`
//! merged, so it never starts with `//`; a `.` or `..` segment, an invalid escape or a path
//! that does not start with `/` is refused (500: the rule made it, the client could not have
//! sent it). The query is kept as sent.

use http::uri::{PathAndQuery, Uri};
use sluice_config::Rewrite;
use sluice_wire::normalize::normalize_path;
use sluice_wire::EscapedSlashes;

use crate::error::ProxyError;

/// How much longer than the client's path a rewrite may make it: replacements that repeat
/// cannot grow a request without bound.
const MAX_GROWTH: usize = 8 * 1024;

/// The target the upstream gets for a request whose (normalised) target is `uri`, when `rule`
/// rewrites its path; `None` when there is no rule or it leaves the path as it is.
/// `escaped`: the listener's `escaped_slashes`, which the result is normalised by.
pub fn target(
    rule: Option<&Rewrite>,
    uri: &Uri,
    escaped: EscapedSlashes,
) -> Result<Option<PathAndQuery>, ProxyError> {
    let path = uri.path();
    let rewritten = match rule {
        None => return Ok(None),
        Some(Rewrite::Prefix {
            prefix,
            replace,
            case_insensitive,
        }) => prefix_end(path, prefix, *case_insensitive).map(|end| {
            let mut out = String::with_capacity(replace.len() + path.len() - end);
            out.push_str(replace);
            out.push_str(&path[end..]);
            out
        }),
        Some(Rewrite::Regex { regex, replace }) => replace_all(&regex.0, path, replace)?,
    };
    match rewritten {
        Some(new) if new != path => origin_form(new, uri.query(), escaped).map(Some),
        _ => Ok(None),
    }
}

/// Where the part of `path` that `prefix` covers ends, compared as routes compare their
/// `path_prefix` (`sluice_wire::normalize::match_path`): a segment's `;params` are skipped,
/// also those of the last segment the prefix covers, and ASCII case is ignored when
/// `case_insensitive`.
fn prefix_end(path: &str, prefix: &str, case_insensitive: bool) -> Option<usize> {
    let (bytes, want) = (path.as_bytes(), prefix.as_bytes());
    let (mut i, mut j) = (0, 0);
    loop {
        if bytes.get(i) == Some(&b';') {
            i += bytes[i..]
                .iter()
                .position(|&b| b == b'/')
                .unwrap_or(bytes.len() - i);
            continue;
        }
        let Some(&w) = want.get(j) else {
            return Some(i);
        };
        let b = *bytes.get(i)?;
        let same = b == w || (case_insensitive && b.eq_ignore_ascii_case(&w));
        if !same {
            return None;
        }
        (i, j) = (i + 1, j + 1);
    }
}

/// `path` with every match of `regex` replaced by `replace` expanded with the match's groups;
/// `None` when nothing matches.
fn replace_all(
    regex: &regex::Regex,
    path: &str,
    replace: &str,
) -> Result<Option<String>, ProxyError> {
    let (mut out, mut last, mut matched) = (String::new(), 0, false);
    for groups in regex.captures_iter(path) {
        let Some(whole) = groups.get(0) else { continue };
        out.push_str(&path[last..whole.start()]);
        groups.expand(replace, &mut out);
        if out.len() > path.len() + MAX_GROWTH {
            return Err(ProxyError::Rewrite("the rewritten path is too long"));
        }
        (last, matched) = (whole.end(), true);
    }
    if !matched {
        return Ok(None);
    }
    out.push_str(&path[last..]);
    Ok(Some(out))
}

/// The rewritten `path`, normalised, with the request's `query`: an origin-form target.
fn origin_form(
    path: String,
    query: Option<&str>,
    escaped: EscapedSlashes,
) -> Result<PathAndQuery, ProxyError> {
    if !path.starts_with('/') {
        return Err(ProxyError::Rewrite(
            "the rewritten path does not start with /",
        ));
    }
    let path = match normalize_path(&path, escaped) {
        Ok(Some(normal)) => normal,
        Ok(None) => path,
        Err(e) => return Err(ProxyError::Rewrite(e.0)),
    };
    let target = match query {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    PathAndQuery::try_from(target).map_err(|_| ProxyError::Rewrite("invalid rewritten path"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn run(rule: &Rewrite, target: &str) -> Result<Option<String>, ProxyError> {
        let uri = Uri::try_from(target).unwrap();
        super::target(Some(rule), &uri, EscapedSlashes::Reject).map(|t| t.map(|t| t.to_string()))
    }

    fn prefix(prefix: &str, replace: &str) -> Rewrite {
        Rewrite::prefix(prefix, replace, false).unwrap()
    }

    #[test]
    fn a_prefix_is_replaced_and_the_query_kept() {
        let strip = prefix("/api/", "/");
        assert_eq!(
            run(&strip, "/api/users?id=1").unwrap().unwrap(),
            "/users?id=1"
        );
        assert_eq!(run(&strip, "/api/").unwrap().unwrap(), "/");
        assert_eq!(run(&strip, "/other/api/x").unwrap(), None);
        let v2 = prefix("/v1", "/v2");
        assert_eq!(run(&v2, "/v1/a").unwrap().unwrap(), "/v2/a");
    }

    #[test]
    fn a_prefix_is_compared_as_routes_compare_it() {
        let strip = prefix("/api/", "/");
        assert_eq!(run(&strip, "/api;v=1/users").unwrap().unwrap(), "/users");
        assert_eq!(
            run(&prefix("/api", "/"), "/api;v=1/x").unwrap().unwrap(),
            "/x"
        );
        assert_eq!(run(&strip, "/API/users").unwrap(), None);
        let any_case = Rewrite::prefix("/api/", "/", true).unwrap();
        assert_eq!(run(&any_case, "/API/users").unwrap().unwrap(), "/users");
    }

    #[test]
    fn a_regex_replaces_every_match_with_its_groups() {
        let rule = Rewrite::regex("^/u/(?P<id>[0-9]+)(/.*)?$", "/users/${id}$2").unwrap();
        assert_eq!(
            run(&rule, "/u/42/posts?x=y").unwrap().unwrap(),
            "/users/42/posts?x=y"
        );
        let all = Rewrite::regex("old", "new").unwrap();
        assert_eq!(run(&all, "/old/x/old").unwrap().unwrap(), "/new/x/new");
        assert_eq!(run(&all, "/else").unwrap(), None);
    }

    #[test]
    fn what_a_rewrite_makes_is_a_normal_path_or_refused() {
        // Slashes merge: never `//host` upstream.
        let doubled = Rewrite::regex("^/r/(.*)$", "/$1").unwrap();
        assert_eq!(
            run(&doubled, "/r//evil.com/x").unwrap().unwrap(),
            "/evil.com/x"
        );
        // An escape the listener refuses is refused in what a rewrite makes too.
        assert!(run(&doubled, "/r/%2f%2fevil.com").is_err());
        // A dot segment made of two harmless ones.
        let glue = Rewrite::regex("^/p/([^/]*)x([^/]*)$", "/$1$2").unwrap();
        let e = run(&glue, "/p/.x.").unwrap_err();
        assert_eq!(e.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        let relative = Rewrite::regex("^/", "").unwrap();
        assert!(run(&relative, "/x").is_err());
    }

    #[test]
    fn a_rewrite_cannot_grow_a_path_without_bound() {
        let rule =
            Rewrite::regex("a", "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").unwrap();
        let path = format!("/{}", "a".repeat(4096));
        assert!(run(&rule, &path).is_err());
    }
}
