//! Path and host normalisation on any input: never a panic; a normalised path has no `//`, no
//! `.`/`..` segment and no escaped unreserved character, and normalising it again changes
//! nothing; a normalised host is lowercase, has no trailing dot, and is a fixed point too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::normalize::{normal_authority, normalize_path};
use sluice_wire::EscapedSlashes;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for rule in [EscapedSlashes::Reject, EscapedSlashes::Keep, EscapedSlashes::Unescape] {
        check_path(&format!("/{text}"), rule);
    }
    if let Ok(host) = normal_authority(text) {
        assert!(!host.bytes().any(|b| b.is_ascii_uppercase()), "{host}");
        let name = host.rsplit_once(':').map_or(&*host, |(n, _)| n);
        assert!(host.starts_with('[') || !name.ends_with('.'), "{host}");
        assert_eq!(normal_authority(&host).as_deref(), Ok(&*host), "{text:?}");
    }
});

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
    let bytes = normal.as_bytes();
    for (i, _) in normal.match_indices('%') {
        let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("hex digits");
        let value = u8::from_str_radix(hex, 16).expect("hex digits");
        assert!(
            !(value.is_ascii_alphanumeric() || b"-._~".contains(&value)),
            "{path:?} -> {normal:?}"
        );
    }
    assert_eq!(normalize_path(normal, rule), Ok(None), "{path:?} -> {normal:?}");
}
