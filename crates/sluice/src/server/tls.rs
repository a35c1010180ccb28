//! TLS termination with rustls: a listener's certificates (chosen by SNI, replaceable in
//! place), ALPN and resumption, and the acceptor's config with optional client
//! authentication.
//!
//! Resumption: tickets sealed with a key that rotates every 6 hours (rustls's `Ticketer`, which
//! still opens tickets of the previous key), for TLS 1.3 and for TLS 1.2 clients that ask for
//! them; other TLS 1.2 clients use the default bounded session cache (256 sessions). Ticket keys live in the process: a hot
//! restart's successor cannot resume its predecessor's sessions (clients do one full
//! handshake again).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sluice_config::{AcceptorTls, ClientAuth, Tls};
use sluice_wire::cert::cert_names;

/// A listener's certificates: each serves the names it carries (DNS subject alternative names,
/// `*.` wildcards included, or the common name without them); the first also serves clients
/// without SNI or with a name none carries. Replaced whole by [`replace`](Self::replace):
/// handshakes from then on get the new set, open connections carry on.
#[derive(Debug)]
pub struct Certificates(ArcSwap<ByName>);

#[derive(Debug)]
struct ByName {
    default: Arc<CertifiedKey>,
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` under `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
}

impl Certificates {
    /// Loads `tls` (at least one pair).
    pub fn load(tls: &[Tls]) -> io::Result<Self> {
        Ok(Self(ArcSwap::from_pointee(ByName::load(tls)?)))
    }

    /// Serves `tls` from the next handshake on; on an error nothing changes.
    pub fn replace(&self, tls: &[Tls]) -> io::Result<()> {
        self.swap(Self::load(tls)?);
        Ok(())
    }

    /// Serves `next`'s certificates from the next handshake on.
    pub(crate) fn swap(&self, next: Self) {
        self.0.store(next.0.into_inner());
    }
}

impl ByName {
    fn load(tls: &[Tls]) -> io::Result<Self> {
        let mut keys = tls.iter().map(|t| certified_key(t).map(Arc::new));
        let default = keys
            .next()
            .ok_or_else(|| invalid("a TLS listener needs a certificate".to_owned()))??;
        let mut by_name = Self {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            default: Arc::clone(&default),
        };
        for key in std::iter::once(Ok(default)).chain(keys) {
            let key = key?;
            let names = key.end_entity_cert().map(cert_names).unwrap_or_default();
            for name in names {
                // The first certificate to carry a name serves it.
                let table = match name.strip_prefix("*.") {
                    Some(parent) => by_name.wildcard.entry(parent.to_owned()),
                    None => by_name.exact.entry(name),
                };
                table.or_insert_with(|| Arc::clone(&key));
            }
        }
        Ok(by_name)
    }

    fn pick(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = sni.map(|n| n.trim_end_matches('.').to_ascii_lowercase()) else {
            return Arc::clone(&self.default);
        };
        let wildcard = || {
            let (_, parent) = name.split_once('.')?;
            self.wildcard.get(parent)
        };
        Arc::clone(
            self.exact
                .get(&name)
                .or_else(wildcard)
                .unwrap_or(&self.default),
        )
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load().pick(hello.server_name()))
    }
}

/// Builds a listener's rustls server config over `certs`, offering `h2` (when `http2`) and
/// `http/1.1` by ALPN, with resumption by tickets.
pub fn server_config(certs: Arc<Certificates>, http2: bool) -> io::Result<Arc<ServerConfig>> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    config.ticketer = ticketer()?;
    Ok(Arc::new(config))
}

fn ticketer() -> io::Result<Arc<dyn rustls::server::ProducesTickets>> {
    #[cfg(not(feature = "aws-lc-rs"))]
    let ticketer = rustls::crypto::ring::Ticketer::new();
    #[cfg(feature = "aws-lc-rs")]
    let ticketer = rustls::crypto::aws_lc_rs::Ticketer::new();
    ticketer.map_err(|e| invalid(format!("TLS tickets: {e}")))
}

fn certified_key(tls: &Tls) -> io::Result<CertifiedKey> {
    let (certs, key) = load_pair(tls)?;
    CertifiedKey::from_der(certs, key, &provider())
        .map_err(|e| invalid(format!("{}: {e}", tls.cert_path.display())))
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
pub(crate) fn load_pair(
    tls: &Tls,
) -> io::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
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
pub(crate) fn provider() -> Arc<CryptoProvider> {
    #[cfg(not(feature = "aws-lc-rs"))]
    let provider = rustls::crypto::ring::default_provider();
    #[cfg(feature = "aws-lc-rs")]
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    Arc::new(provider)
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}
