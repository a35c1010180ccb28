//! Sluice's configuration: a TOML file turned into the validated runtime [`Config`].
//!
//! Loading happens in two stages. First the text is deserialized into a raw serde model that
//! mirrors the TOML and is strict about it: unknown keys are errors, and values that can be
//! checked alone (durations, sizes, addresses, CIDRs, methods, header names, status codes) are
//! checked as they are read, so toml's error carries their position. Then `validate` turns the
//! raw model into [`model::Config`]: it checks what needs the whole file (unique names, route →
//! cluster references), fills in defaults, resolves endpoint host names, reads TLS files and
//! resolves `env:`/`file:` secrets. Every error is a [`ConfigError`] that reads
//! `file:line:col: message`, so `sluice check -c FILE` can point at the offending value.
//!
//! # Layout
//! * [`model`] — the validated runtime types the engine consumes.
//! * `raw` — the serde mirror of the file; `values` — its self-checking scalar types.
//! * `validate` — raw → model (`cluster`, `route`, `secret`, `tls` submodules).
//! * `error` — [`ConfigError`] and span → line:col.
//! * [`admin`] — the admin API's replies, shared by the proxy and `sluice ctl`.

pub mod admin;
mod error;
pub mod model;
mod raw;
mod validate;
mod values;

use std::path::Path;

pub use error::ConfigError;
pub use model::*;
pub use values::{parse_cidr, parse_method, resolve_endpoint};

/// A configuration that works with nothing else running: a plaintext listener named `default`
/// on 127.0.0.1:8080 that answers `/healthz` and explains itself on every other path.
pub const EMBEDDED_DEFAULT: &str = r#"# Sluice's embedded default configuration (used when no -c FILE is given).

[[listener]]
name = "default"
listen = "127.0.0.1:8080"

[[route]]
name = "healthz"
path_prefix = "/healthz"
direct_response = { status = 200, body = "ok\n", headers = { "content-type" = "text/plain" } }

# Any other request: say what this is and how to configure it.
[[route]]
name = "welcome"

[route.direct_response]
status = 200
headers = { "content-type" = "text/plain; charset=utf-8" }
body = """
Sluice is running on its embedded default config.
Pass -c FILE to proxy to your own backends (see examples/configs/ for samples).
"""
"#;

/// The name [`embedded_default`] reports as the configuration's source.
pub const EMBEDDED_DEFAULT_SOURCE: &str = "<embedded default>";

/// Reads and validates the file at `path`; relative paths inside it (TLS files, `file:`
/// secrets) are resolved against the file's directory. Errors start with `path`.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    load(path, true)
}

/// [`load_file`] without reading secrets: each `env:NAME` or `file:PATH` reference is checked
/// for its form only and stands for a placeholder value, so that the file's shape can be
/// validated where its secrets are not (CI; `sluice check --no-secrets`). Files that are not
/// `file:` secrets (TLS certificates and keys, `htpasswd` files) are still read. The result
/// is for checking only: its secrets are placeholders.
pub fn load_file_without_secrets(path: &Path) -> Result<Config, ConfigError> {
    load(path, false)
}

fn load(path: &Path, read_secrets: bool) -> Result<Config, ConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(&origin, format!("cannot read configuration: {e}")))?;
    let base_dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    parse(&text, &origin, base_dir, read_secrets)
}

/// Parses and validates `text`; `source` names it in errors and `base_dir` anchors relative
/// paths.
pub fn parse_str(text: &str, source: &str, base_dir: &Path) -> Result<Config, ConfigError> {
    parse(text, source, base_dir, true)
}

fn parse(
    text: &str,
    source: &str,
    base_dir: &Path,
    read_secrets: bool,
) -> Result<Config, ConfigError> {
    let raw: raw::RawConfig =
        toml::from_str(text).map_err(|e| ConfigError::from_toml(source, text, &e))?;
    let ctx = validate::Ctx {
        text,
        origin: source,
        base_dir,
        read_secrets,
    };
    validate::validate(ctx, raw)
}

