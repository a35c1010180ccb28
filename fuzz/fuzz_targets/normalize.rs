//! Path and host normalisation on any input: never a panic; a normalised path has no `//`, no
//! `.`/`..` segment — also none once a segment's `;` parameters are removed, as Tomcat, Jetty
//! and Spring remove them, and no segment that is empty without them — no escaped unreserved
//! character, no raw `\` unless the rule keeps escaped slashes, and normalising it again
//! changes nothing; the path routes match (`match_path`) has no `;` and the same segments; a
//! normalised host is lowercase, has no trailing dot, and is a fixed point too.
//!
//! Differentially against the `http` crate, the parser hyper hands Sluice its requests with:
//! every host Sluice accepts is an authority `http` accepts, naming the same host and port, and
//! every normalised path is a path `http` accepts unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::normalize::{match_path, normal_authority, normalize_path};
use sluice_wire::EscapedSlashes;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for rule in [
        EscapedSlashes::Reject,
        EscapedSlashes::Keep,
        EscapedSlashes::Unescape,
    ] {
        check_path(&format!("/{text}"), rule);
    }
    if let Ok(host) = normal_authority(text) {
        assert!(!host.bytes().any(|b| b.is_ascii_uppercase()), "{host}");
        let name = host.rsplit_once(':').map_or(&*host, |(n, _)| n);
        assert!(host.starts_with('[') || !name.ends_with('.'), "{host}");
        assert_eq!(normal_authority(&host).as_deref(), Ok(&*host), "{text:?}");
        agrees_with_http(text, &host);
    }
});

/// `raw`, accepted by Sluice as `normal`, is an authority to the `http` crate too, with the
/// same host (up to case and the trailing dot) and port.
fn agrees_with_http(raw: &str, normal: &str) {
    if raw.is_empty() {
        return;
    }
    let theirs: http::uri::Authority = raw
        .parse()
        .unwrap_or_else(|e| panic!("Sluice accepts {raw:?}, http refuses it: {e}"));
    let host = theirs.host().to_ascii_lowercase();
    let host = host.strip_suffix('.').unwrap_or(&host);
    let ours: http::uri::Authority = normal.parse().expect("a normal host is an authority");
    assert_eq!(host, ours.host(), "{raw:?}");
    assert_eq!(theirs.port_u16(), ours.port_u16(), "{raw:?}");
}

fn check_path(path: &str, rule: EscapedSlashes) {
    let Ok(normal) = normalize_path(path, rule) else {
        return;
    };
    let normal = normal.as_deref().unwrap_or(path);
    assert!(!normal.contains("//"), "{path:?} -> {normal:?}");
    assert!(
        !normal.split('/').any(|s| s == "." || s == ".."),
        "{path:?} -> {normal:?}"
    );
    for segment in normal.split('/') {
        if let Some((bare, _)) = segment.split_once(';') {
            assert!(
                !bare.is_empty() && bare != "." && bare != "..",
                "{path:?} -> {normal:?}"
            );
        }
    }
    if rule != EscapedSlashes::Keep {
        assert!(!normal.contains('\\'), "{path:?} -> {normal:?}");
    }
    let matched = match_path(normal);
    assert!(!matched.contains(';'), "{normal:?} -> {matched:?}");
    assert_eq!(
        matched.split('/').count(),
        normal.split('/').count(),
        "{normal:?} -> {matched:?}"
    );
    let bytes = normal.as_bytes();
    for (i, _) in normal.match_indices('%') {
        let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("hex digits");
        let value = u8::from_str_radix(hex, 16).expect("hex digits");
        assert!(
            !(value.is_ascii_alphanumeric() || b"-._~".contains(&value)),
            "{path:?} -> {normal:?}"
        );
    }
    assert_eq!(
        normalize_path(normal, rule),
        Ok(None),
        "{path:?} -> {normal:?}"
    );
    // Sluice normalises a request's path, which never holds `?` or `#`.
    let a_path = !path.contains(['?', '#']);
    if a_path && http::uri::PathAndQuery::try_from(path).is_ok() {
        let theirs = http::uri::PathAndQuery::try_from(normal)
            .unwrap_or_else(|e| panic!("http takes {path:?}, not its normal form {normal:?}: {e}"));
        assert_eq!(theirs.path(), normal, "{path:?}");
    }
}
