//! `Sluice-Client-Addr`: the address of the client a request on a session came from, as the
//! proxy saw it (the TCP peer of the client's connection). The proxy sets it on every request
//! it sends over a session, replacing any a client sent; SDKs report it where their ecosystem
//! expects a client address and ignore a value that does not parse, whole.

use std::net::{IpAddr, SocketAddr};

/// The request header that carries the client's address on a session.
pub const HEADER_CLIENT_ADDR: &str = "sluice-client-addr";

/// The header value for `addr`: `ip:port`, `[ip]:port` for IPv6, never a zone; an
/// IPv4-mapped IPv6 address is written as the IPv4 address it is.
pub fn client_addr_value(addr: SocketAddr) -> String {
    match addr.ip().to_canonical() {
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
    }
}

/// Parses a header value: `ip:port` or `[ipv6]:port`, nothing around it, no zone, a decimal
/// port of at most 65535. `None` for anything else: a value is trusted whole or not at all.
pub fn parse_client_addr(value: &[u8]) -> Option<SocketAddr> {
    let text = std::str::from_utf8(value).ok()?;
    let (host, port) = text.rsplit_once(':')?;
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    let ip: IpAddr = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => IpAddr::V6(v6.parse().ok()?),
        None => IpAddr::V4(host.parse().ok()?),
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn values_round_trip_and_mapped_addresses_are_written_as_ipv4() {
        for text in ["203.0.113.7:4711", "[2001:db8::1]:443", "127.0.0.1:0"] {
            let addr = parse_client_addr(text.as_bytes()).unwrap();
            assert_eq!(client_addr_value(addr), text);
        }
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:80".parse().unwrap();
        assert_eq!(client_addr_value(mapped), "10.0.0.1:80");
        let scoped: SocketAddr = "[fe80::1%2]:80".parse().unwrap();
        assert_eq!(client_addr_value(scoped), "[fe80::1]:80");
    }
}
