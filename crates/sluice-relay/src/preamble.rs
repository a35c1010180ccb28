//! The tunnel preamble: the first bytes an entry relay sends to a tunnel end.
//!
//! Two parts, so that a pooled connection can be authenticated before any client arrives and
//! told its target only when one does:
//!
//! ```text
//! hello:  "SLRY" | version (1) | token length (1..=255) | token
//! target: family (4 or 6) | address (4 or 16 bytes) | port (2, big-endian)
//! ```
//!
//! Both parsers are incremental (`Ok(None)`: need more bytes), never read past what they are
//! given, and never panic on any input (fuzzed by `fuzz/fuzz_targets/relay_preamble.rs`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The magic that opens every hello.
pub const MAGIC: &[u8; 4] = b"SLRY";
/// The one version this crate speaks.
pub const VERSION: u8 = 1;
/// The longest hello: magic, version, length, a 255-byte token.
pub const MAX_HELLO: usize = 4 + 1 + 1 + 255;
/// The longest target: family, an IPv6 address, a port.
pub const MAX_TARGET: usize = 1 + 16 + 2;

/// Why a preamble was refused. The connection is closed without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PreambleError {
    /// The first four bytes are not `SLRY`: not a Sluice relay.
    #[error("not a relay preamble (bad magic)")]
    BadMagic,
    /// A version this end does not speak.
    #[error("unsupported preamble version {0}")]
    Version(u8),
    /// A hello with a zero-length token.
    #[error("empty token")]
    EmptyToken,
    /// A target family other than 4 or 6.
    #[error("unknown address family {0}")]
    Family(u8),
}

/// A parsed hello: the token, borrowed from the input.
#[derive(Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    /// The token the peer presents.
    pub token: &'a [u8],
}

/// Parses a hello at the start of `buf`: the hello and the bytes it took, or `None` if `buf`
/// is a valid but incomplete prefix.
pub fn parse_hello(buf: &[u8]) -> Result<Option<(Hello<'_>, usize)>, PreambleError> {
    let magic_len = buf.len().min(MAGIC.len());
    if buf[..magic_len] != MAGIC[..magic_len] {
        return Err(PreambleError::BadMagic);
    }
    let (Some(&version), Some(&len)) = (buf.get(4), buf.get(5)) else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(PreambleError::Version(version));
    }
    if len == 0 {
        return Err(PreambleError::EmptyToken);
    }
    let end = 6 + usize::from(len);
    Ok(buf.get(6..end).map(|token| (Hello { token }, end)))
}

/// Parses a target at the start of `buf`, like [`parse_hello`].
pub fn parse_target(buf: &[u8]) -> Result<Option<(SocketAddr, usize)>, PreambleError> {
    let Some(&family) = buf.first() else {
        return Ok(None);
    };
    let addr_len = match family {
        4 => 4,
        6 => 16,
        other => return Err(PreambleError::Family(other)),
    };
    let end = 1 + addr_len + 2;
    let Some(body) = buf.get(1..end) else {
        return Ok(None);
    };
    let (addr, port) = body.split_at(addr_len);
    let ip = match <[u8; 4]>::try_from(addr) {
        Ok(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        Err(_) => {
            let mut v6 = [0; 16];
            v6.copy_from_slice(addr);
            IpAddr::V6(Ipv6Addr::from(v6))
        }
    };
    let port = u16::from_be_bytes([port[0], port[1]]);
    Ok(Some((SocketAddr::new(ip, port), end)))
}

/// Appends a hello carrying `token` (1..=255 bytes; the configuration guarantees it).
pub fn encode_hello(token: &[u8], out: &mut Vec<u8>) {
    let len = u8::try_from(token.len()).unwrap_or(u8::MAX);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[VERSION, len]);
    out.extend_from_slice(&token[..usize::from(len)]);
}

/// Appends a target naming `addr`.
pub fn encode_target(addr: SocketAddr, out: &mut Vec<u8>) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(token: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_hello(token, &mut out);
        out
    }

    #[test]
    fn hello_round_trips_and_reports_its_length() {
        let mut buf = hello(b"s3cret");
        buf.extend_from_slice(b"after");
        let (h, used) = parse_hello(&buf).expect("valid").expect("complete");
        assert_eq!((h.token, used), (&b"s3cret"[..], 12));
    }

    #[test]
    fn every_prefix_of_a_hello_asks_for_more() {
        let buf = hello(b"token");
        for end in 0..buf.len() {
            assert_eq!(parse_hello(&buf[..end]), Ok(None), "prefix of {end}");
        }
    }

    #[test]
    fn malformed_hellos_are_refused() {
        assert_eq!(parse_hello(b"GET / HTTP/1.1"), Err(PreambleError::BadMagic));
        assert_eq!(parse_hello(b"SX"), Err(PreambleError::BadMagic));
        assert_eq!(
            parse_hello(b"SLRY\x02\x01a"),
            Err(PreambleError::Version(2))
        );
        assert_eq!(parse_hello(b"SLRY\x01\x00"), Err(PreambleError::EmptyToken));
    }

    #[test]
    fn targets_round_trip_for_both_families() {
        for addr in ["10.3.0.2:8000", "[2001:db8::7]:443"] {
            let addr: SocketAddr = addr.parse().expect("addr");
            let mut buf = Vec::new();
            encode_target(addr, &mut buf);
            assert_eq!(parse_target(&buf), Ok(Some((addr, buf.len()))));
            assert_eq!(parse_target(&buf[..buf.len() - 1]), Ok(None));
        }
        assert_eq!(parse_target(b"\x05"), Err(PreambleError::Family(5)));
    }
}
