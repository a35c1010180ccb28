//! The TLS configs every Sluice process builds alike: the crypto provider, the session-ticket
//! key, PEM certificate chains and keys, and the acceptor's server config with optional client
//! authentication.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// TLS material for a listener, the acceptor or an upstream's client certificate, already read
/// from disk (the configuration reads it: `sluice_config` fills this type).
#[derive(Clone, PartialEq)]
pub struct Tls {
    /// Where the certificate chain came from.
    pub cert_path: PathBuf,
    /// Where the private key came from.
    pub key_path: PathBuf,
    /// The PEM certificate chain.
    pub cert_pem: Vec<u8>,
    /// The PEM private key (never printed).
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("key_pem", &"***")
            .finish_non_exhaustive()
    }
}

/// The CA client certificates must chain to (mTLS at the acceptor): its PEM certificates and
/// where they came from.
#[derive(Debug, Clone, Copy)]
pub struct ClientCa<'a> {
    /// Where the certificates came from (for errors).
    pub path: &'a Path,
    /// The PEM certificates.
    pub pem: &'a [u8],
}

/// Session tickets sealed with a key that rotates every 6 hours (rustls's `Ticketer`).
pub fn ticketer() -> io::Result<Arc<dyn rustls::server::ProducesTickets>> {
    #[cfg(not(feature = "aws-lc-rs"))]
    let ticketer = rustls::crypto::ring::Ticketer::new();
    #[cfg(feature = "aws-lc-rs")]
    let ticketer = rustls::crypto::aws_lc_rs::Ticketer::new();
    ticketer.map_err(|e| invalid(format!("TLS tickets: {e}")))
}

/// Builds the acceptor's rustls server config for `server`'s chain and key. No ALPN: the
/// session protocol is the only one spoken there. With `client_ca`, every client must present
/// a certificate that chains to it, or the TLS handshake fails.
pub fn acceptor_config(
    server: &Tls,
    client_ca: Option<ClientCa<'_>>,
) -> io::Result<Arc<ServerConfig>> {
    let (certs, key) = load_pair(server)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca)?),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| invalid(format!("{}: {e}", server.cert_path.display())))?;
    config.ticketer = ticketer()?;
    Ok(Arc::new(config))
}

/// Requires a client certificate signed by one of `ca`'s certificates.
fn client_verifier(ca: ClientCa<'_>) -> io::Result<Arc<dyn ClientCertVerifier>> {
    let bad_ca = |e: &dyn std::fmt::Display| invalid(format!("{}: {e}", ca.path.display()));
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.pem) {
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
