//! The names read from a client certificate (mTLS at the acceptor) on any DER input: never a
//! panic, and every name is lowercase.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustls_pki_types::CertificateDer;

fuzz_target!(|data: &[u8]| {
    for name in sluice_wire::cert::cert_names(&CertificateDer::from(data)) {
        assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "{name}");
    }
});
