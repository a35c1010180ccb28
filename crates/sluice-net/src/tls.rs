//! The TLS configs every Sluice process builds alike: the crypto provider, the session-ticket
//! key, PEM certificate chains and keys, and the acceptor's server config with optional client
//! authentication.

use std::io;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sluice_config::{AcceptorTls, ClientAuth, Tls};

/// Session tickets sealed with a key that rotates every 6 hours (rustls's `Ticketer`).
pub fn ticketer() -> io::Result<Arc<dyn rustls::server::ProducesTickets>> {
    #[cfg(not(feature = "aws-lc-rs"))]
    let ticketer = rustls::crypto::ring::Ticketer::new();
    #[cfg(feature = "aws-lc-rs")]
    let ticketer = rustls::crypto::aws_lc_rs::Ticketer::new();
    ticketer.map_err(|e| invalid(format!("TLS tickets: {e}")))
}

/// Builds the acceptor's rustls server config. No ALPN: the session protocol is the only one
/// spoken there. With `client_auth`, every client must present a certificate that chains to
/// its CA, or the TLS handshake fails.
pub fn acceptor_config(tls: &AcceptorTls) -> io::Result<Arc<ServerConfig>> {
    let (certs, key) = load_pair(&tls.server)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?;
    let builder = match &tls.client_auth {
        None => builder.with_no_client_auth(),
        Some(auth) => builder.with_client_cert_verifier(client_verifier(auth)?),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| invalid(format!("{}: {e}", tls.server.cert_path.display())))?;
    config.ticketer = ticketer()?;
    Ok(Arc::new(config))
}

/// Requires a client certificate signed by one of `auth`'s CA certificates.
fn client_verifier(auth: &ClientAuth) -> io::Result<Arc<dyn ClientCertVerifier>> {
    let bad_ca = |e: &dyn std::fmt::Display| invalid(format!("{}: {e}", auth.ca_path.display()));
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&auth.ca_pem) {
        let cert = cert.map_err(|e| bad_ca(&e))?;
        roots.add(cert).map_err(|e| bad_ca(&e))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| bad_ca(&e))
}

/// A PEM certificate chain and key, parsed (their match is rustls's, or the config's, check).
pub fn load_pair(tls: &Tls) -> io::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let certs = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("{}: {e}", tls.cert_path.display())))?;
    let key = PrivateKeyDer::from_pem_slice(&tls.key_pem)
        .map_err(|e| invalid(format!("{}: {e}", tls.key_path.display())))?;
    Ok((certs, key))
}

/// The crypto every TLS config of Sluice uses: `ring`, or with the `aws-lc-rs` feature
/// (`cargo build --features sluice/aws-lc-rs`), AWS-LC (the bench's `tls` scenario measures
/// both when the second build is there).
pub fn provider() -> Arc<CryptoProvider> {
    #[cfg(not(feature = "aws-lc-rs"))]
    let provider = rustls::crypto::ring::default_provider();
    #[cfg(feature = "aws-lc-rs")]
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    Arc::new(provider)
}

/// An `InvalidInput` error saying `msg`.
pub fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}
