//! `Message::parse` never panics, and whatever it accepts encodes back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_handoff::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = Message::parse(data) {
        let line = msg.encode().expect("a parsed message encodes");
        assert_eq!(Message::parse(&line), Ok(msg));
    }
});
