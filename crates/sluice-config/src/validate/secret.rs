//! Header values that may name a secret instead of holding it.
//!
//! `"env:NAME"` is the value of environment variable NAME and `"file:PATH"` the contents of
//! PATH (relative to the config file's directory) minus one trailing newline. Any other string
//! is the literal value — so a literal that itself starts with `env:` or `file:` cannot be
//! written; no real header needs one. Resolved values are marked sensitive, which makes
//! `Debug` print `Sensitive` instead of the secret, and no error message quotes them.

use http::HeaderValue;
use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::values::{HeaderTable, Name};

/// Resolves every value of a header table, keeping file order.
pub(super) fn resolve_table(
    ctx: Ctx<'_>,
    table: HeaderTable<Spanned<String>>,
) -> Result<Vec<(http::HeaderName, HeaderValue)>, ConfigError> {
    table
        .0
        .into_iter()
        .map(|(Name(name), value)| Ok((name, resolve(ctx, &value)?)))
        .collect()
}

/// Resolves one value: a secret reference, or a literal.
pub(super) fn resolve(ctx: Ctx<'_>, value: &Spanned<String>) -> Result<HeaderValue, ConfigError> {
    let text = value.get_ref();
    if !ctx.read_secrets {
        if let Some(placeholder) = placeholder(text).map_err(|msg| ctx.err(value.span(), msg))? {
            return Ok(placeholder);
        }
    }
    let secret = if let Some(var) = text.strip_prefix("env:") {
        from_env(var).map_err(|msg| ctx.err(value.span(), msg))?
    } else if let Some(path) = text.strip_prefix("file:") {
        from_file(ctx, path).map_err(|msg| ctx.err(value.span(), msg))?
    } else {
        return HeaderValue::from_str(text).map_err(|_| {
            let msg = format!("invalid header value {text:?} (control characters are not allowed)");
            ctx.err(value.span(), msg)
        });
    };
    let mut header = HeaderValue::from_bytes(&secret).map_err(|_| {
        let msg = format!(
            "the value of `{text}` is not a valid header value (control characters or newlines?)"
        );
        ctx.err(value.span(), msg)
    })?;
    header.set_sensitive(true);
    Ok(header)
}

/// What a secret reference stands for when secrets are not read: the reference's own text
/// (not empty, a valid header value, so the checks after it pass as for a real secret), once
/// its form is checked. `None`: `text` is a literal.
fn placeholder(text: &str) -> Result<Option<HeaderValue>, String> {
    let (kind, what) = if let Some(var) = text.strip_prefix("env:") {
        ("env", var)
    } else if let Some(path) = text.strip_prefix("file:") {
        ("file", path)
    } else {
        return Ok(None);
    };
    if what.is_empty() {
        let thing = if kind == "env" { "variable" } else { "file" };
        return Err(format!("`{kind}:` names no {thing}"));
    }
    if kind == "env" && what.contains(['=', '\0']) {
        return Err(format!("`{text}` is not an environment variable's name"));
    }
    let mut value =
        HeaderValue::from_str(text).map_err(|_| format!("`{text}` holds control characters"))?;
    value.set_sensitive(true);
    Ok(Some(value))
}

fn from_env(var: &str) -> Result<Vec<u8>, String> {
    match std::env::var_os(var) {
        Some(v) => Ok(v.into_encoded_bytes()),
        None => Err(format!(
            "environment variable `{var}` is not set (referenced as `env:{var}`)"
        )),
    }
}

fn from_file(ctx: Ctx<'_>, path: &str) -> Result<Vec<u8>, String> {
    let resolved = ctx.resolve(path);
    let mut bytes = std::fs::read(&resolved)
        .map_err(|e| format!("cannot read secret file {}: {e}", resolved.display()))?;
    // Editors add a final newline; a header value never wants one.
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ctx<'a>(text: &'a str, dir: &'a Path) -> Ctx<'a> {
        Ctx {
            text,
            origin: "test.toml",
            base_dir: dir,
            read_secrets: true,
        }
    }

    fn spanned(text: &str) -> Spanned<String> {
        Spanned::new(0..text.len(), text.to_owned())
    }

    #[test]
    fn env_reference_is_resolved_and_sensitive() {
        // A name no other test uses: tests run in parallel threads sharing the environment.
        std::env::set_var("SLUICE_SECRET_TEST_SET", "Bearer s3cr3t");
        let v = resolve(
            ctx("", Path::new(".")),
            &spanned("env:SLUICE_SECRET_TEST_SET"),
        );
        let v = v.expect("variable is set");
        assert_eq!(v, "Bearer s3cr3t");
        assert!(v.is_sensitive());
        assert!(!format!("{v:?}").contains("s3cr3t"));
    }

    #[test]
    fn unset_env_reference_names_the_variable() {
        let text = "x = \"env:SLUICE_SECRET_TEST_UNSET\"";
        let value = Spanned::new(4..text.len(), "env:SLUICE_SECRET_TEST_UNSET".to_owned());
        let err = resolve(ctx(text, Path::new(".")), &value).expect_err("unset");
        assert!(
            err.message()
                .contains("`SLUICE_SECRET_TEST_UNSET` is not set"),
            "{err}"
        );
        assert_eq!((err.line(), err.column()), (Some(1), Some(5)));
    }

    #[test]
    fn file_reference_loses_one_trailing_newline() {
        let dir = tempfile::tempdir().expect("temp dir");
        let read = |contents: &str| {
            std::fs::write(dir.path().join("token"), contents).expect("write");
            resolve(ctx("", dir.path()), &spanned("file:token"))
        };
        assert_eq!(read("abc\n").expect("readable"), "abc");
        assert_eq!(read("abc\r\n").expect("readable"), "abc");
        assert!(read("abc\n").expect("readable").is_sensitive());
        // Only one newline goes; what remains is not a valid value, and the error hides it.
        let err = read("abc\n\n").expect_err("embedded newline");
        assert!(!err.to_string().contains("abc"), "{err}");
    }

    /// Not reading secrets, a reference needs no variable or file, only a valid form.
    #[test]
    fn unread_references_are_checked_for_form_only() {
        let shape = |text: &str| {
            let ctx = Ctx {
                read_secrets: false,
                ..ctx("", Path::new("/nonexistent"))
            };
            resolve(ctx, &spanned(text))
        };
        let unset = shape("env:SLUICE_SECRET_TEST_NEVER_SET").expect("form only");
        assert!(unset.is_sensitive() && !unset.is_empty());
        assert!(shape("file:missing/token").is_ok());
        assert_eq!(shape("literal").expect("literal"), "literal");
        for (bad, why) in [("env:", "names no variable"), ("file:", "names no file")] {
            let err = shape(bad).expect_err(bad);
            assert!(err.message().contains(why), "{err}");
        }
    }

    #[test]
    fn literal_values_are_not_sensitive() {
        let v = resolve(ctx("", Path::new(".")), &spanned("sluice")).expect("valid");
        assert_eq!(v, "sluice");
        assert!(!v.is_sensitive());
    }
}
