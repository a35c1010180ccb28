//! The acceptor's reading of a service's first request, and an SDK's reading of the
//! acceptor's answer: never a panic, and a registration, drain or control link request that
//! parses encodes back to one that parses to the same thing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_session::{parse_hello, parse_reply, Hello, Parsed};

/// The acceptor's default `max_handshake_size`.
const MAX_HEAD: usize = 8 * 1024;

fuzz_target!(|data: &[u8]| {
    let _ = parse_reply(data);
    let Ok(Parsed::Complete(hello, used)) = parse_hello(data, MAX_HEAD) else {
        return;
    };
    assert!(used <= data.len() && used <= MAX_HEAD);
    let encoded = match &hello {
        Hello::Register(r) => r.encode(),
        Hello::Drain(d) => d.encode(),
        Hello::Control(r, split) => r.encode_control_split(*split),
    };
    // The encoding may be longer than what was read (it adds `Host`, `Content-Length` and the
    // default slice): a head just under the limit may encode to one just over it.
    match parse_hello(&encoded, encoded.len().max(MAX_HEAD)) {
        Ok(Parsed::Complete(again, n)) => {
            assert_eq!(again, hello);
            assert_eq!(n, encoded.len());
        }
        other => panic!("{hello:?} encodes to {encoded:?}, which parses as {other:?}"),
    }
});