/// The parsed [`EMBEDDED_DEFAULT`], with source `<embedded default>`.
///
/// # Panics
/// Never in a released build: a unit test proves the embedded text is valid.
pub fn embedded_default() -> Config {
    parse_str(EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_SOURCE, Path::new("."))
        .expect("the embedded default configuration is valid")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A server bound in code (`Server::bind`, `HttpOptions::default`) speaks HTTP as a
    /// configured listener that says nothing of `http`.
    #[test]
    fn a_listener_without_http_settings_has_the_transports_defaults() {
        let text = "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\n\
                    [[route]]\ndirect_response = { status = 204 }\n";
        let config = parse_str(text, "t.toml", std::path::Path::new(".")).expect("parses");
        assert_eq!(config.listeners[0].http, crate::HttpOptions::default());
    }

    use std::net::SocketAddr;

    #[test]
    fn embedded_default_parses() {
        let config = embedded_default();
        assert_eq!(config.source, "<embedded default>");
        assert_eq!(config.listeners.len(), 1);
        assert_eq!(config.listeners[0].name, "default");
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(config.listeners[0].addr, addr);
        assert!(config.listeners[0].tls.is_empty());
        let Action::Direct(health) = &config.routes[0].action else {
            panic!("healthz is a direct response")
        };
        assert_eq!(
            (health.status.as_u16(), health.body.as_str()),
            (200, "ok\n")
        );
        let Action::Direct(welcome) = &config.routes[1].action else {
            panic!("the catch-all is a direct response")
        };
        assert!(welcome.body.contains("-c FILE"));
        assert_eq!(config.routes[1].matcher, Match::default());
    }

    #[test]
    fn defaults_are_filled_in() {
        let text = "[[listener]]\nname = \"a\"\nlisten = \"127.0.0.1:1\"\n\
                    [[route]]\ncluster = \"c\"\n\
                    [cluster.c]\nkind = \"static\"\nendpoints = [\"127.0.0.1:2\"]\n";
        let config = parse_str(text, "t", Path::new(".")).unwrap();
        assert_eq!(config.runtime.shutdown_grace.as_secs(), 30);
        assert_eq!(config.listeners[0].http.max_header_bytes, 16 * 1024);
        assert!(config.listeners[0].http.http2);
        assert_eq!(config.routes[0].name, "route-1");
        let ClusterKind::Static(c) = &config.clusters["c"].kind else {
            panic!("c is static")
        };
        assert_eq!(c.options.lb, LbPolicy::P2c);
        assert_eq!(c.options.pool.max_idle_per_endpoint, 128);
        assert_eq!(c.options.pool.max_requests_per_connection, None);
        assert!(c.options.health_check.is_none());
        assert_eq!(config.routes[0].slice, "default");
        assert!(config.acceptor.is_none());
    }

    #[test]
    fn debug_output_hides_secret_header_values() {
        std::env::set_var("SLUICE_LIB_TEST_SECRET", "hunter2-token");
        let text = "[[listener]]\nname = \"a\"\nlisten = \"127.0.0.1:1\"\n\
                    [[route]]\ndirect_response = { status = 204 }\n\
                    request_headers = { set = { authorization = \"env:SLUICE_LIB_TEST_SECRET\" } }\n";
        let config = parse_str(text, "t", Path::new(".")).unwrap();
        assert_eq!(config.routes[0].request_headers.set[0].1, "hunter2-token");
        assert!(!format!("{config:?}").contains("hunter2"));
        assert!(!format!("{config:#?}").contains("hunter2"));
    }

    #[test]
    fn unreadable_file_error_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.toml");
        let err = load_file(&path).unwrap_err();
        assert!(err.to_string().starts_with(&path.display().to_string()));
        assert_eq!(err.line(), None);
    }
}
