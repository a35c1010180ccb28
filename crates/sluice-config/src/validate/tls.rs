//! Reads certificate chains and keys (a listener's, the acceptor's, a static cluster's client
//! certificate) and CA files, so that a bad path, a broken file or a key that does not match
//! its certificate fails at load time (`sluice check` too), at the line that names it, rather
//! than when the first client connects.

use rustls::crypto::ring::default_provider;
use rustls::pki_types::ServerName;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{Pem, Tls, UpstreamTls};
use crate::raw::{RawTls, RawUpstreamTls};
use crate::values::OneOrMany;

/// A listener's `tls`: one table, or an array of them (the first is the default certificate).
pub(super) fn listener(
    ctx: Ctx<'_>,
    raw: Option<Spanned<OneOrMany<RawTls>>>,
) -> Result<Vec<Tls>, ConfigError> {
    let span = raw.as_ref().map(Spanned::span);
    let items = OneOrMany::into_items(raw);
    if let (Some(span), true) = (span, items.is_empty()) {
        let msg = "`tls = []` lists no certificate; give at least one { cert, key }, or drop `tls` to serve plaintext";
        return Err(ctx.err(span, msg));
    }
    items
        .into_iter()
        .map(|t| read(ctx, t.into_inner()))
        .collect()
}

/// Reads both PEM files and checks that the key is the certificate's.
pub(super) fn read(ctx: Ctx<'_>, raw: RawTls) -> Result<Tls, ConfigError> {
    let (cert_path, cert_pem) = read_file(ctx, &raw.cert, "certificate")?;
    let (key_path, key_pem) = read_file(ctx, &raw.key, "private key")?;
    let chain = match CertificateDer::pem_slice_iter(&cert_pem).collect::<Result<Vec<_>, _>>() {
        Ok(chain) if !chain.is_empty() => chain,
        Ok(_) => {
            let msg = format!("{} holds no PEM CERTIFICATE block", cert_path.display());
            return Err(ctx.err(raw.cert.span(), msg));
        }
        Err(e) => {
            let msg = format!("{} is not valid PEM ({e})", cert_path.display());
            return Err(ctx.err(raw.cert.span(), msg));
        }
    };
    // The parser's error is not quoted: it could echo part of the key.
    let Ok(key) = PrivateKeyDer::from_pem_slice(&key_pem) else {
        let msg = format!("{} holds no PEM private key", key_path.display());
        return Err(ctx.err(raw.key.span(), msg));
    };
    let problem = match CertifiedKey::from_der(chain, key, &default_provider()) {
        Ok(_) => None,
        Err(rustls::Error::InconsistentKeys(_)) => Some(format!(
            "{} does not match the certificate in {} (their public keys differ)",
            key_path.display(),
            cert_path.display()
        )),
        Err(e) => Some(format!(
            "{} is not a usable private key ({e})",
            key_path.display()
        )),
    };
    if let Some(problem) = problem {
        return Err(ctx.err(raw.key.span(), problem));
    }
    Ok(Tls {
        cert_path,
        key_path,
        cert_pem,
        key_pem,
    })
}

/// A static cluster's `tls`. `first_endpoint` (as written) gives the default `sni` when it is
/// a host name.
pub(super) fn upstream(
    ctx: Ctx<'_>,
    raw: Spanned<RawUpstreamTls>,
    first_endpoint: Option<&str>,
) -> Result<UpstreamTls, ConfigError> {
    let span = raw.span();
    let raw = raw.into_inner();
    let insecure = raw
        .insecure_skip_verify
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    let ca = match &raw.ca {
        Some(ca) if insecure => {
            let msg = "`ca` has no effect with `insecure_skip_verify = true`; drop one of them";
            return Err(ctx.err(ca.span(), msg));
        }
        Some(ca) => {
            let (path, pem) = read_ca(ctx, ca, "CA")?;
            Some(Pem { path, pem })
        }
        None => None,
    };
    let sni = match &raw.sni {
        Some(sni) => match ServerName::try_from(sni.get_ref().as_str()) {
            Ok(_) => Some(sni.get_ref().to_ascii_lowercase()),
            Err(_) => {
                let msg = format!(
                    "`sni = \"{}\"` is not a DNS name or an IP address",
                    sni.get_ref()
                );
                return Err(ctx.err(sni.span(), msg));
            }
        },
        None => first_endpoint.and_then(host_name),
    };
    let client_cert = match (raw.cert, raw.key) {
        (Some(cert), Some(key)) => Some(read(ctx, RawTls { cert, key })?),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            let msg = "a client certificate needs both `cert` and `key`";
            return Err(ctx.err(span, msg));
        }
    };
    Ok(UpstreamTls {
        ca,
        sni,
        client_cert,
        insecure_skip_verify: insecure,
    })
}

/// The host of `host:port` when it is a DNS name (not an IP address).
fn host_name(endpoint: &str) -> Option<String> {
    let (host, _port) = endpoint.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    match ServerName::try_from(host) {
        Ok(ServerName::DnsName(_)) => Some(host.to_ascii_lowercase()),
        _ => None,
    }
}

/// Reads a CA file (`what`: which one, for the error): at least one PEM certificate (whether
/// it is a usable trust anchor is rustls's call at start-up).
pub(super) fn read_ca(
    ctx: Ctx<'_>,
    raw: &Spanned<String>,
    what: &str,
) -> Result<(std::path::PathBuf, Vec<u8>), ConfigError> {
    let (path, pem) = read_file(ctx, raw, what)?;
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
