//! TLS on the acceptor: the TLS handshake within the hello's deadline, and under mTLS the
//! client certificate's names, checked against `[acceptor.clients]` at registration.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustls::server::ServerConnection;
use rustls::ServerConfig;
use rustls_pki_types::CertificateDer;
use sluice_config::ServiceGrant;
use sluice_session::Rejection;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

/// The DER encoding of the `commonName` attribute type, 2.5.4.3.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// Completes the TLS handshake by `deadline`; `None` (logged) when it fails or runs late,
/// including when mTLS is on and the client presented no certificate the CA signed.
pub(super) async fn accept<S>(
    config: &Arc<ServerConfig>,
    io: S,
    deadline: Instant,
) -> Option<TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = TlsAcceptor::from(Arc::clone(config)).accept(io);
    match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(error)) => {
            debug!(%error, "TLS handshake failed");
            None
        }
        Err(_elapsed) => {
            debug!("TLS handshake timed out");
            None
        }
    }
}

/// The names of the client's certificate, lowercase: its DNS subject alternative names, or
/// its subject's common name when it has none. `None` when the client sent no certificate.
pub(super) fn client_names(conn: &ServerConnection) -> Option<Vec<String>> {
    conn.peer_certificates()?.first().map(cert_names)
}

fn cert_names(der: &CertificateDer<'_>) -> Vec<String> {
    // rustls has already verified the chain, so this parse is not expected to fail; if it
    // does, the certificate has no names and matches no grant.
    let Ok(cert) = webpki::EndEntityCert::try_from(der) else {
        return Vec::new();
    };
    let dns: Vec<String> = cert
        .valid_dns_names()
        .map(str::to_ascii_lowercase)
        .collect();
    if !dns.is_empty() {
        return dns;
    }
    common_name(cert.subject())
        .map(|cn| vec![cn.to_ascii_lowercase()])
        .unwrap_or_default()
}

/// Whether a client with certificate `names` may register for (or drain) `service`. An empty
/// `grants` table lets any certificate the CA signed through; otherwise one of the names must
/// be granted the service, and a connection without a certificate is refused.
pub(super) fn authorize(
    grants: &BTreeMap<String, ServiceGrant>,
    names: Option<&[String]>,
    service: &str,
) -> Result<(), Rejection> {
    if grants.is_empty() {
        return Ok(());
    }
    let allowed = names
        .unwrap_or_default()
        .iter()
        .any(|name| grants.get(name).is_some_and(|grant| grant.allows(service)));
    if allowed {
        return Ok(());
    }
    Err(Rejection {
        status: 401,
        reason: format!("client certificate not allowed for service {service}"),
    })
}

/// The first `commonName` of a DER `Name` (its contents, as webpki's `subject()` returns
/// them): a sequence of SETs of { OID, value } SEQUENCEs. `None` if absent or not a string.
fn common_name(mut rdns: &[u8]) -> Option<String> {
    while !rdns.is_empty() {
        let (mut set, rest) = der_take(rdns, 0x31)?;
        rdns = rest;
        while !set.is_empty() {
            let (attribute, rest) = der_take(set, 0x30)?;
            set = rest;
            let (oid, value) = der_take(attribute, 0x06)?;
            if oid == OID_COMMON_NAME {
                return der_string(value);
            }
        }
    }
    None
}

/// A UTF8String, PrintableString or IA5String value.
fn der_string(input: &[u8]) -> Option<String> {
    let tag = *input.first()?;
    if !matches!(tag, 0x0c | 0x13 | 0x16) {
        return None;
    }
    let (value, _) = der_take(input, tag)?;
    std::str::from_utf8(value).ok().map(str::to_owned)
}

/// Splits one DER element with `tag` off `input`: (its contents, what follows it).
fn der_take(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = input.split_first()?;
    if first != tag {
        return None;
    }
    let (&len0, rest) = rest.split_first()?;
    let (len, rest) = if len0 < 0x80 {
        (usize::from(len0), rest)
    } else {
        // Long form; a name longer than 16 MiB is not one we will read.
        let n = usize::from(len0 & 0x7f);
        if n == 0 || n > 3 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |acc, &b| acc << 8 | usize::from(b));
        (len, rest)
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn cert(sans: &[&str], cn: Option<&str>) -> CertificateDer<'static> {
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Sluice tests");
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn names_are_dns_sans_else_the_common_name() {
        let both = cert(&["Billing-1.internal", "b1.internal"], Some("ignored"));
        assert_eq!(cert_names(&both), ["billing-1.internal", "b1.internal"]);
        let cn_only = cert(&[], Some("Legacy-Client"));
        assert_eq!(cert_names(&cn_only), ["legacy-client"]);
        assert!(cert_names(&cert(&[], None)).is_empty());
        assert!(cert_names(&CertificateDer::from(vec![0x30, 0x03, 1, 2])).is_empty());
    }

    #[test]
    fn common_name_survives_truncated_and_odd_input() {
        // SET { SEQUENCE { OID 2.5.4.3, UTF8String "ab" } }
        let name = [
            0x31, 0x0b, 0x30, 0x09, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x02, b'a', b'b',
        ];
        assert_eq!(common_name(&name).as_deref(), Some("ab"));
        for end in 0..name.len() {
            assert_eq!(common_name(&name[..end]), None, "prefix of {end} bytes");
        }
        assert_eq!(common_name(&[0x31, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        let mut bmp = name;
        bmp[9] = 0x1e; // BMPString: not read
        assert_eq!(common_name(&bmp), None);
    }

    #[test]
    fn grants_allow_only_mapped_services() {
        let mut grants = BTreeMap::new();
        assert!(
            authorize(&grants, None, "billing").is_ok(),
            "no table: the CA decides"
        );
        grants.insert(
            "billing-1.internal".to_owned(),
            ServiceGrant::Services(["billing".to_owned()].into()),
        );
        grants.insert("ops.internal".to_owned(), ServiceGrant::Any);
        let billing = ["other".to_owned(), "billing-1.internal".to_owned()];
        assert!(authorize(&grants, Some(&billing), "billing").is_ok());
        let refused = authorize(&grants, Some(&billing), "api").unwrap_err();
        assert_eq!(refused.status, 401);
        assert_eq!(
            refused.reason,
            "client certificate not allowed for service api"
        );
        assert!(authorize(&grants, Some(&["ops.internal".to_owned()]), "api").is_ok());
        assert!(authorize(&grants, None, "billing").is_err());
    }
}
