//! Reads a listener's (or the acceptor's) certificate chain and key, and the acceptor's client
//! CA, so that a bad path fails at load time, at the line that names it, rather than when the
//! first client connects.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::Tls;
use crate::raw::RawTls;

/// Reads and sanity-checks both PEM files (parsing only: whether they match is rustls's call).
pub(super) fn read(ctx: Ctx<'_>, raw: RawTls) -> Result<Tls, ConfigError> {
    let (cert_path, cert_pem) = read_file(ctx, &raw.cert, "certificate")?;
    let (key_path, key_pem) = read_file(ctx, &raw.key, "private key")?;
    let problem = match CertificateDer::pem_slice_iter(&cert_pem).next() {
        Some(Ok(_)) => None,
        Some(Err(e)) => Some(format!("is not valid PEM ({e})")),
        None => Some("holds no PEM CERTIFICATE block".to_owned()),
    };
    if let Some(problem) = problem {
        return Err(ctx.err(
            raw.cert.span(),
            format!("{} {problem}", cert_path.display()),
        ));
    }
    // The parser's error is not quoted: it could echo part of the key.
    if PrivateKeyDer::from_pem_slice(&key_pem).is_err() {
        let msg = format!("{} holds no PEM private key", key_path.display());
        return Err(ctx.err(raw.key.span(), msg));
    }
    Ok(Tls {
        cert_path,
        key_path,
        cert_pem,
        key_pem,
    })
}

/// Reads the CA file of `client_ca`: at least one PEM certificate (whether it is a usable
/// trust anchor is rustls's call at start-up).
pub(super) fn read_ca(
    ctx: Ctx<'_>,
    raw: &Spanned<String>,
) -> Result<(std::path::PathBuf, Vec<u8>), ConfigError> {
    let (path, pem) = read_file(ctx, raw, "client CA")?;
    let mut certs = CertificateDer::pem_slice_iter(&pem);
    match certs.next() {
        Some(Ok(_)) if certs.all(|c| c.is_ok()) => Ok((path, pem)),
        Some(_) => Err(ctx.err(raw.span(), format!("{} is not valid PEM", path.display()))),
        None => Err(ctx.err(
            raw.span(),
            format!("{} holds no PEM CERTIFICATE block", path.display()),
        )),
    }
}

fn read_file(
    ctx: Ctx<'_>,
    path: &Spanned<String>,
    what: &str,
) -> Result<(std::path::PathBuf, Vec<u8>), ConfigError> {
    let resolved = ctx.resolve(path.get_ref());
    match std::fs::read(&resolved) {
        Ok(bytes) => Ok((resolved, bytes)),
        Err(e) => {
            let msg = format!("cannot read TLS {what} {}: {e}", resolved.display());
            Err(ctx.err(path.span(), msg))
        }
    }
}
