//! TLS termination with rustls: certificate loading and ALPN for listeners, and the acceptor's
//! config with optional client authentication.

use std::io;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sluice_config::{AcceptorTls, ClientAuth, Tls};

/// Builds a rustls server config from PEM material, offering `h2` (when `http2`) and
/// `http/1.1` by ALPN.
pub fn server_config(tls: &Tls, http2: bool) -> io::Result<Arc<ServerConfig>> {
    let (certs, key) = load_pair(tls)?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| invalid(format!("{}: {e}", tls.cert_path.display())))?;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(Arc::new(config))
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
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| invalid(format!("{}: {e}", tls.server.cert_path.display())))?;
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

fn load_pair(tls: &Tls) -> io::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let certs = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("{}: {e}", tls.cert_path.display())))?;
    let key = PrivateKeyDer::from_pem_slice(&tls.key_pem)
        .map_err(|e| invalid(format!("{}: {e}", tls.key_path.display())))?;
    Ok((certs, key))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}
