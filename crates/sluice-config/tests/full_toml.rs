//! `examples/configs/full.toml` names every key the configuration accepts, and loads.
//!
//! The keys are the configuration model's own: for each table, a document with an unknown key
//! in it is refused (the model is strict), and the refusal lists the keys that table accepts.
//! A key added to the model but not to full.toml fails this test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

fn full_toml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs/full.toml")
}

/// Every table with fixed keys, as a dotted path (`cluster` for any `[cluster.<name>]`), and a
/// document that puts an unknown key first in it.
const TABLES: &[(&str, &str)] = &[
    ("", "zz_probe = 1"),
    ("runtime", "[runtime]\nzz_probe = 1"),
    ("dns", "[dns]\nzz_probe = 1"),
    ("acceptor", "[acceptor]\nzz_probe = 1"),
    ("acceptor.tls", "[acceptor]\ntls = { zz_probe = 1 }"),
    ("handoff", "[handoff]\nzz_probe = 1"),
    ("admin", "[admin]\nzz_probe = 1"),
    ("access_log", "[access_log]\nzz_probe = 1"),
    ("listener", "[[listener]]\nzz_probe = 1"),
    ("listener.tls", "[[listener]]\ntls = { zz_probe = 1 }"),
    ("route", "[[route]]\nzz_probe = 1"),
    (
        "route.direct_response",
        "[[route]]\ndirect_response = { zz_probe = 1 }",
    ),
    ("route.rewrite", "[[route]]\nrewrite = { zz_probe = 1 }"),
    (
        "route.request_headers",
        "[[route]]\nrequest_headers = { zz_probe = 1 }",
    ),
    (
        "route.response_headers",
        "[[route]]\nresponse_headers = { zz_probe = 1 }",
    ),
    (
        "route.compression",
        "[[route]]\ncompression = { zz_probe = 1 }",
    ),
    (
        "route.compression.level",
        "[[route]]\ncompression = { level = { zz_probe = 1 } }",
    ),
    ("cluster", "[cluster.c]\nzz_probe = 1"),
    ("cluster.pool", "[cluster.c]\npool = { zz_probe = 1 }"),
    (
        "cluster.ejection",
        "[cluster.c]\nejection = { zz_probe = 1 }",
    ),
    (
        "cluster.health_check",
        "[cluster.c]\nhealth_check = { zz_probe = 1 }",
    ),
    ("cluster.tls", "[cluster.c]\ntls = { zz_probe = 1 }"),
    ("cluster.retry", "[cluster.c]\nretry = { zz_probe = 1 }"),
    ("cluster.h2", "[cluster.c]\nh2 = { zz_probe = 1 }"),
    ("cluster.resolve", "[cluster.c]\nresolve = { zz_probe = 1 }"),
    ("relay", "[[relay]]\nzz_probe = 1"),
    ("rate_limit_service", "[rate_limit_service.s]\nzz_probe = 1"),
    (
        "route.global_rate_limit",
        "[[route]]\nglobal_rate_limit = { zz_probe = 1 }",
    ),
    (
        "route.global_rate_limit.descriptors",
        "[[route]]\nglobal_rate_limit = { descriptors = [[{ zz_probe = 1 }]] }",
    ),
];

/// The keys `table` accepts, from the model's refusal of an unknown one: "unknown field
/// `zz_probe`, expected one of `a`, `b`" (or "expected `a` or `b`").
fn accepted_keys(table: &str, probe: &str) -> Vec<String> {
    let err = sluice_config::parse_str(probe, "probe.toml", Path::new("."))
        .err()
        .unwrap_or_else(|| panic!("[{table}] took an unknown key"))
        .to_string();
    let (_, expected) = err
        .split_once("unknown field `zz_probe`, expected ")
        .unwrap_or_else(|| panic!("[{table}]: not an unknown-key error: {err}"));
    let expected = expected.split(';').next().unwrap_or_default();
    let keys: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!keys.is_empty(), "[{table}]: no keys in {err}");
    keys
}

/// The table a header line opens (commented out or not), as a dotted path with cluster and
/// service names dropped: `[[listener]]` → `listener`, `# [cluster.api.pool]` →
/// `cluster.pool`, `[rate_limit_service.fleet]` → `rate_limit_service`.
fn header_path(line: &str) -> Option<String> {
    let line = line.trim_start_matches('#').trim();
    let inner = line.strip_prefix('[')?.split(']').next()?;
    let inner = inner.trim_start_matches('[');
    let mut parts: Vec<&str> = inner.split('.').collect();
    let named = ["cluster", "rate_limit_service"];
    if parts.first().is_some_and(|p| named.contains(p)) && parts.len() >= 2 {
        parts.remove(1);
    }
    Some(parts.join("."))
}

/// full.toml split by table: (path, text), the text before the first header under "".
fn sections(text: &str) -> Vec<(String, String)> {
    let mut out = vec![(String::new(), String::new())];
    for line in text.lines() {
        match header_path(line) {
            Some(path) => out.push((path, String::new())),
            None => {
                let last = out.last_mut().unwrap();
                last.1.push_str(line);
                last.1.push('\n');
            }
        }
    }
    out
}

/// Whether `text` assigns `key` (`key = ...`, maybe commented out or inside `{ }`).
fn assigns(text: &str, key: &str) -> bool {
    text.match_indices(key).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + key.len()..].trim_start();
        before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '"'))
            && after.starts_with('=')
    })
}

