//! HTTPS to static endpoints: one rustls client config per cluster, whose session cache (256
//! server names, TLS 1.3 tickets included) resumes handshakes across connections. The cache is
//! keyed by server name: endpoints verified under one `sni` share its entries, so a ticket one
//! endpoint issued may be offered to another, which (unless they share ticket keys) answers
//! with a full handshake.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tracing::warn;

use sluice_config::UpstreamProtocol;
use sluice_core::error::ProxyError;
use sluice_net::tls::{load_pair, provider};

/// How a cluster's connections to its endpoints are secured.
#[derive(Clone)]
pub(crate) struct UpstreamTls {
    connector: TlsConnector,
    /// The name sent by SNI and verified; `None`: each endpoint's IP address.
    name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// Builds the client config `cfg` describes (`cluster` names it in errors and warnings),
    /// offering by ALPN what `protocol` may speak.
    pub(crate) fn new(
        cluster: &str,
        cfg: &sluice_config::UpstreamTls,
        protocol: sluice_config::UpstreamProtocol,
    ) -> io::Result<Self> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(e.to_string()))?;
        let builder = if cfg.insecure_skip_verify {
            warn!(%cluster, "insecure_skip_verify = true: endpoint certificates are NOT verified; anyone on the path can read and change this cluster's traffic");
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
        } else {
            builder.with_root_certificates(roots(cfg)?)
        };
        let mut config = match &cfg.client_cert {
            None => builder.with_no_client_auth(),
            Some(pair) => {
                let (certs, key) = load_pair(pair)?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| invalid(format!("{}: {e}", pair.cert_path.display())))?
            }
        };
        config.alpn_protocols = match protocol {
            UpstreamProtocol::Http1 | UpstreamProtocol::H2c => vec![b"http/1.1".to_vec()],
            UpstreamProtocol::H2 => vec![b"h2".to_vec()],
            UpstreamProtocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        let name = match &cfg.sni {
            Some(sni) => Some(
                ServerName::try_from(sni.clone())
                    .map_err(|e| invalid(format!("sni {sni:?}: {e}")))?,
            ),
            None => None,
        };
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        })
    }

    /// The TLS handshake over `tcp`, connected to `addr`.
    pub(crate) async fn handshake(
        &self,
        tcp: TcpStream,
        addr: SocketAddr,
    ) -> Result<TlsStream<TcpStream>, ProxyError> {
        let name = self
            .name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        self.connector
            .connect(name, tcp)
            .await
            .map_err(handshake_error)
    }

    /// The name sent by SNI, if any (the `Host` of requests that carry none).
    pub(crate) fn sni(&self) -> Option<String> {
        match &self.name {
            Some(ServerName::DnsName(name)) => Some(name.as_ref().to_owned()),
            _ => None,
        }
    }
}

/// The cluster's CA, or the system's roots without one.
fn roots(cfg: &sluice_config::UpstreamTls) -> io::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    if let Some(ca) = &cfg.ca {
        for cert in CertificateDer::pem_slice_iter(&ca.pem) {
            let bad = |e: &dyn std::fmt::Display| invalid(format!("{}: {e}", ca.path.display()));
            roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
        }
        return Ok(roots);
    }
    let system = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(system.certs);
    if added == 0 {
        let why = system.errors.first().map(ToString::to_string);
        let why = why.unwrap_or_else(|| "none found".to_owned());
        return Err(invalid(format!(
            "no system CA certificates ({why}): install the ca-certificates package or set `ca`"
        )));
    }
    Ok(roots)
}

/// Says which check a failed handshake failed, for the client; the detail is for the log.
fn handshake_error(e: io::Error) -> ProxyError {
    let check = match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(cert)) => certificate_check(cert),
        Some(
            rustls::Error::NoApplicationProtocol
            | rustls::Error::AlertReceived(rustls::AlertDescription::NoApplicationProtocol),
        ) => "no common application protocol (ALPN)",
        Some(rustls::Error::AlertReceived(_)) => "the endpoint refused the handshake",
        Some(_) => "protocol error",
        None => "connection lost during the handshake",
    };
    ProxyError::UpstreamTls {
        check,
        detail: e.to_string(),
    }
}

fn certificate_check(e: &CertificateError) -> &'static str {
    match e {
        CertificateError::UnknownIssuer => "certificate not signed by a trusted CA",
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "certificate not valid for the server name"
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "certificate expired"
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "certificate not yet valid"
        }
        CertificateError::Revoked => "certificate revoked",
        CertificateError::BadSignature => "certificate signature invalid",
        _ => "certificate rejected",
    }
}

/// `insecure_skip_verify`: accepts any certificate (signatures are still checked, so the
/// handshake itself is sound; only who is at the other end is unknown).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}
