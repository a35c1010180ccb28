//! A route's path rewrite (`rewrite = { prefix, replace }` or `{ regex, replace }`), checked
//! here as far as a rule alone can be; the proxy's core (`sluice_core::rewrite`) applies it
//! and checks what it made of each request.

use sluice_wire::normalize::normalize_path;
use sluice_wire::EscapedSlashes;

/// How a route rewrites the path it forwards (NGINX's `proxy_pass` with a URI, Caddy's
/// `uri strip_prefix`/`path_regexp`, Envoy's `prefix_rewrite`/`regex_rewrite`). The query is
/// kept; routes match the path as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub enum Rewrite {
    /// A path that starts with `prefix` gets `replace` in its place; any other path is
    /// forwarded as it is. The prefix is compared as routes compare `path_prefix`: without
    /// the `;params` of a segment, and without regard to ASCII case on a `case_insensitive`
    /// route.
    Prefix {
        /// What is replaced; starts with `/`.
        prefix: String,
        /// What replaces it; starts with `/`.
        replace: String,
        /// Compare without regard to ASCII case (the route's `case_insensitive`).
        case_insensitive: bool,
    },
    /// Every match of `regex` in the path is replaced by `replace`, in which `$1`, `${1}` and
    /// `${name}` stand for the match's groups and `$$` for a `$`.
    Regex {
        /// The pattern.
        regex: PathRegex,
        /// The replacement; every group it names exists.
        replace: String,
    },
}

/// A compiled pattern, equal to another of the same text (so a reload sees a change).
#[derive(Debug, Clone)]
pub struct PathRegex(pub regex::Regex);

impl PartialEq for PathRegex {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Rewrite {
    /// A prefix rewrite; the error says what is wrong with `prefix` or `replace` (which).
    pub fn prefix(prefix: &str, replace: &str, case_insensitive: bool) -> Result<Self, BadRewrite> {
        if !prefix.starts_with('/') || prefix.contains(['?', '#', ';']) {
            return Err(BadRewrite::Prefix(
                "a rewrite's prefix starts with \"/\" and has no `?`, `#` or `;`".into(),
            ));
        }
        if !replace.starts_with('/') {
            return Err(BadRewrite::Replace(
                "a prefix rewrite's replace starts with \"/\"".into(),
            ));
        }
        path_text(replace).map_err(BadRewrite::Replace)?;
        Ok(Self::Prefix {
            prefix: prefix.to_owned(),
            replace: replace.to_owned(),
            case_insensitive,
        })
    }

    /// A regex rewrite; the error says what is wrong with `pattern` or `replace` (which).
    pub fn regex(pattern: &str, replace: &str) -> Result<Self, BadRewrite> {
        let regex = regex::Regex::new(pattern)
            .map_err(|e| BadRewrite::Pattern(format!("invalid rewrite regex: {e}")))?;
        let sample = groups(&regex, replace).map_err(BadRewrite::Replace)?;
        path_text(&sample).map_err(BadRewrite::Replace)?;
        Ok(Self::Regex {
            regex: PathRegex(regex),
            replace: replace.to_owned(),
        })
    }
}

/// What is wrong with a rewrite, by the key at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadRewrite {
    /// `prefix`.
    Prefix(String),
    /// `regex`.
    Pattern(String),
    /// `replace`.
    Replace(String),
}

/// Checks that every group `replace` names is one of `regex`'s, as `regex`'s own expansion
/// reads names (`$name` is the longest run of letters, digits and `_`, so `$1a` names `1a`),
/// and that every `$` starts a name or is `$$`. Returns the replacement with each group as
/// `x`, for the checks of its text.
fn groups(regex: &regex::Regex, replace: &str) -> Result<String, String> {
    let mut literal = String::new();
    let mut rest = replace;
    while let Some(at) = rest.find('$') {
        literal.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            literal.push('$');
            rest = tail;
            continue;
        }
        let (name, tail) = group_name(after).ok_or_else(|| {
            "a `$` in replace names no group; write `$1`, `${name}`, or `$$` for a `$`".to_owned()
        })?;
        check_group(regex, name)?;
        literal.push('x');
        rest = tail;
    }
    literal.push_str(rest);
    Ok(literal)
}

/// The group name after a `$`, and what follows it.
fn group_name(after: &str) -> Option<(&str, &str)> {
    if let Some(braced) = after.strip_prefix('{') {
        let end = braced.find('}')?;
        return Some((&braced[..end], &braced[end + 1..]));
    }
    let end = after
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(after.len());
    (end > 0).then(|| after.split_at(end))
}

fn check_group(regex: &regex::Regex, name: &str) -> Result<(), String> {
    let known = match name.parse::<usize>() {
        Ok(index) => index < regex.captures_len(),
        Err(_) => regex.capture_names().flatten().any(|n| n == name),
    };
    if known {
        return Ok(());
    }
    let glued = name.starts_with(|c: char| c.is_ascii_digit()) && name.parse::<usize>().is_err();
    let hint = if glued {
        " (`$1a` names group `1a`: write `${1}a`)"
    } else {
        ""
    };
    Err(format!(
        "replace names group `{name}`, which the regex does not have{hint}"
    ))
}

/// The literal text of a replacement may hold what a path may (RFC 3986 `pchar`s, `/` and
/// `%` escapes), and no `.` or `..` segment.
fn path_text(text: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/%".contains(c);
    if let Some(c) = text.chars().find(|c| !allowed(*c)) {
        return Err(format!(
            "`{c}` cannot be in a rewritten path (the query is kept as sent; percent-encode \
             other characters)"
        ));
    }
    normalize_path(text, EscapedSlashes::Keep)
        .map(drop)
        .map_err(|e| format!("replace makes an invalid path: {e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn replace_error(pattern: &str, replace: &str) -> String {
        match Rewrite::regex(pattern, replace) {
            Err(BadRewrite::Replace(e)) => e,
            other => panic!("{pattern} → {replace}: {other:?}"),
        }
    }

    #[test]
    fn groups_are_named_by_index_or_name() {
        assert!(Rewrite::regex("^/u/(\\d+)/(?P<rest>.*)$", "/users/$1/${rest}/${1}x$$").is_ok());
    }

    #[test]
    fn a_missing_or_glued_group_is_refused_with_a_hint() {
        assert!(replace_error("^/(a)$", "/$2").contains("group `2`"));
        assert!(replace_error("^/(a)$", "/$1a").contains("write `${1}a`"));
        assert!(replace_error("^/(a)$", "/${nope}").contains("group `nope`"));
        assert!(replace_error("^/(a)$", "/cost$").contains("`$$`"));
    }

    #[test]
    fn the_literal_text_must_be_a_path() {
        assert!(replace_error("^/a", "/b?x=1").contains("`?`"));
        assert!(replace_error("^/a", "/b/../c").contains("dot-segments"));
        assert!(Rewrite::regex("^/(a)/(b)$", "/$1/.$2").is_ok());
        assert!(matches!(
            Rewrite::prefix("/api/", "v2/", false),
            Err(BadRewrite::Replace(_))
        ));
        assert!(matches!(
            Rewrite::prefix("api/", "/", false),
            Err(BadRewrite::Prefix(_))
        ));
    }

    #[test]
    fn a_bad_pattern_is_the_patterns_fault() {
        assert!(matches!(
            Rewrite::regex("(", "/"),
            Err(BadRewrite::Pattern(_))
        ));
    }
}
