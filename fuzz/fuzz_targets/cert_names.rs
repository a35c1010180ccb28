//! The names and the expiry read from a certificate (mTLS at the acceptor; a listener's own for
//! `/status`) on any DER input: never a panic, every name is lowercase, and an expiry is a
//! time between the years 1950 and 9999.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustls_pki_types::CertificateDer;

fuzz_target!(|data: &[u8]| {
    let der = CertificateDer::from(data);
    for name in sluice_wire::cert::cert_names(&der) {
        assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "{name}");
    }
    if let Some(at) = sluice_wire::cert::not_after(&der) {
        assert!((-631_152_000..=253_402_300_800).contains(&at), "{at}");
    }
});
