//! The message codec round-trips, refuses what the protocol refuses, and never panics.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use sluice_handoff::*;

fn every_message() -> Vec<Message> {
    vec![
        Message::Hello {
            version: PROTOCOL_VERSION,
            role: Role::Consumer,
        },
        Message::Hello {
            version: 7,
            role: Role::Acceptor,
        },
        Message::Hello {
            version: u32::MAX,
            role: Role::Upgrade,
        },
        Message::Credit {
            cluster: "api".into(),
            slice: "default".into(),
            n: 16,
        },
        Message::Recall {
            cluster: "api".into(),
            slice: "mobile".into(),
            n: 2,
        },
        Message::Session {
            id: u64::MAX,
            cluster: "api".into(),
            slice: "mobile".into(),
            instance: "2001:db8::1".into(),
        },
        Message::Session {
            id: 0,
            cluster: "c".repeat(MAX_WORD),
            slice: "s".repeat(MAX_WORD),
            instance: "i".repeat(MAX_WORD),
        },
        Message::Return { id: 42 },
        Message::Gone { id: 43 },
        Message::Drain {
            instance: "10.0.0.7".into(),
        },
        Message::Slice {
            cluster: "api".into(),
            slice: "default".into(),
            state: SliceState::Empty,
        },
        Message::Slice {
            cluster: "api".into(),
            slice: "mobile".into(),
            state: SliceState::Registered,
        },
        Message::Listener {
            name: "public".into(),
            addr: ListenAddr::Inet("[::1]:8443".parse().unwrap()),
        },
        Message::Listener {
            name: "admin".into(),
            addr: ListenAddr::Unix(PathBuf::from("/run/sluice/admin.sock")),
        },
        Message::Ready,
        Message::Done,
    ]
}

#[test]
fn every_message_round_trips_with_or_without_a_newline() {
    for msg in every_message() {
        let mut line = msg.encode().unwrap();
        assert!(line.len() <= MAX_MESSAGE, "{msg}");
        assert_eq!(Message::parse(&line).unwrap(), msg);
        line.push(b'\n');
        assert_eq!(Message::parse(&line).unwrap(), msg);
    }
}

#[test]
fn the_wire_text_is_as_documented() {
    let cases: &[(Message, &str)] = &[
        (
            Message::Hello {
                version: 1,
                role: Role::Upgrade,
            },
            "HELLO 1 upgrade",
        ),
        (
            Message::Credit {
                cluster: "api".into(),
                slice: "default".into(),
                n: 3,
            },
            "CREDIT api default 3",
        ),
        (
            Message::Recall {
                cluster: "api".into(),
                slice: "default".into(),
                n: 1,
            },
            "RECALL api default 1",
        ),
        (
            Message::Session {
                id: 9,
                cluster: "api".into(),
                slice: "default".into(),
                instance: "10.0.0.1".into(),
            },
            "SESSION 9 api default 10.0.0.1",
        ),
        (
            Message::Slice {
                cluster: "api".into(),
                slice: "default".into(),
                state: SliceState::Empty,
            },
            "SLICE api default empty",
        ),
        (
            Message::Slice {
                cluster: "api".into(),
                slice: "default".into(),
                state: SliceState::Registered,
            },
            "SLICE api default registered",
        ),
        (
            Message::Listener {
                name: "web".into(),
                addr: ListenAddr::Inet("0.0.0.0:80".parse().unwrap()),
            },
            "LISTENER web 0.0.0.0:80",
        ),
        (Message::Ready, "READY"),
    ];
    for (msg, text) in cases {
        assert_eq!(msg.encode().unwrap(), text.as_bytes());
        assert_eq!(msg.to_string(), *text);
    }
}

#[test]
fn exactly_session_return_and_listener_carry_an_fd() {
    let carriers: Vec<&str> = every_message()
        .iter()
        .filter(|m| m.carries_fd())
        .map(Message::verb)
        .collect();
    assert_eq!(
        carriers,
        ["SESSION", "SESSION", "RETURN", "LISTENER", "LISTENER"]
    );
}

