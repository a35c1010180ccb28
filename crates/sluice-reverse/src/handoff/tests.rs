//! The standalone acceptor as a consumer sees it, over its real handoff socket: `SLICE`
//! tells consumers when a slice has no session registered and when it has some again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use sluice_handoff::{Handoff, Message, Role, SliceState, SocketAccess};
use sluice_session::{Identity, Registration};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::StandaloneAcceptor;
use crate::tests::{acceptor_options, reverse_options, Fake};
use crate::{BrokerOptions, ReverseCluster};

/// `sluice acceptor` with the cluster `api`; returns where services dial in and its stop.
async fn acceptor(socket: &Path) -> (std::net::SocketAddr, oneshot::Sender<()>) {
    let opts = BrokerOptions {
        acceptor: acceptor_options(),
        path: socket.to_owned(),
        allowed_uids: Vec::new(),
        access: SocketAccess::default(),
    };
    let api = ReverseCluster::new("api", Vec::new(), reverse_options());
    let acceptor = StandaloneAcceptor::<Fake>::bind(&opts, [api])
        .await
        .unwrap();
    let addr = acceptor.acceptor_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(acceptor.run_until(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// A consumer that asked for one session of `api/default`.
async fn consumer(socket: &Path) -> Handoff {
    let conn = Handoff::connect(socket).await.unwrap();
    assert_eq!(conn.hello(Role::Consumer).await.unwrap(), Role::Acceptor);
    let credit = Message::Credit {
        cluster: "api".into(),
        slice: "default".into(),
        n: 1,
    };
    conn.send(&credit, None).await.unwrap();
    conn
}

/// A service registering one session; the stream is the session.
async fn register(acceptor: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(acceptor).await.unwrap();
    let mut identity = Identity::new("api");
    identity.instance = Some("i-1".into());
    let hello = Registration {
        identity,
        capacity: Some(1),
        streams: None,
    };
    stream.write_all(&hello.encode()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.unwrap());
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "), "{head:?}");
    stream
}

async fn next(conn: &Handoff) -> (Message, Option<OwnedFd>) {
    let next = tokio::time::timeout(Duration::from_secs(10), conn.recv()).await;
    next.expect("a message from the acceptor").unwrap()
}

fn slice(state: SliceState) -> Message {
    Message::Slice {
        cluster: "api".into(),
        slice: "default".into(),
        state,
    }
}

#[tokio::test]
async fn consumers_hear_when_a_slice_has_no_session_and_has_some_again() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("h.sock");
    let (addr, _stop) = acceptor(&socket).await;

    // Nothing registered: the first consumer hears it as it asks.
    let a = consumer(&socket).await;
    assert_eq!(next(&a).await.0, slice(SliceState::Empty));

    // A service registers: "registered", and its session is lent on a's credit.
    let _service = register(addr).await;
    let (mut registered, mut lent) = (false, None);
    while !(registered && lent.is_some()) {
        match next(&a).await {
            (msg, None) if msg == slice(SliceState::Registered) => registered = true,
            (Message::Session { id, .. }, Some(fd)) => lent = Some((id, fd)),
            other => panic!("unexpected {other:?}"),
        }
    }

    // The slice's only session is lent out, not idle at the acceptor: still registered, so
    // a consumer joining now hears nothing of the slice.
    let b = consumer(&socket).await;
    // The session ends at a: the slice has none left, and both consumers hear it.
    let (id, fd) = lent.unwrap();
    drop(fd);
    a.send(&Message::Gone { id }, None).await.unwrap();
    assert_eq!(next(&a).await.0, slice(SliceState::Empty));
    assert_eq!(next(&b).await.0, slice(SliceState::Empty));

    // A consumer joining while the slice is empty hears it at once.
    let c = consumer(&socket).await;
    assert_eq!(next(&c).await.0, slice(SliceState::Empty));
}
