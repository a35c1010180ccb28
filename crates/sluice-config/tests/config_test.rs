//! Every shipped example config must load, and every config under `tests/invalid/` must fail
//! with the message (and position) its header promises:
//!
//! ```toml
//! # expect: <substring of the error message>
//! # at: <line>:<col>            (optional)
//! ```
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use sluice_config::{load_file, Action, ClusterKind, ConfigError, HostMatch};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs")
}

fn invalid_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/invalid")
}

fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    files
}

/// The environment the examples reference (`env:` secrets).
fn set_example_env() {
    std::env::set_var("SLUICE_EXAMPLE_AUTH", "Bearer example");
    std::env::set_var("SLUICE_EXAMPLE_API_TOKEN", "example-api-token");
    std::env::set_var("SLUICE_EXAMPLE_ADMIN_TOKEN", "example-admin-token");
}

#[test]
fn every_example_config_loads() {
    set_example_env();
    let files = toml_files(&examples_dir());
    assert!(
        files.len() >= 3,
        "expected the sample configs, found {files:?}"
    );
    for file in files {
        if let Err(e) = load_file(&file) {
            panic!("example config does not load: {e}");
        }
    }
}

#[test]
fn full_example_reads_tls_and_secrets() {
    set_example_env();
    let config = load_file(&examples_dir().join("full.toml")).unwrap();
    assert_eq!(config.runtime.workers, Some(2));
    let tls = &config.listeners[0].tls[0];
    assert!(tls.cert_pem.starts_with(b"Test-only"));
    assert!(!format!("{tls:?}").contains("PRIVATE KEY"));
    let http3 = config.listeners[0].http3.as_ref().unwrap();
    assert_eq!(http3.addr, Some("127.0.0.1:8443".parse().unwrap()));
    assert_eq!((http3.retry, http3.max_streams), (false, 100));
    assert_eq!(config.listeners[1].http3, None);
    let canary = &config.routes[1];
    assert_eq!(
        canary.matcher.hosts[1],
        HostMatch::Suffix(".api.example.com".into())
    );
    assert_eq!(canary.request_headers.set[1].1, "Bearer example");
    // `file:` secrets lose their trailing newline.
    let api = config.routes.iter().find(|r| r.name == "api").unwrap();
    assert_eq!(api.request_headers.set[0].1, "example-upstream-token");
    let ClusterKind::Static(canary) = &config.clusters["canary"].kind else {
        panic!("canary is static")
    };
    assert_eq!(canary.options.pool.max_idle_per_endpoint, 0);
    assert_eq!(canary.options.pool.max_requests_per_connection, Some(1000));
    let ClusterKind::Static(legacy) = &config.clusters["legacy"].kind else {
        panic!("legacy is static")
    };
    assert_eq!(legacy.options.pool.max_requests_per_connection, None);
}

#[test]
fn host_routing_example_picks_clusters_by_host() {
    let config = load_file(&examples_dir().join("host_routing.toml")).unwrap();
    let clusters: Vec<_> = config
        .routes
        .iter()
        .filter_map(|r| match &r.action {
            Action::Proxy { cluster } => Some(cluster.as_str()),
            Action::Direct(_) => None,
        })
        .collect();
    assert_eq!(clusters, ["api", "web"]);
}

#[test]
fn reverse_example_has_acceptor_slices_and_tokens() {
    set_example_env();
    let config = load_file(&examples_dir().join("reverse.toml")).unwrap();
    let acceptor = config.acceptor.as_ref().unwrap();
    assert_eq!(acceptor.addr.port(), 7070);
    assert_eq!(acceptor.max_handshake_size, 8 * 1024);
    assert_eq!(acceptor.handshakes_per_second, Some(100));
    let slices: Vec<_> = config.routes.iter().map(|r| r.slice.as_str()).collect();
    assert_eq!(slices, ["mobile", "default"]);
    let ClusterKind::Reverse(api) = &config.clusters["api"].kind else {
        panic!("api is a reverse cluster")
    };
    assert_eq!(api.tokens.len(), 2);
    assert_eq!(api.tokens[0].0, b"example-api-token");
    assert!(!format!("{api:?}").contains("example-api-token"));
    assert_eq!(api.options.queue_max, 1024);
    assert_eq!(api.options.max_sessions_per_instance, None);
    assert_eq!(api.options.request_buffer, 64 * 1024);
}

/// The `# expect:` substring and optional `# at:` line:col of an invalid config.
fn expectation(text: &str) -> (String, Option<(usize, usize)>) {
    let mut lines = text.lines();
    let expect = lines.next().and_then(|l| l.strip_prefix("# expect: "));
    let expect = expect.expect("first line is `# expect: <substring>`");
    let at = lines
        .next()
        .and_then(|l| l.strip_prefix("# at: "))
        .map(|at| {
            let (line, col) = at.split_once(':').unwrap();
            (line.trim().parse().unwrap(), col.trim().parse().unwrap())
        });
    (expect.to_owned(), at)
}

/// What is wrong with `err` as the failure of `file`, if anything.
fn check_failure(file: &Path, err: &ConfigError) -> Option<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let (expect, at) = expectation(&text);
    let shown = err.to_string();
    if !shown.starts_with(&file.display().to_string()) {
        return Some(format!("error does not start with the path: {shown}"));
    }
    if !err.message().contains(&expect) {
        return Some(format!(
            "expected message containing {expect:?}, got: {shown}"
        ));
    }
    match at {
        Some((line, col)) if (err.line(), err.column()) != (Some(line), Some(col)) => {
            Some(format!("expected position {line}:{col}, got: {shown}"))
        }
        _ => None,
    }
}

#[test]
fn every_invalid_config_fails_with_its_message() {
    let files = toml_files(&invalid_dir());
    assert!(files.len() >= 15, "expected at least 15 invalid configs");
    let problems: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let problem = match load_file(file) {
                Ok(_) => Some("loaded, but should have failed".to_owned()),
                Err(err) => check_failure(file, &err),
            };
            problem.map(|p| format!("{}: {p}", file.display()))
        })
        .collect();
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

fn handoff_of(keys: &str) -> sluice_config::HandoffServer {
    let text = format!(
        "[acceptor]\nlisten = \"127.0.0.1:7070\"\n[handoff]\nlisten = \"h.sock\"\n{keys}\n[cluster.api]\nkind = \"reverse\"\n"
    );
    let config = sluice_config::parse_str(&text, "h.toml", Path::new("/run/sluice")).unwrap();
    config.handoff.unwrap()
}

/// `mode` and `group` let consumers of other users open the socket; `allowed_uids` adds
/// uids to the acceptor's own (which the handoff listener always allows).
#[test]
fn handoff_takes_a_mode_a_group_and_more_uids() {
    let plain = handoff_of("");
    assert_eq!(plain.path, Path::new("/run/sluice/h.sock"));
    assert_eq!((plain.mode, plain.group), (0o600, None));
    assert!(plain.allowed_uids.is_empty());
    let named = handoff_of("mode = \"0660\"\ngroup = \"root\"\nallowed_uids = [33]");
    assert_eq!((named.mode, named.group), (0o660, Some(0)));
    assert_eq!(named.allowed_uids, [33]);
    let numbered = handoff_of("mode = \"640\"\ngroup = 33");
    assert_eq!((numbered.mode, numbered.group), (0o640, Some(33)));
}
