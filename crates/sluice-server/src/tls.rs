//! TLS termination with rustls: a listener's certificates (chosen by SNI, replaceable in
//! place), ALPN and resumption. The acceptor's config and the crypto provider are
//! `sluice_net::tls`'s.
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
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use sluice_net::tls::{invalid, ticketer};
use sluice_net::tls::{load_pair, provider, Tls};
use sluice_wire::cert::{cert_names, not_after};

/// A listener's certificates: each serves the names it carries (DNS subject alternative names,
/// `*.` wildcards included, or the common name without them); the first also serves clients
/// without SNI or with a name none carries. Replaced whole by [`replace`](Self::replace):
/// handshakes from then on get the new set, open connections carry on.
#[derive(Debug)]
pub struct Certificates(ArcSwap<ByName>);

#[derive(Debug)]
struct ByName {
    /// Every certificate, in the configured order: names and expiry.
    listed: Vec<Listed>,
    default: Arc<CertifiedKey>,
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` under `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
}

/// One configured certificate as `/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The names it serves.
    pub names: Vec<String>,
    /// When it expires, in seconds since the Unix epoch (`None`: unreadable).
    pub not_after: Option<i64>,
}

impl Certificates {
    /// Each certificate served now, in the configured order.
    pub fn listed(&self) -> Vec<Listed> {
        self.0.load().listed.clone()
    }

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
    pub fn swap(&self, next: Self) {
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
            listed: Vec::new(),
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            default: Arc::clone(&default),
        };
        for key in std::iter::once(Ok(default)).chain(keys) {
            let key = key?;
            let names = key.end_entity_cert().map(cert_names).unwrap_or_default();
            by_name.listed.push(Listed {
                names: names.clone(),
                not_after: key.end_entity_cert().ok().and_then(not_after),
            });
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

fn certified_key(tls: &Tls) -> io::Result<CertifiedKey> {
    let (certs, key) = load_pair(tls)?;
    CertifiedKey::from_der(certs, key, &provider())
        .map_err(|e| invalid(format!("{}: {e}", tls.cert_path.display())))
}

/// The TLS listeners' certificate expiry as a gauge,
/// `sluice_tls_certificate_expiry_timestamp_seconds{listener, name}` (its first name), read at
/// each scrape so that a renewal shows at once.
#[derive(Debug)]
pub struct ExpiryCollector(pub std::collections::BTreeMap<String, Arc<Certificates>>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ExpiryLabels {
    listener: String,
    name: String,
}

impl prometheus_client::collector::Collector for ExpiryCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "tls_certificate_expiry_timestamp_seconds",
            "When each listener certificate expires, in seconds since the Unix epoch",
            None,
            gauge.metric_type(),
        )?;
        for (listener, certs) in &self.0 {
            for c in certs.listed() {
                let Some(at) = c.not_after else { continue };
                let labels = ExpiryLabels {
                    listener: listener.clone(),
                    name: c.names.first().cloned().unwrap_or_default(),
                };
                ConstGauge::new(at).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