#[test]
fn hostile_lines_each_give_their_error() {
    let long_name = "x".repeat(MAX_WORD + 1);
    let too_long = format!("DRAIN {}", "x".repeat(MAX_MESSAGE));
    use ParseError::*;
    let cases: Vec<(Vec<u8>, ParseError)> = vec![
        (b"".to_vec(), Empty),
        (b"\n".to_vec(), Empty),
        (too_long.clone().into_bytes(), TooLong(too_long.len())),
        (
            b"READY\n\n".to_vec(),
            BadByte {
                byte: b'\n',
                offset: 5,
            },
        ),
        (
            b"READY\r\n".to_vec(),
            BadByte {
                byte: b'\r',
                offset: 5,
            },
        ),
        (
            b"DRAIN h\xc3\xa9".to_vec(),
            BadByte {
                byte: 0xc3,
                offset: 7,
            },
        ),
        (b"DRAIN a\x00".to_vec(), BadByte { byte: 0, offset: 7 }),
        (
            b"DRAIN a\tb".to_vec(),
            BadByte {
                byte: b'\t',
                offset: 7,
            },
        ),
        (
            b"DRAIN a\x7f".to_vec(),
            BadByte {
                byte: 0x7f,
                offset: 7,
            },
        ),
        (b"GONE  1".to_vec(), EmptyWord),
        (b" READY".to_vec(), EmptyWord),
        (b"READY ".to_vec(), EmptyWord),
        (b"ready".to_vec(), UnknownVerb("ready".into())),
        (b"HELO 1 consumer".to_vec(), UnknownVerb("HELO".into())),
        (
            b"READY now".to_vec(),
            WordCount {
                verb: "READY",
                expected: 0,
                got: 1,
            },
        ),
        (
            b"GONE".to_vec(),
            WordCount {
                verb: "GONE",
                expected: 1,
                got: 0,
            },
        ),
        (
            b"SESSION 1 api default".to_vec(),
            WordCount {
                verb: "SESSION",
                expected: 4,
                got: 3,
            },
        ),
        (
            b"CREDIT a b 1 2".to_vec(),
            WordCount {
                verb: "CREDIT",
                expected: 3,
                got: 4,
            },
        ),
        (
            b"GONE -1".to_vec(),
            BadNumber {
                field: "id",
                value: "-1".into(),
            },
        ),
        (
            b"GONE +1".to_vec(),
            BadNumber {
                field: "id",
                value: "+1".into(),
            },
        ),
        (
            b"GONE 01".to_vec(),
            BadNumber {
                field: "id",
                value: "01".into(),
            },
        ),
        (
            b"GONE 1e3".to_vec(),
            BadNumber {
                field: "id",
                value: "1e3".into(),
            },
        ),
        (
            b"RETURN 18446744073709551616".to_vec(),
            BadNumber {
                field: "id",
                value: "18446744073709551616".into(),
            },
        ),
        (
            b"HELLO 4294967296 consumer".to_vec(),
            BadNumber {
                field: "version",
                value: "4294967296".into(),
            },
        ),
        (b"CREDIT api default 0".to_vec(), ZeroCredit),
        (b"RECALL api default 0".to_vec(), ZeroCredit),
        (
            b"CREDIT api default many".to_vec(),
            BadNumber {
                field: "n",
                value: "many".into(),
            },
        ),
        (
            format!("DRAIN {long_name}").into_bytes(),
            BadWord { field: "instance" },
        ),
        (
            format!("CREDIT {long_name} s 1").into_bytes(),
            BadWord { field: "cluster" },
        ),
        (b"HELLO 1 admin".to_vec(), BadRole("admin".into())),
        (b"SLICE api default full".to_vec(), BadState("full".into())),
        (
            b"SLICE api default EMPTY".to_vec(),
            BadState("EMPTY".into()),
        ),
        (
            b"SLICE api default".to_vec(),
            WordCount {
                verb: "SLICE",
                expected: 3,
                got: 2,
            },
        ),
        (b"HELLO 1 Consumer".to_vec(), BadRole("Consumer".into())),
        (
            b"LISTENER web localhost:80".to_vec(),
            BadAddr("localhost:80".into()),
        ),
        (
            b"LISTENER web unix:relative.sock".to_vec(),
            BadAddr("unix:relative.sock".into()),
        ),
        (
            b"LISTENER web 10.0.0.1".to_vec(),
            BadAddr("10.0.0.1".into()),
        ),
    ];
    for (line, want) in cases {
        let got = Message::parse(&line);
        assert_eq!(got, Err(want), "{:?}", String::from_utf8_lossy(&line));
    }
}

#[test]
fn invalid_messages_are_not_encoded() {
    let name_with_space = Message::Drain {
        instance: "two words".into(),
    };
    let cases = [
        (name_with_space, ParseError::BadWord { field: "instance" }),
        (
            Message::Credit {
                cluster: String::new(),
                slice: "s".into(),
                n: 1,
            },
            ParseError::BadWord { field: "cluster" },
        ),
        (
            Message::Credit {
                cluster: "c".into(),
                slice: "s".into(),
                n: 0,
            },
            ParseError::ZeroCredit,
        ),
        (
            Message::Session {
                id: 1,
                cluster: "c".into(),
                slice: "é".into(),
                instance: "i".into(),
            },
            ParseError::BadWord { field: "slice" },
        ),
        (
            Message::Listener {
                name: "x".repeat(MAX_WORD + 1),
                addr: ListenAddr::Inet("127.0.0.1:1".parse().unwrap()),
            },
            ParseError::BadWord { field: "name" },
        ),
        (
            Message::Listener {
                name: "web".into(),
                addr: ListenAddr::Unix("/run/my socket".into()),
            },
            ParseError::BadAddr("unix:/run/my socket".into()),
        ),
        (
            Message::Listener {
                name: "web".into(),
                addr: ListenAddr::Unix("relative.sock".into()),
            },
            ParseError::BadAddr("unix:relative.sock".into()),
        ),
    ];
    for (msg, want) in cases {
        assert_eq!(msg.encode(), Err(want), "{msg:?}");
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A tiny deterministic generator: mutations of valid lines plus random noise.
    let valid: Vec<Vec<u8>> = every_message()
        .iter()
        .map(|m| m.encode().unwrap())
        .collect();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let mut bytes = valid[(next() as usize) % valid.len()].clone();
        for _ in 0..(next() % 8) {
            let i = (next() as usize) % bytes.len().max(1);
            match next() % 4 {
                0 if !bytes.is_empty() => bytes[i] = next() as u8,
                1 => bytes.insert(i.min(bytes.len()), b' '),
                2 if !bytes.is_empty() => bytes[i] = b"0123456789 \n:/"[i % 14],
                _ => bytes.extend((0..next() % 600).map(|_| next() as u8)),
            }
        }
        bytes.truncate((next() as usize) % (bytes.len() + 1));
        if let Ok(msg) = Message::parse(&bytes) {
            // Whatever parses re-encodes to a line that parses to the same message.
            assert_eq!(Message::parse(&msg.encode().unwrap()), Ok(msg));
        }
    }
}