#[test]
fn full_toml_names_every_key_the_model_accepts() {
    let text = std::fs::read_to_string(full_toml()).unwrap();
    let sections = sections(&text);
    let mut missing = Vec::new();
    for (table, probe) in TABLES {
        for key in accepted_keys(table, probe) {
            let found = if table.is_empty() {
                sections
                    .iter()
                    .any(|(path, _)| path.split('.').next() == Some(&key))
            } else {
                // A key shows in its table's section, or inline in an enclosing one, or as
                // a table of its own (`[acceptor.clients]`).
                let own = format!("{table}.{key}");
                sections.iter().any(|(path, body)| {
                    *path == own
                        || (table == path || table.starts_with(&format!("{path}.")))
                            && assigns(body, &key)
                })
            };
            if !found {
                missing.push(format!("[{table}] {key}"));
            }
        }
    }
    assert!(missing.is_empty(), "full.toml does not show: {missing:?}");
}

#[test]
fn the_key_check_sees_a_key_full_toml_lacks() {
    let text = "[cluster.c]\nkind = \"static\"\n";
    let sections = sections(text);
    assert!(sections
        .iter()
        .any(|(p, b)| p == "cluster" && assigns(b, "kind")));
    assert!(!sections
        .iter()
        .any(|(p, b)| p == "cluster" && assigns(b, "queue_max")));
    assert!(!assigns("max_queue_max = 1", "queue_max"));
}

#[test]
fn full_toml_loads() {
    std::env::set_var("SLUICE_EXAMPLE_AUTH", "Bearer example");
    std::env::set_var("SLUICE_EXAMPLE_API_TOKEN", "example-api-token");
    std::env::set_var("SLUICE_EXAMPLE_ADMIN_TOKEN", "example-admin-token");
    let config = sluice_config::load_file(&full_toml()).unwrap_or_else(|e| panic!("{e}"));
    assert!(config.acceptor.is_some());
    assert!(matches!(
        config.clusters["jobs"].kind,
        sluice_config::ClusterKind::Reverse(_)
    ));
    // Names that follow DNS are kept as names, never looked up by the loader.
    let sluice_config::ClusterKind::Static(k8s) = &config.clusters["k8s"].kind else {
        panic!("k8s is static")
    };
    assert_eq!(
        k8s.names[0].to_string(),
        "api.default.svc.cluster.local:8080"
    );
    assert!(k8s.endpoints.is_empty());
    let resolve = k8s.options.resolve.unwrap();
    assert_eq!(resolve.max_ttl, std::time::Duration::from_secs(300));
    assert_eq!(
        config.dns,
        sluice_config::Dns::default(),
        "[dns] is commented out"
    );
    let [edge, core] = &config.relays[..] else {
        panic!("two relays: {:?}", config.relays)
    };
    let sluice_config::RelayRole::Forward(edge) = &edge.role else {
        panic!("edge forwards")
    };
    assert_eq!(edge.pool, 16);
    let to = sluice_config::NextHop::Addrs(vec!["127.0.0.1:7100".parse().unwrap()]);
    assert_eq!(edge.to, to);
    assert_eq!(edge.tunnel.as_ref().unwrap().token.0, b"example-api-token");
    let sluice_config::RelayRole::Tunnel(core) = &core.role else {
        panic!("core is a tunnel end")
    };
    let v6 = sluice_config::AllowedTarget {
        net: "::1/128".parse().unwrap(),
        port: 8000,
    };
    assert_eq!(core.allow[1], v6);
    assert_eq!(core.preamble_timeout, std::time::Duration::from_secs(2));
    assert_eq!(core.max_unauthenticated, 1024);
}

#[test]
fn a_relay_needs_no_http_listener() {
    let text = "[[relay]]\nname = \"r\"\nlisten = \"127.0.0.1:0\"\nto = \"127.0.0.1:1\"\n";
    let config = sluice_config::parse_str(text, "t", Path::new(".")).unwrap();
    assert!(config.listeners.is_empty());
    assert_eq!(config.relays[0].options.idle_timeout.as_secs(), 300);
}

#[test]
fn a_relays_next_hop_by_name_with_resolve_is_followed_not_looked_up_by_the_loader() {
    let text = "[dns]\nnameservers = [\"127.0.0.1:5353\"]\n\
                [[relay]]\nname = \"r\"\nlisten = \"127.0.0.1:0\"\n\
                to = \"core.relay.internal:7100\"\nresolve = true\n";
    let config = sluice_config::parse_str(text, "r.toml", std::path::Path::new(".")).unwrap();
    let sluice_config::RelayRole::Forward(edge) = &config.relays[0].role else {
        panic!("forwards")
    };
    let sluice_config::NextHop::Follow { name, resolve, dns } = &edge.to else {
        panic!("followed: {:?}", edge.to)
    };
    assert_eq!(name.to_string(), "core.relay.internal:7100");
    assert_eq!(*resolve, sluice_config::Resolve::default());
    assert_eq!(dns.nameservers, ["127.0.0.1:5353".parse().unwrap()]);
}

#[test]
fn a_relays_sockmap_is_off_unless_asked_for() {
    let text = "[[relay]]\nname = \"r\"\nlisten = \"127.0.0.1:0\"\nto = \"127.0.0.1:1\"\n";
    let config = sluice_config::parse_str(text, "t", Path::new(".")).unwrap();
    assert!(!config.relays[0].options.sockmap);
    let on = format!("{text}sockmap = true\n");
    let config = sluice_config::parse_str(&on, "t", Path::new(".")).unwrap();
    assert!(config.relays[0].options.sockmap);
}
