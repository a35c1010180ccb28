//! The Rust SDK against the shared protocol vectors (protocol/vectors/session.json): the bytes
//! it sends, what it makes of every acceptor answer, which identities it refuses, and the
//! fields a service sees in a request on a session. The Go and Python SDKs run the same
//! vectors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_sdk::{serve, Error, Options, Sessions};
use sluice_session::control::{Demand, NodeLine};
use sluice_session::vectors::{self, ReplyCase, ReplyVerdict};
use support::{hello, options, within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

/// What a scripted acceptor saw on one connection: the request head, and what the SDK wrote
/// after the answer (a response, when the answer made the connection a session).
type Seen = (Vec<u8>, Vec<u8>);

/// An acceptor that answers every request head with `answer`, closes its side (a whole `101` only
/// once `release` is notified, so that the test can see the session registered), and reports
/// what it saw once the SDK has closed the connection too.
async fn scripted(answer: Vec<u8>) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>, Arc<Notify>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let release2 = release.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let release = release2.clone();
            tokio::spawn(answer_one(stream, answer.clone(), tx.clone(), release));
        }
    });
    (addr, rx, release)
}

async fn answer_one(
    mut stream: TcpStream,
    answer: Vec<u8>,
    seen: mpsc::UnboundedSender<Seen>,
    release: Arc<Notify>,
) {
    let Some(head) = read_head(&mut stream).await else {
        return;
    };
    let _ = stream.write_all(&answer).await;
    let mut back = Vec::new();
    let whole_101 = answer.starts_with(b"HTTP/1.1 101") && answer.ends_with(b"\r\n\r\n");
    if whole_101 {
        // Until released, or until the SDK closes a 101 it does not take for a session.
        tokio::select! {
            () = release.notified() => {}
            _ = stream.read_to_end(&mut back) => {}
        }
    }
    let _ = stream.shutdown().await;
    let _ = stream.read_to_end(&mut back).await;
    let _ = seen.send((head, back));
}

/// Reads an HTTP head up to its blank line, byte by byte so that nothing past it is consumed;
/// `None` if the connection ends first.
async fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(head)
}

#[tokio::test]
async fn registration_and_drain_requests_are_the_vector_bytes() {
    let v = vectors::load().unwrap();
    // The SDK always says its capacity; HTTP/2 sessions among them.
    assert!(v
        .registrations
        .iter()
        .any(|c| c.capacity.is_some() && c.streams.is_some()));
    for case in v.registrations.iter().filter(|c| c.capacity.is_some()) {
        let (addr, mut seen, _) = scripted(Vec::new()).await;
        let mut opts = Options::new(addr, case.identity.clone().into());
        opts.capacity = case.capacity.unwrap() as usize;
        opts.streams = case.streams;
        let sessions = serve(opts, tower::service_fn(hello)).unwrap();
        assert_eq!(
            within(seen.recv()).await.unwrap().0,
            case.bytes.0,
            "{}",
            case.name
        );
        drop(sessions);
    }
    for case in &v.drains {
        let (addr, mut seen, _) = scripted(Vec::new()).await;
        let mut opts = Options::new(addr, case.identity.clone().into());
        opts.capacity = 0;
        let sessions = serve(opts, tower::service_fn(hello)).unwrap();
        let _ = sessions.shutdown().await;
        assert_eq!(
            within(seen.recv()).await.unwrap().0,
            case.bytes.0,
            "{}",
            case.name
        );
    }
}

/// Registers one session (HTTP/2 with `streams`) against an acceptor that answers
/// `case.bytes`; returns the first outcome and what the SDK wrote after the answer.
async fn register_against(case: &ReplyCase, streams: Option<u32>) -> (Result<(), Error>, Vec<u8>) {
    let (addr, mut seen, release) = scripted(case.bytes.0.clone()).await;
    let mut opts = options(addr, 1);
    opts.streams = streams;
    let sessions = serve(opts, tower::service_fn(hello)).unwrap();
    let mut status = sessions.subscribe();
    let status = within(status.wait_for(|s| s.registrations == 1 || s.last_error.is_some()))
        .await
        .unwrap()
        .clone();
    release.notify_one();
    let (_head, back) = within(seen.recv()).await.unwrap();
    drop(sessions);
    (status.last_error.map_or(Ok(()), Err), back)
}

async fn drain_against(case: &ReplyCase) -> Result<(), Error> {
    let (addr, _seen, _) = scripted(case.bytes.0.clone()).await;
    let sessions: Sessions = serve(options(addr, 0), tower::service_fn(hello)).unwrap();
    within(sessions.shutdown()).await
}

