//! `[dns]` and a static cluster's `resolve`: endpoint names that follow DNS.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{Dns, HostPort, Resolve};
use crate::raw::{RawDns, RawResolve};

/// Below this a TTL floor would have the proxy ask DNS many times a second per name.
const MIN_TTL_FLOOR: Duration = Duration::from_millis(100);
/// The port of a nameserver given without one.
const DNS_PORT: u16 = 53;

/// `[dns]`; without it, `/etc/resolv.conf` and `/etc/hosts`.
pub(super) fn dns(ctx: Ctx<'_>, raw: Option<RawDns>) -> Result<Dns, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Dns::default());
    };
    let nameservers = raw
        .nameservers
        .unwrap_or_default()
        .iter()
        .map(|ns| nameserver(ns.get_ref()).map_err(|why| ctx.err(ns.span(), why)))
        .collect::<Result<_, _>>()?;
    Ok(Dns {
        nameservers,
        timeout: raw.timeout.map(|t| t.0),
    })
}

/// `"IP"` (port 53) or `"IP:port"`: a nameserver is an address, never a name to look up.
fn nameserver(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    match text.parse::<IpAddr>() {
        Ok(ip) => Ok(SocketAddr::new(ip, DNS_PORT)),
        Err(_) => Err(format!(
            "nameserver `{text}` is not an address; expected \"IP\" or \"IP:port\" (e.g. \"10.0.0.2\", \"[::1]:53\")"
        )),
    }
}

/// `resolve = true`, `false` or `{ min_ttl, max_ttl }`.
pub(super) fn resolve(
    ctx: Ctx<'_>,
    raw: Option<Spanned<RawResolve>>,
) -> Result<Option<Resolve>, ConfigError> {
    let defaults = Resolve::default();
    let table = match raw.map(Spanned::into_inner) {
        None | Some(RawResolve::On(false)) => return Ok(None),
        Some(RawResolve::On(true)) => return Ok(Some(defaults)),
        Some(RawResolve::Table(table)) => table,
    };
    let min_ttl = match table.min_ttl {
        Some(t) if t.get_ref().0 < MIN_TTL_FLOOR => {
            return Err(ctx.err(t.span(), "`min_ttl` is at least 100ms"));
        }
        t => t.map_or(defaults.min_ttl, |t| t.into_inner().0),
    };
    let max_ttl = match table.max_ttl {
        Some(t) if t.get_ref().0 < min_ttl => {
            return Err(ctx.err(t.span(), "`max_ttl` is shorter than `min_ttl`"));
        }
        // A long `min_ttl` alone must not make the default ceiling invalid.
        t => t.map_or(defaults.max_ttl.max(min_ttl), |t| t.into_inner().0),
    };
    Ok(Some(Resolve { min_ttl, max_ttl }))
}

/// An endpoint of a cluster with `resolve`: an address, or a name to follow.
pub(super) enum Endpoint {
    Addr(SocketAddr),
    Name(HostPort),
}

/// `"IP:port"` or `"host:port"`, not looked up.
pub(super) fn endpoint(text: &str) -> Result<Endpoint, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(Endpoint::Addr(addr));
    }
    let bad =
        |why: &str| format!("endpoint `{text}`: {why}; expected \"host:port\" or \"IP:port\"");
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(bad("no port"));
    };
    let port = port
        .parse::<u16>()
        .map_err(|_| bad("the port is not a number up to 65535"))?;
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let labels = host.strip_suffix('.').unwrap_or(host);
    if host.len() > 253 || !labels.split('.').all(label_ok) {
        return Err(bad("the host is not a DNS name"));
    }
    Ok(Endpoint::Name(HostPort {
        host: host.to_owned(),
        port,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_addresses_or_names_never_looked_up() {
        assert!(matches!(endpoint("10.0.0.1:80"), Ok(Endpoint::Addr(_))));
        assert!(matches!(endpoint("[::1]:80"), Ok(Endpoint::Addr(_))));
        let Ok(Endpoint::Name(name)) = endpoint("api.svc.cluster.local.:8080") else {
            panic!("a name");
        };
        assert_eq!(name.to_string(), "api.svc.cluster.local.:8080");
        for bad in [
            "api",
            "api:http",
            "api:70000",
            "a..b:80",
            "a b:80",
            ":80",
            "-:",
        ] {
            assert!(endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nameservers_are_addresses_with_port_53_by_default() {
        assert_eq!(
            nameserver("10.0.0.2"),
            Ok("10.0.0.2:53".parse().expect("addr"))
        );
        assert_eq!(
            nameserver("[::1]:5353"),
            Ok("[::1]:5353".parse().expect("addr"))
        );
        assert!(nameserver("dns.google").is_err());
    }
}
