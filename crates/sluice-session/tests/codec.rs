//! The codec round-trips, refuses what the protocol refuses, and never panics.
#![allow(clippy::unwrap_used)]

use sluice_session::*;

fn parse(bytes: &[u8]) -> Result<Parsed<Hello>, Rejection> {
    parse_hello(bytes, DEFAULT_MAX_HEAD)
}

fn registration() -> Registration {
    let mut identity = Identity::new("api");
    identity.slice = "mobile".into();
    identity.instance = Some("api-1".into());
    identity.token = Some("s3cret".into());
    Registration {
        identity,
        capacity: Some(8),
        streams: None,
    }
}

#[test]
fn registration_round_trips_and_reports_its_length() {
    let reg = registration();
    let mut bytes = reg.encode();
    let head_len = bytes.len();
    bytes.extend_from_slice(b"GET / HTTP/1.1\r\n"); // what follows belongs to the session
    assert_eq!(
        parse(&bytes).unwrap(),
        Parsed::Complete(Hello::Register(reg), head_len)
    );
}

#[test]
fn drain_round_trips() {
    let drain = Drain {
        identity: registration().identity,
    };
    let bytes = drain.encode();
    assert_eq!(
        parse(&bytes).unwrap(),
        Parsed::Complete(Hello::Drain(drain), bytes.len())
    );
}

#[test]
fn every_prefix_is_partial() {
    let bytes = registration().encode();
    for cut in 0..bytes.len() {
        assert_eq!(
            parse(&bytes[..cut]).unwrap(),
            Parsed::Partial,
            "cut at {cut}"
        );
    }
}

#[test]
fn defaults_apply_when_optional_headers_are_absent() {
    let bytes = b"GET /.sluice/v1/session HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: sluice-session/1\r\nSluice-Service: api\r\n\r\n";
    let Parsed::Complete(Hello::Register(reg), _) = parse(bytes).unwrap() else {
        panic!()
    };
    assert_eq!(reg.identity, Identity::new("api"));
    assert_eq!(reg.capacity, None);
}

#[test]
fn malformed_handshakes_are_refused_with_their_status() {
    let base =
        "Host: x\r\nConnection: Upgrade\r\nUpgrade: sluice-session/1\r\nSluice-Service: api\r\n";
    let cases: &[(String, u16, &str)] = &[
        ("GET /.sluice/v1/session HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: sluice-session/1\r\n\r\n".to_owned(), 400, "missing Sluice-Service"),
        ("GET /.sluice/v1/session HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSluice-Service: api\r\n\r\n".to_owned(), 400, "unsupported Upgrade"),
        ("GET /.sluice/v1/session HTTP/1.1\r\nHost: x\r\nUpgrade: sluice-session/1\r\nSluice-Service: api\r\n\r\n".to_owned(), 400, "missing Connection: Upgrade"),
        (format!("GET /.sluice/v1/session HTTP/1.0\r\n{base}\r\n"), 400, "HTTP/1.1"),
        (format!("GET /other HTTP/1.1\r\n{base}\r\n"), 400, "expected GET"),
        (format!("POST /.sluice/v1/session HTTP/1.1\r\n{base}\r\n"), 400, "expected GET"),
        (format!("GET /.sluice/v1/session HTTP/1.1\r\n{base}Sluice-Capacity: lots\r\n\r\n"), 400, "Sluice-Capacity"),
        (format!("GET /.sluice/v1/session HTTP/1.1\r\n{base}Sluice-Service: other\r\n\r\n"), 400, "twice"),
        (format!("GET /.sluice/v1/session HTTP/1.1\r\n{base}Authorization: Basic YTpi\r\n\r\n"), 401, "bearer"),
        (format!("GET /.sluice/v1/session HTTP/1.1\r\n{base}Content-Length: 5\r\n\r\n"), 400, "no body"),
        ("NOT HTTP AT ALL\r\n\r\n".to_owned(), 400, "malformed"),
    ];
    for (text, status, reason) in cases {
        let err = parse(text.as_bytes()).unwrap_err();
        assert_eq!(err.status, *status, "{text:?} -> {err}");
        assert!(err.reason.contains(reason), "{text:?} -> {err}");
    }
}

#[test]
fn oversize_heads_are_refused_even_when_incomplete() {
    let mut bytes = b"GET /.sluice/v1/session HTTP/1.1\r\nX-Pad: ".to_vec();
    bytes.resize(DEFAULT_MAX_HEAD + 1, b'a');
    assert_eq!(parse(&bytes).unwrap_err().status, 400);
}

#[test]
fn replies_parse_and_refusals_encode_their_status() {
    let bytes = Reply::switching_protocols();
    assert_eq!(
        parse_reply(&bytes).unwrap(),
        Parsed::Complete(Reply::Switched, bytes.len())
    );
    let bytes = Reply::drained();
    let head_len = bytes.len() - b"draining\n".len();
    assert_eq!(
        parse_reply(&bytes).unwrap(),
        Parsed::Complete(Reply::Drained, head_len)
    );
    for r in [
        Rejection::unauthorized(),
        Rejection::unknown_service("x"),
        Rejection::limited("sessions"),
        Rejection::unavailable("draining"),
    ] {
        let bytes = r.encode();
        assert_eq!(
            parse_reply(&bytes).unwrap(),
            Parsed::Complete(Reply::Refused(r.status), bytes.len() - r.reason.len() - 1)
        );
    }
    let wrong = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";
    assert!(parse_reply(wrong).is_err());
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A tiny deterministic generator: mutations of a valid handshake plus random noise.
    let valid = registration().encode();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let mut bytes = valid.clone();
        for _ in 0..(next() % 8) {
            let i = (next() as usize) % bytes.len();
            bytes[i] = next() as u8;
        }
        bytes.truncate((next() as usize) % (bytes.len() + 1));
        let _ = parse(&bytes);
        let _ = parse_reply(&bytes);
    }
}

#[test]
fn debug_hides_the_token() {
    let text = format!("{:?}", registration());
    assert!(!text.contains("s3cret"), "{text}");
}