#[tokio::test]
async fn every_acceptor_answer_is_read_as_the_vectors_say() {
    let v = vectors::load().unwrap();
    assert!(v.replies.len() >= 10);
    assert!(
        v.replies
            .iter()
            .filter(|c| c.request == "register-h2")
            .count()
            >= 5
    );
    for case in &v.replies {
        let name = &case.name;
        let outcome = match case.request.as_str() {
            "register" => {
                let (outcome, back) = register_against(case, None).await;
                if let ReplyVerdict::Session { rest } = &case.expect {
                    // The bytes past the 101 are a request: the session must answer it.
                    let answered = back.starts_with(b"HTTP/1.1 200");
                    assert_eq!(answered, !rest.0.is_empty(), "{name}: {back:?}");
                }
                outcome
            }
            "register-h2" => {
                let (outcome, back) = register_against(case, Some(7)).await;
                if let ReplyVerdict::Session { .. } = &case.expect {
                    // The session is HTTP/2's server side: it opens with its SETTINGS, which
                    // allow the declared streams.
                    let settings = settings_frame(&back);
                    assert_eq!(settings, Some(Some(7)), "{name}: {back:?}");
                } else {
                    assert_eq!(back, b"", "{name}: the SDK spoke on a session it refused");
                }
                outcome
            }
            "drain" => drain_against(case).await,
            other => panic!("{name}: unknown request {other}"),
        };
        match (&case.expect, outcome) {
            (ReplyVerdict::Session { .. } | ReplyVerdict::Drained, Ok(())) => {}
            (
                ReplyVerdict::Refused {
                    status,
                    retryable,
                    reason,
                },
                Err(e),
            ) => {
                assert!(
                    matches!(e, Error::Refused { status: s, .. } if s == *status),
                    "{name}: {e}"
                );
                // The acceptor's reason is shown, not just its status.
                if let Some(reason) = reason {
                    assert!(e.to_string().contains(reason.as_str()), "{name}: {e}");
                }
                assert_eq!(e.is_retryable(), *retryable, "{name}");
            }
            (ReplyVerdict::Error { retryable }, Err(e)) => {
                assert!(!matches!(e, Error::Refused { .. }), "{name}: {e}");
                assert_eq!(e.is_retryable(), *retryable, "{name}");
            }
            (want, got) => panic!("{name}: expected {want:?}, got {got:?}"),
        }
    }
}

/// `Some(max_concurrent_streams)` if `bytes` open with an HTTP/2 SETTINGS frame (RFC 9113
/// §6.5), `None` if not.
fn settings_frame(bytes: &[u8]) -> Option<Option<u32>> {
    let (head, rest) = bytes.split_at_checked(9)?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    // Type 4, no ACK flag, stream 0.
    if head[3..] != [4, 0, 0, 0, 0, 0] || len % 6 != 0 || rest.len() < len {
        return None;
    }
    let max_streams = rest[..len]
        .chunks(6)
        .find(|setting| setting[..2] == [0, 3])
        .map(|setting| u32::from_be_bytes(setting[2..].try_into().unwrap()));
    Some(max_streams)
}

#[tokio::test]
async fn identities_are_accepted_or_refused_as_the_vectors_say() {
    let v = vectors::load().unwrap();
    for case in &v.options {
        let mut opts = Options::new(
            "127.0.0.1:9".parse::<SocketAddr>().unwrap(),
            case.identity.clone().into(),
        );
        opts.capacity = 0;
        let result = serve(opts, tower::service_fn(hello));
        match result {
            Ok(_) => assert!(case.valid, "{}: accepted", case.name),
            Err(Error::Config(_)) => assert!(!case.valid, "{}: refused", case.name),
            Err(e) => panic!("{}: {e}", case.name),
        }
    }
}

#[test]
fn client_addresses_are_reported_as_the_vectors_say() {
    use sluice_sdk::ClientAddr;
    let v = vectors::load().unwrap();
    assert!(v.client_addresses.len() >= 10);
    let peer: SocketAddr = "192.0.2.1:7070".parse().unwrap();
    for case in &v.client_addresses {
        let mut headers = http::HeaderMap::new();
        for value in &case.values {
            headers.append("sluice-client-addr", value.parse().unwrap());
        }
        let got = ClientAddr::from_headers(&headers, Some(peer)).unwrap();
        let expected = case.client.clone().unwrap_or_else(|| peer.to_string());
        assert_eq!(got.to_string(), expected, "{}", case.name);
    }
}

