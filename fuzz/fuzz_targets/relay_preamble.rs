//! The relay tunnel preamble's parsers never panic, never claim more bytes than they were
//! given, and whatever they accept encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_relay::preamble::{encode_hello, encode_target, parse_hello, parse_target};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((hello, used))) = parse_hello(data) {
        assert!(used <= data.len());
        let mut again = Vec::new();
        encode_hello(hello.token, &mut again);
        assert_eq!(again, &data[..used]);
        // What follows a hello is a target.
        check_target(&data[used..]);
    }
    check_target(data);
});

fn check_target(data: &[u8]) {
    if let Ok(Some((addr, used))) = parse_target(data) {
        assert!(used <= data.len());
        let mut again = Vec::new();
        encode_target(addr, &mut again);
        assert_eq!(again, &data[..used]);
    }
}
