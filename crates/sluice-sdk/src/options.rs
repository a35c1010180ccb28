//! [`Options`]: where the acceptor is, who this instance is, and how hard to try.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use sluice_session::Identity;

use crate::Error;

/// Where the proxy's acceptor listens. There is no default: an SDK must be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acceptor {
    /// A TCP address, `host:port` or `ip:port`, resolved again on every dial.
    Tcp(String),
    /// A UNIX stream socket path.
    Unix(PathBuf),
}

impl From<SocketAddr> for Acceptor {
    fn from(addr: SocketAddr) -> Self {
        Acceptor::Tcp(addr.to_string())
    }
}

impl std::fmt::Display for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Acceptor::Tcp(addr) => f.write_str(addr),
            Acceptor::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// TLS to the acceptor; without it (the default) sessions are plaintext.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// The rustls client configuration (roots, client certificate for mTLS, ALPN: none needed).
    pub config: Arc<rustls::ClientConfig>,
    /// The name the acceptor's certificate must carry.
    pub server_name: ServerName<'static>,
}

/// Jittered exponential backoff between failed dials.
/// Default: 100 ms doubling up to 5 s, each delay shortened by up to half at random.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay; default 100 ms.
    pub initial: Duration,
    /// The longest delay; default 5 s.
    pub max: Duration,
    /// The fraction of each delay taken off at random, 0.0 to 1.0; default 0.5. Jitter keeps
    /// many instances from re-dialing a restarted proxy in lockstep.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based): `initial * 2^attempt`, capped at
    /// `max`, less a random share of up to `jitter`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(31));
        let base = self.initial.saturating_mul(factor).min(self.max);
        base.saturating_sub(base.mul_f64(self.jitter * fastrand::f64()))
    }
}

/// Everything [`serve`](crate::serve) needs besides the service.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to dial.
    pub acceptor: Acceptor,
    /// Who this instance is (service, slice, instance id, token).
    pub identity: Identity,
    /// How many sessions to keep registered; default 1.
    pub capacity: usize,
    /// TLS to the acceptor; default `None` (plaintext).
    pub tls: Option<TlsOptions>,
    /// Delays between failed dials; default [`Backoff::default`].
    pub backoff: Backoff,
    /// Limit on connecting plus the registration (or drain) answer; default 5 s.
    pub handshake_timeout: Duration,
    /// While an operator holds the instance drained (`410`), one registration probes this
    /// often whether it was resumed; default 30 s.
    pub drained_probe: Duration,
}

impl Options {
    /// Options for `identity` at `acceptor`, with 1 session, no TLS and the default backoff and
    /// handshake timeout.
    pub fn new(acceptor: impl Into<Acceptor>, identity: Identity) -> Self {
        Self {
            acceptor: acceptor.into(),
            identity,
            capacity: 1,
            tls: None,
            backoff: Backoff::default(),
            handshake_timeout: Duration::from_secs(5),
            drained_probe: Duration::from_secs(30),
        }
    }

    /// Rejects options that could never register, before any dial.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let id = &self.identity;
        if id.service.is_empty() {
            return Err(Error::Config("identity.service is empty".into()));
        }
        header_value("identity.service", &id.service)?;
        header_value("identity.slice", &id.slice)?;
        if let Some(instance) = &id.instance {
            header_value("identity.instance", instance)?;
        }
        if let Some(token) = &id.token {
            header_value("identity.token", token)?;
        }
        self.validate_timing()
    }

    fn validate_timing(&self) -> Result<(), Error> {
        let b = &self.backoff;
        if b.initial.is_zero() || b.initial > b.max {
            return Err(Error::Config(
                "backoff.initial must be positive and at most backoff.max".into(),
            ));
        }
        if !(0.0..=1.0).contains(&b.jitter) {
            return Err(Error::Config(
                "backoff.jitter must be within 0.0..=1.0".into(),
            ));
        }
        if self.handshake_timeout.is_zero() {
            return Err(Error::Config("handshake_timeout must be positive".into()));
        }
        if self.drained_probe.is_zero() {
            return Err(Error::Config("drained_probe must be positive".into()));
        }
        Ok(())
    }
}

/// Each identity field becomes a header value: visible ASCII only, so none can inject a line.
fn header_value(field: &str, value: &str) -> Result<(), Error> {
    if value.bytes().all(|b| b.is_ascii_graphic() || b == b' ') && value.trim() == value {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{field} must be visible ASCII without leading or trailing spaces"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_max_and_jitter_only_shortens() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            jitter: 0.5,
        };
        for (attempt, base) in [(0, 100), (1, 200), (3, 800), (4, 1000), (40, 1000)] {
            let base = Duration::from_millis(base);
            for _ in 0..50 {
                let d = b.delay(attempt);
                assert!(d <= base && d >= base / 2, "{attempt}: {d:?}");
            }
        }
    }

    #[test]
    fn invalid_identities_and_timings_are_rejected() {
        let ok = Options::new(Acceptor::Tcp("127.0.0.1:1".into()), Identity::new("svc"));
        assert!(ok.validate().is_ok());
        let mut bad = ok.clone();
        bad.identity.service = String::new();
        assert!(bad.validate().is_err());
        let mut bad = ok.clone();
        bad.identity.token = Some("t\r\nX-Evil: 1".into());
        assert!(bad.validate().is_err());
        let mut bad = ok.clone();
        bad.backoff.jitter = 2.0;
        assert!(bad.validate().is_err());
        let mut bad = ok;
        bad.handshake_timeout = Duration::ZERO;
        assert!(bad.validate().is_err());
    }
}
