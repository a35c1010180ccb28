//! The codec against the shared protocol vectors (protocol/vectors/session.json): it encodes
//! every registration and drain to exactly the bytes the SDKs send, parses them back, gives
//! every hello its verdict, and reads every acceptor answer as the vectors say; and the
//! app-field vectors list exactly the field lines their requests hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_session::vectors::{self, ParseVerdict, ReplyVerdict, VectorIdentity};
use sluice_session::*;

fn load() -> vectors::Vectors {
    vectors::load().unwrap()
}

fn identity(v: &VectorIdentity) -> Identity {
    v.clone().into()
}

#[test]
fn registrations_encode_to_the_vector_bytes_and_parse_back() {
    let v = load();
    assert!(!v.registrations.is_empty());
    for case in &v.registrations {
        let reg = Registration {
            identity: identity(&case.identity),
            capacity: case.capacity,
            streams: case.streams,
        };
        assert_eq!(reg.encode(), case.bytes.0, "{}", case.name);
        let parsed = parse_hello(&case.bytes.0, v.acceptor.max_handshake_size).unwrap();
        let expected = Parsed::Complete(Hello::Register(reg), case.bytes.0.len());
        assert_eq!(parsed, expected, "{}", case.name);
    }
}

#[test]
fn drains_encode_to_the_vector_bytes_and_parse_back() {
    let v = load();
    assert!(!v.drains.is_empty());
    for case in &v.drains {
        let drain = Drain {
            identity: identity(&case.identity),
        };
        assert_eq!(drain.encode(), case.bytes.0, "{}", case.name);
        let parsed = parse_hello(&case.bytes.0, v.acceptor.max_handshake_size).unwrap();
        let expected = Parsed::Complete(Hello::Drain(drain), case.bytes.0.len());
        assert_eq!(parsed, expected, "{}", case.name);
    }
}

#[test]
fn every_hello_gets_the_vector_verdict() {
    let v = load();
    assert!(v.hellos.len() >= 20);
    for case in &v.hellos {
        let got = parse_hello(&case.bytes.0, v.acceptor.max_handshake_size);
        let name = &case.name;
        match (&case.parse, got) {
            (ParseVerdict::Partial, Ok(Parsed::Partial)) => {}
            (ParseVerdict::Register { register, consumed }, Ok(Parsed::Complete(hello, len))) => {
                let expected = Registration {
                    identity: identity(&register.identity),
                    capacity: register.capacity,
                    streams: register.streams,
                };
                assert_eq!(hello, Hello::Register(expected), "{name}");
                assert_eq!(len, consumed.unwrap_or(case.bytes.0.len()), "{name}");
            }
            (ParseVerdict::Drain { drain }, Ok(Parsed::Complete(hello, len))) => {
                let expected = Drain {
                    identity: identity(&drain.identity),
                };
                assert_eq!(hello, Hello::Drain(expected), "{name}");
                assert_eq!(len, case.bytes.0.len(), "{name}");
            }
            (ParseVerdict::Reject { reject }, Err(r)) => {
                assert_eq!(r.status, reject.status, "{name}: {r}");
                assert!(r.reason.contains(&reject.reason), "{name}: {r}");
            }
            (want, got) => panic!("{name}: expected {want:?}, got {got:?}"),
        }
    }
}

/// The SDK's reading of an answer: what `parse_reply` says, after the connection ended.
fn outcome(request: &str, bytes: &[u8]) -> Result<(Reply, Vec<u8>), ()> {
    match parse_reply(bytes) {
        Ok(Parsed::Complete(reply, len)) => match (request, &reply) {
            ("register", Reply::Switched | Reply::Refused(_))
            | ("register-h2", Reply::SwitchedH2 | Reply::Refused(_))
            | ("drain", Reply::Drained | Reply::Refused(_)) => Ok((reply, bytes[len..].to_vec())),
            _ => Err(()),
        },
        // The connection ended before a whole head: an error, as is anything unparseable.
        Ok(Parsed::Partial) | Err(_) => Err(()),
    }
}

