//! TLS on the acceptor: the TLS handshake within the hello's deadline, and under mTLS the
//! client certificate's names, checked against `[acceptor.clients]` at registration.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustls::server::ServerConnection;
use rustls::ServerConfig;
use sluice_session::Rejection;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use crate::options::ServiceGrant;

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
    conn.peer_certificates()?
        .first()
        .map(sluice_wire::cert::cert_names)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
