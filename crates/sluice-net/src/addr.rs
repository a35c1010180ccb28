//! How per-address limits count a client.

use std::net::IpAddr;

/// The address limits count a client by (`rate_limit`, `max_connections_per_client`, the
/// acceptor's `handshakes_per_second` and control links): an IPv4 address (also when it
/// arrives IPv4-mapped), or an IPv6 address's /64 — a host or a home network gets a whole
/// /64, and would otherwise be 2^64 clients.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn an_ipv6_slash_64_is_one_client_and_mapped_ipv4_is_ipv4() {
        assert_eq!(
            client_key(ip("2001:db8::1")),
            client_key(ip("2001:db8::ffff:2"))
        );
        assert_ne!(
            client_key(ip("2001:db8::1")),
            client_key(ip("2001:db8:0:1::1"))
        );
        assert_eq!(client_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(client_key(ip("10.0.0.1")), ip("10.0.0.1"));
    }
}