#[test]
fn every_reply_reads_as_the_vectors_say() {
    let v = load();
    assert!(v.replies.len() >= 10);
    for case in &v.replies {
        let got = outcome(&case.request, &case.bytes.0);
        let name = &case.name;
        match (&case.expect, got) {
            (ReplyVerdict::Session { rest }, Ok((Reply::Switched | Reply::SwitchedH2, after))) => {
                assert_eq!(after, rest.0, "{name}");
            }
            (ReplyVerdict::Drained, Ok((Reply::Drained, _))) => {}
            (ReplyVerdict::Refused { status, .. }, Ok((Reply::Refused(got), _))) => {
                assert_eq!(got, *status, "{name}");
            }
            (ReplyVerdict::Error { .. }, Err(())) => {}
            (want, got) => panic!("{name}: expected {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn the_acceptor_encodes_refusals_as_the_vectors_show_them() {
    // Every refusal vector whose bytes came from an acceptor must be what this acceptor sends.
    let v = load();
    let ours = [
        Rejection::bad_request("missing Sluice-Service").encode(),
        Rejection::unauthorized().encode(),
        Rejection::unknown_service("nope").encode(),
        Rejection::limited("sessions of this instance").encode(),
        Rejection::unavailable("shutting down").encode(),
        Rejection::drained("api", "api-1").encode(),
        Reply::switching_protocols(),
        Reply::switching_protocols_h2(),
        Rejection::lends_http1_only().encode(),
        Reply::drained(),
    ];
    for bytes in ours {
        let found = v.replies.iter().any(|c| c.bytes.0 == bytes);
        assert!(
            found,
            "{:?} is not among the reply vectors",
            String::from_utf8_lossy(&bytes)
        );
    }
}

#[test]
fn client_addresses_are_trusted_whole_or_not_at_all() {
    let v = load();
    assert!(v.client_addresses.len() >= 10);
    for case in &v.client_addresses {
        let got = match case.values.as_slice() {
            [one] => parse_client_addr(one.as_bytes()),
            _ => None,
        };
        let got = got.map(client_addr_value);
        assert_eq!(got, case.client, "{}", case.name);
    }
}

/// The app-field vectors are sound: each request is one whole HTTP/1.1 head, and the values
/// listed are exactly its field lines of that name, in order, so an SDK that agrees with the
/// vector passes the fields on as they were sent.
#[test]
fn app_fields_are_the_field_lines_of_the_request() {
    let v = load();
    assert!(v.app_fields.len() >= 6);
    for case in &v.app_fields {
        let name = &case.name;
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = req.parse(&case.request.0);
        assert_eq!(
            parsed,
            Ok(httparse::Status::Complete(case.request.0.len())),
            "{name}"
        );
        assert!(!case.fields.is_empty(), "{name}");
        for (field, values) in &case.fields {
            assert_eq!(field, &field.to_ascii_lowercase(), "{name}");
            let sent: Vec<&[u8]> = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(field))
                .map(|h| h.value)
                .collect();
            let listed: Vec<&[u8]> = values.iter().map(|v| &v.0[..]).collect();
            assert_eq!(sent, listed, "{name}: {field}");
        }
    }
}

#[test]
fn control_requests_encode_to_the_vector_bytes_and_parse_back() {
    let v = load();
    assert!(!v.controls.is_empty());
    for case in &v.controls {
        let reg = Registration {
            identity: identity(&case.identity),
            capacity: case.capacity,
            streams: case.streams,
        };
        let split = match case.split.as_deref() {
            Some("service") => SplitBy::Service,
            None => SplitBy::Instance,
            Some(other) => panic!("{}: unknown split {other}", case.name),
        };
        assert_eq!(
            reg.encode_control_split(split),
            case.bytes.0,
            "{}",
            case.name
        );
        let parsed = parse_hello(&case.bytes.0, v.acceptor.max_handshake_size).unwrap();
        let expected = Parsed::Complete(Hello::Control(reg, split), case.bytes.0.len());
        assert_eq!(parsed, expected, "{}", case.name);
    }
}

#[test]
fn control_lines_read_as_the_vectors_say() {
    use sluice_session::control::{Demand, NodeLine, ServiceLine};
    let v = load();
    assert!(v.control_lines.len() >= 10);
    for case in &v.control_lines {
        let expected = &case.parse;
        let line = &case.line;
        let got = match case.from.as_str() {
            "node" => match NodeLine::parse(line) {
                Ok(NodeLine::Demand(Demand {
                    in_flight,
                    queued,
                    refused,
                    sessions,
                })) => {
                    serde_json::json!({"demand": {"in_flight": in_flight, "queued": queued, "refused": refused, "sessions": sessions}})
                }
                Ok(NodeLine::Draining) => serde_json::json!({"draining": true}),
                Ok(NodeLine::Floor(on)) => serde_json::json!({ "floor": on }),
                Err(_) => serde_json::json!("invalid"),
            },
            "service" => match ServiceLine::parse(line) {
                Ok(ServiceLine::Retire(n)) => serde_json::json!({ "retire": n }),
                Ok(ServiceLine::Capacity(n)) => serde_json::json!({ "capacity": n }),
                Err(_) => serde_json::json!("invalid"),
            },
            other => panic!("unknown sender {other}"),
        };
        assert_eq!(&got, expected, "{line:?}");
        if got != "invalid" {
            let again = match case.from.as_str() {
                "node" => NodeLine::parse(line).unwrap().to_string(),
                _ => ServiceLine::parse(line).unwrap().to_string(),
            };
            assert_eq!(&again, line, "re-encoded");
        }
    }
}

#[test]
fn splits_give_the_vector_targets() {
    use sluice_session::split::{targets, NodeView};
    let v = load();
    assert!(v.splits.len() >= 10);
    for case in &v.splits {
        let nodes: Vec<NodeView> = case
            .nodes
            .iter()
            .map(|n| NodeView {
                live: n.live,
                demand: n.demand,
                held: n.held,
                floor: n.floor,
            })
            .collect();
        assert_eq!(
            targets(case.capacity, &nodes, true, case.quiet).0,
            case.targets,
            "{}",
            case.name
        );
    }
}

#[test]
fn addresses_name_what_the_vectors_say() {
    let v = load();
    assert!(!v.addresses.is_empty());
    for case in &v.addresses {
        let got = match Address::parse(&case.address) {
            Ok(Address::Single(a)) => serde_json::json!({ "single": a }),
            Ok(Address::Dns { name, port }) => {
                serde_json::json!({"dns": {"name": name, "port": port}})
            }
            Ok(Address::List(all)) => serde_json::json!({ "list": all }),
            Err(_) => serde_json::json!("invalid"),
        };
        assert_eq!(got, case.expect, "{}", case.name);
    }
}

#[test]
fn control_replies_read_as_the_vectors_say() {
    use sluice_session::vectors::ControlReplyVerdict as V;
    let v = load();
    for case in &v.control_replies {
        let got = parse_reply(&case.bytes.0);
        let name = &case.name;
        match (&case.expect, got) {
            (V::Control { rest }, Ok(Parsed::Complete(Reply::Control, len))) => {
                assert_eq!(&case.bytes.0[len..], &rest.0[..], "{name}");
            }
            (V::Unsupported, Ok(Parsed::Complete(Reply::Refused(400), _))) => {}
            (V::Refused { status, .. }, Ok(Parsed::Complete(Reply::Refused(s), _))) => {
                assert_eq!(*status, s, "{name}");
            }
            (V::Error { .. }, Ok(Parsed::Complete(Reply::Switched, _)) | Err(_)) => {}
            (expected, got) => panic!("{name}: expected {expected:?}, got {got:?}"),
        }
    }
}
