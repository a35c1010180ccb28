//! gRPC's small formats that Sluice reads from peers: `grpc-timeout` (a call's deadline, from
//! clients) and the health protocol's response (from services), and the health request it
//! sends. By hand: one varint field each way does not need a protobuf library.

use std::time::Duration;

/// The deadline a call's `grpc-timeout` sets: 1 to 8 digits and a unit (`H`, `M`, `S`, `m`
/// for milliseconds, `u`, `n`); `None` for anything else (the call then has the route's).
pub fn timeout(bytes: &[u8]) -> Option<Duration> {
    let (&unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The path of the gRPC health protocol's check.
pub const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// A `grpc.health.v1.HealthCheckRequest` for `service`, as one gRPC message (the protobuf
/// encoding of its one field, `string service = 1`, behind the 5-byte message prefix).
pub fn health_request(service: &str) -> Vec<u8> {
    let mut field = Vec::with_capacity(service.len() + 6);
    if !service.is_empty() {
        field.push(0x0a); // field 1, length-delimited
        varint(service.len() as u64, &mut field);
        field.extend_from_slice(service.as_bytes());
    }
    let mut message = Vec::with_capacity(field.len() + 5);
    message.push(0); // not compressed
    message.extend_from_slice(&(field.len() as u32).to_be_bytes());
    message.extend_from_slice(&field);
    message
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Whether a `grpc.health.v1.HealthCheckResponse` (one gRPC message: the 5-byte prefix, then
/// protobuf) says SERVING (`ServingStatus status = 1`, SERVING = 1); else what it says.
pub fn serving(message: &[u8]) -> Result<(), String> {
    let Some((prefix, body)) = message.split_first_chunk::<5>() else {
        return Err("no health response message".to_owned());
    };
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if prefix[0] != 0 || body.len() != len {
        return Err("a malformed (or compressed) health response message".to_owned());
    }
    let mut rest = body;
    let mut status = 0; // UNKNOWN, protobuf's default
    while !rest.is_empty() {
        let key = read_varint(&mut rest).ok_or("a malformed health response")?;
        match (key >> 3, key & 7) {
            (1, 0) => status = read_varint(&mut rest).ok_or("a malformed health status")?,
            (_, 0) => {
                read_varint(&mut rest).ok_or("a malformed health response")?;
            }
            (_, 2) => {
                let n = read_varint(&mut rest).ok_or("a malformed health response")?;
                let n = usize::try_from(n).map_err(|_| "a malformed health response")?;
                rest = rest.get(n..).ok_or("a malformed health response")?;
            }
            (_, 1) => rest = rest.get(8..).ok_or("a malformed health response")?,
            (_, 5) => rest = rest.get(4..).ok_or("a malformed health response")?,
            _ => return Err("a malformed health response".to_owned()),
        }
    }
    match status {
        1 => Ok(()),
        0 => Err("health status UNKNOWN".to_owned()),
        2 => Err("health status NOT_SERVING".to_owned()),
        3 => Err("health status SERVICE_UNKNOWN".to_owned()),
        n => Err(format!("health status {n}")),
    }
}

fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_take_every_unit_and_refuse_the_rest() {
        let t = |s: &'static str| timeout(s.as_bytes());
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("2M"), Some(Duration::from_secs(120)));
        assert_eq!(t("3S"), Some(Duration::from_secs(3)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(t("10n"), Some(Duration::from_nanos(10)));
        for bad in ["", "S", "123456789S", "1s", "-1S", "1.5S", "10 S", "1Z"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn health_requests_encode_the_service() {
        assert_eq!(&health_request("")[..], &[0, 0, 0, 0, 0]);
        let req = health_request("echo.Echo");
        assert_eq!(&req[..7], &[0, 0, 0, 0, 11, 0x0a, 9]);
        assert_eq!(&req[7..], b"echo.Echo");
    }

    #[test]
    fn health_responses_say_serving_or_why_not() {
        assert_eq!(serving(&[0, 0, 0, 0, 2, 0x08, 1]), Ok(()));
        let why = |m: &[u8]| serving(m).err().unwrap_or_default();
        assert!(why(&[0, 0, 0, 0, 2, 0x08, 2]).contains("NOT_SERVING"));
        assert!(why(&[0, 0, 0, 0, 0]).contains("UNKNOWN"));
        // Unknown fields are skipped.
        assert_eq!(serving(&[0, 0, 0, 0, 5, 0x12, 1, b'x', 0x08, 1]), Ok(()));
        for bad in [
            &[][..],
            &[0, 0, 0, 0, 3, 0x08, 1],
            &[1, 0, 0, 0, 2, 0x08, 1],
            &[0, 0, 0, 0, 1, 0x08],
        ] {
            assert!(serving(bad).is_err(), "{bad:?}");
        }
    }
}
