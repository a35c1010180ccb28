//! The configuration loader on any text: an error with a position, or a configuration, never
//! a panic. Files it names are looked up under a directory that does not exist.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = sluice_config::parse_str(text, "fuzz.toml", Path::new("/nonexistent/sluice")) {
        // Every error names the file.
        assert!(e.to_string().starts_with("fuzz.toml"), "{e}");
    }
});