/// The fields the app's service saw in `request`, written by an acceptor on a session once
/// the SDK has it registered, as the proxy forwards a client's request; the service answers.
async fn fields_the_app_sees(request: &[u8]) -> http::HeaderMap {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let app = tower::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let _ = tx.send(req.headers().clone());
        async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
    });
    let sessions = serve(options(listener.local_addr().unwrap(), 1), app).unwrap();
    let (mut stream, _) = within(listener.accept()).await.unwrap();
    within(read_head(&mut stream)).await.unwrap();
    let switched = sluice_session::Reply::switching_protocols();
    stream.write_all(&switched).await.unwrap();
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.registered == 1))
        .await
        .unwrap();
    stream.write_all(request).await.unwrap();
    let answer = within(read_head(&mut stream)).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200 "), "{answer:?}");
    drop(sessions);
    seen.try_recv().unwrap()
}

/// Bytes as the vectors write them, one character each, so that a failure reads as text.
fn latin1(bytes: &[u8]) -> String {
    bytes.iter().copied().map(char::from).collect()
}

#[tokio::test]
async fn the_app_sees_the_fields_as_the_vectors_say() {
    let v = vectors::load().unwrap();
    assert!(v.app_fields.len() >= 6);
    for case in &v.app_fields {
        let headers = fields_the_app_sees(&case.request.0).await;
        for (field, values) in &case.fields {
            let got: Vec<String> = headers
                .get_all(field)
                .iter()
                .map(|v| latin1(v.as_bytes()))
                .collect();
            let want: Vec<String> = values.iter().map(|v| latin1(&v.0)).collect();
            assert_eq!(got, want, "{}: {field}", case.name);
        }
    }
}

/// Options for one node with a control link at `addr` (a list of one entry).
fn one_node(addr: SocketAddr, identity: sluice_sdk::Identity, capacity: usize) -> Options {
    let mut opts = options(sluice_sdk::Acceptor::List(vec![addr.to_string()]), capacity);
    opts.identity = identity;
    opts
}

#[tokio::test]
async fn control_link_requests_are_the_vector_bytes() {
    let v = vectors::load().unwrap();
    assert!(!v.controls.is_empty());
    for case in &v.controls {
        // No answer: the first connection of a node that is not live yet is its link.
        let (addr, mut seen, _) = scripted(Vec::new()).await;
        let opts = one_node(
            addr,
            case.identity.clone().into(),
            case.capacity.unwrap() as usize,
        );
        let sessions = serve(opts, tower::service_fn(hello)).unwrap();
        let (head, _) = within(seen.recv()).await.unwrap();
        // Every link of this SDK says it splits per service; a vector without the header
        // pins the rest of the request.
        let want = match case.split.as_deref() {
            Some("service") => case.bytes.0.clone(),
            None => with_split_by_service(&case.bytes.0),
            Some(other) => panic!("{}: Sluice-Split {other:?}", case.name),
        };
        assert_eq!(latin1(&head), latin1(&want), "{}", case.name);
        drop(sessions);
    }
}

/// A control request's bytes with `Sluice-Split: service` as its last field.
fn with_split_by_service(head: &[u8]) -> Vec<u8> {
    let end = head.len() - b"\r\n".len();
    assert!(head.ends_with(b"\r\n\r\n"), "{head:?}");
    [&head[..end], b"Sluice-Split: service\r\n\r\n"].concat()
}

#[tokio::test]
async fn every_control_link_answer_is_read_as_the_vectors_say() {
    use sluice_session::vectors::ControlReplyVerdict as V;
    let v = vectors::load().unwrap();
    assert!(v.control_replies.len() >= 5);
    for case in &v.control_replies {
        let name = &case.name;
        let (addr, mut seen, release) = scripted(case.bytes.0.clone()).await;
        let sessions = serve(
            one_node(addr, support::identity(), 3),
            tower::service_fn(hello),
        )
        .unwrap();
        let mut status = sessions.subscribe();
        match &case.expect {
            V::Control { rest } if rest.0.is_empty() => {
                // The link is up: the SDK says its capacity on it at once.
                release.notify_one();
                let (_, back) = within(seen.recv()).await.unwrap();
                assert!(back.starts_with(b"CAPACITY 3\n"), "{name}: {back:?}");
            }
            V::Control { rest } => {
                // Its first lines were read along with the 101: the node is live at once.
                let line = std::str::from_utf8(&rest.0).unwrap().trim_end();
                let sample = match sluice_session::NodeLine::parse(line).unwrap() {
                    sluice_session::NodeLine::Demand(d) => d.sample(),
                    other => panic!("{name}: {other:?}"),
                };
                let s = within(status.wait_for(|s| s.nodes.first().is_some_and(|n| n.live)))
                    .await
                    .unwrap();
                assert_eq!(s.nodes[0].demand, sample, "{name}");
                release.notify_one();
            }
            V::Unsupported => {
                let s = within(status.wait_for(|s| s.nodes.first().is_some_and(|n| n.live)))
                    .await
                    .unwrap();
                assert_eq!(
                    (s.nodes[0].link, s.nodes[0].demand),
                    ("unsupported", 1.0),
                    "{name}"
                );
            }
            V::Refused {
                status: code,
                retryable,
            } => {
                let s = within(status.wait_for(|s| s.last_error.is_some()))
                    .await
                    .unwrap()
                    .clone();
                let e = s.last_error.unwrap();
                assert!(
                    matches!(e, Error::Refused { status, .. } if status == *code),
                    "{name}: {e}"
                );
                assert_eq!(e.is_retryable(), *retryable, "{name}");
                assert!(!s.nodes[0].live, "{name}");
                if *code == 410 {
                    let s = within(status.wait_for(|s| s.nodes[0].link == "drained")).await;
                    assert!(s.is_ok(), "{name}");
                }
            }
            V::Error { retryable } => {
                let s = within(status.wait_for(|s| s.last_error.is_some()))
                    .await
                    .unwrap()
                    .clone();
                let e = s.last_error.unwrap();
                assert!(!matches!(e, Error::Refused { .. }), "{name}: {e}");
                assert_eq!(e.is_retryable(), *retryable, "{name}");
                release.notify_one();
            }
        }
        drop(sessions);
    }
}

