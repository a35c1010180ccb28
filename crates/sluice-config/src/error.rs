//! [`ConfigError`] and the byte-offset → line:column conversion behind its positions.

use std::ops::Range;

/// Why a configuration was rejected, and where (`file:line:col`) when the problem has a place.
///
/// Only the first problem found is reported. Messages never contain resolved secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: {message}", fmt_position(.position))]
pub struct ConfigError {
    origin: String,
    position: Option<Position>,
    message: String,
}

/// A 1-based line and column (columns count characters, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    line: usize,
    column: usize,
}

fn fmt_position(position: &Option<Position>) -> String {
    match position {
        Some(p) => format!(":{}:{}", p.line, p.column),
        None => String::new(),
    }
}

impl ConfigError {
    /// An error with no position, e.g. "at least one listener is required".
    pub(crate) fn new(origin: &str, message: impl Into<String>) -> Self {
        Self {
            origin: origin.to_owned(),
            position: None,
            message: message.into(),
        }
    }

    /// An error located at the start of `span` (byte offsets into `text`).
    pub(crate) fn at(
        origin: &str,
        text: &str,
        span: &Range<usize>,
        msg: impl Into<String>,
    ) -> Self {
        let (line, column) = line_col(text, span.start);
        Self {
            position: Some(Position { line, column }),
            ..Self::new(origin, msg)
        }
    }

    /// Converts toml's syntax or deserialization error, keeping its span.
    pub(crate) fn from_toml(origin: &str, text: &str, err: &toml::de::Error) -> Self {
        // toml's messages may span lines ("invalid string\nexpected ..."); keep ours on one.
        let message = err
            .message()
            .trim_end()
            .lines()
            .collect::<Vec<_>>()
            .join("; ");
        match err.span() {
            Some(span) => {
                let message = add_table_context(text, span.start, message);
                Self::at(origin, text, &span, message)
            }
            None => Self::new(origin, message),
        }
    }

    /// Where the configuration came from: a path or `<embedded default>`.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The 1-based line of the problem, if it has a place in the file.
    pub fn line(&self) -> Option<usize> {
        self.position.map(|p| p.line)
    }

    /// The 1-based column (in characters) of the problem, if it has a place in the file.
    pub fn column(&self) -> Option<usize> {
        self.position.map(|p| p.column)
    }

    /// The message alone, without origin or position.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Converts a byte offset into a 1-based (line, column); offsets past the end clamp to it.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// serde's "unknown field `x`" does not say in which table; the nearest `[header]` above does.
fn add_table_context(text: &str, offset: usize, message: String) -> String {
    if message.starts_with("invalid type") || message.starts_with("invalid value") {
        // toml names the key only in its multi-line Display; the value's span says which.
        return match key_of_value(text, offset) {
            Some(key) => format!("`{key}`: {message}"),
            None => message,
        };
    }
    if !message.starts_with("unknown field") {
        return message;
    }
    match enclosing_table(text, offset) {
        Some(header) => format!("{message} (in {header})"),
        None => format!("{message} (at the top level)"),
    }
}

/// The key whose value starts at `offset`: the name before the last `=` on that line before
/// it (`http2 = "yes"`, `tls = { cert = 1 }`).
fn key_of_value(text: &str, offset: usize) -> Option<&str> {
    let before = text.get(..offset.min(text.len()))?;
    let line = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
    let (key, _) = line.rsplit_once('=')?;
    let key = key.trim_end();
    let start = key
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '"')))
        .map_or(0, |i| i + 1);
    let key = key[start..].trim_matches('"');
    (!key.is_empty()).then_some(key)
}

/// The last table header (`[x]` or `[[x]]`) that starts a line before `offset`.
fn enclosing_table(text: &str, offset: usize) -> Option<&str> {
    let before = text.get(..offset.min(text.len()))?;
    let previous_lines = &before[..before.rfind('\n').map_or(0, |i| i + 1)];
    previous_lines
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| line.starts_with('['))
        .map(|line| line.split('#').next().unwrap_or(line).trim_end())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_wrong_type_names_its_key() {
        let text = "[[listener]]\nhttp2 = \"yes\"\ntls = { cert = 1 }\n";
        let at = |needle: &str| text.find(needle).unwrap();
        assert_eq!(key_of_value(text, at("\"yes")), Some("http2"));
        assert_eq!(key_of_value(text, at("1 }")), Some("cert"));
        let message = add_table_context(text, at("\"yes"), "invalid type: string".into());
        assert_eq!(message, "`http2`: invalid type: string");
    }

    #[test]
    fn offsets_become_one_based_line_and_column() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 4), (1, 5));
        assert_eq!(line_col(text, 6), (2, 1));
        // 'é' is two bytes but one column.
        assert_eq!(line_col(text, 9), (2, 3));
        assert_eq!(line_col(text, 999), (3, 1));
    }

    #[test]
    fn display_includes_position_only_when_known() {
        let text = "x\nyz";
        let at = ConfigError::at("f.toml", text, &(3..4), "bad");
        assert_eq!(at.to_string(), "f.toml:2:2: bad");
        assert_eq!((at.line(), at.column()), (Some(2), Some(2)));
        assert_eq!(ConfigError::new("f.toml", "bad").to_string(), "f.toml: bad");
    }

    #[test]
    fn unknown_fields_name_their_table() {
        let text = "[[listener]]\nbogus = 1\n";
        let offset = text.find("bogus").expect("present");
        let msg = add_table_context(text, offset, "unknown field `bogus`".into());
        assert_eq!(msg, "unknown field `bogus` (in [[listener]])");
    }
}
