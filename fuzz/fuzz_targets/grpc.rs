//! gRPC's small formats from peers: a `grpc-timeout` value never panics and, when taken, is
//! at most 8 digits and a unit (never more than 10^8 hours); a health response never panics,
//! and a health request Sluice encodes for any service name is one well-framed message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::grpc::{health_request, serving, timeout};

fuzz_target!(|data: &[u8]| {
    if let Some(d) = timeout(data) {
        assert!(data.len() >= 2 && data.len() <= 9, "{data:?}");
        assert!(d.as_secs() <= 99_999_999 * 3600);
    }
    let _ = serving(data);
    if let Ok(service) = std::str::from_utf8(data) {
        let request = health_request(service);
        let len = u32::from_be_bytes([request[1], request[2], request[3], request[4]]) as usize;
        assert_eq!((request[0], len), (0, request.len() - 5));
    }
});