#[tokio::test]
async fn node_lines_are_read_as_the_vectors_say() {
    let v = vectors::load().unwrap();
    let cases: Vec<_> = v
        .control_lines
        .iter()
        .filter(|c| c.from == "node")
        .collect();
    assert!(cases.len() >= 5);
    for case in cases {
        let line = &case.line;
        let (mut fake, addr) = support::Fake::node().await;
        let sessions = serve(
            one_node(addr, support::identity(), 0),
            tower::service_fn(hello),
        )
        .unwrap();
        let mut link = fake.link().await;
        link.send_raw(format!("{line}\n").as_bytes()).await;
        let mut status = sessions.subscribe();
        let expect = &case.parse;
        if let Some(d) = expect.get("demand") {
            let sample: u64 = ["in_flight", "queued", "refused"]
                .iter()
                .map(|k| d[*k].as_u64().unwrap())
                .sum();
            let s = within(status.wait_for(|s| s.nodes.first().is_some_and(|n| n.live)))
                .await
                .unwrap();
            assert_eq!(s.nodes[0].demand, sample as f64, "{line:?}");
        } else if let Some(floor) = expect.get("floor") {
            let floor = floor.as_bool().unwrap();
            let idle = NodeLine::Demand(Demand::default());
            let mut floor_is = async |want: bool| {
                let s =
                    status.wait_for(|s| s.nodes.first().is_some_and(|n| n.live && n.floor == want));
                let s = within(s).await.unwrap().clone();
                assert_eq!(s.nodes[0].link, "up", "{line:?}");
            };
            if floor {
                // Every link starts asking for the floor: FLOOR 1 shows after a FLOOR 0.
                link.send(NodeLine::Floor(false)).await;
                link.send(idle).await;
                floor_is(false).await;
                link.send_raw(format!("{line}\n").as_bytes()).await;
            }
            link.send(idle).await;
            floor_is(floor).await;
        } else if expect.get("draining").is_some() {
            let s =
                within(status.wait_for(|s| s.nodes.first().is_some_and(|n| n.link == "draining")))
                    .await
                    .unwrap();
            assert!(!s.nodes[0].live, "{line:?}");
        } else {
            assert_eq!(expect, "invalid", "{line:?}");
            // A line that is not the protocol closes the link; the SDK dials a new one.
            link.closed().await;
            let _again = fake.link().await;
            assert!(!sessions.nodes()[0].live, "{line:?}");
        }
        drop(sessions);
    }
}

#[test]
fn acceptor_addresses_name_what_the_vectors_say() {
    use sluice_sdk::Acceptor;
    let v = vectors::load().unwrap();
    assert!(v.addresses.len() >= 10);
    for case in &v.addresses {
        let got = match Acceptor::parse(&case.address) {
            Ok(Acceptor::Tcp(a)) => serde_json::json!({ "single": a }),
            Ok(Acceptor::Dns { name, port }) => {
                serde_json::json!({"dns": {"name": name, "port": port}})
            }
            Ok(Acceptor::List(all)) => serde_json::json!({ "list": all }),
            Ok(other) => panic!("{}: {other:?}", case.name),
            Err(_) => serde_json::json!("invalid"),
        };
        assert_eq!(got, case.expect, "{}", case.name);
    }
}
