//! File descriptors move between the two ends of a handoff socket, exactly as the protocol
//! allows, and none leaks.
#![allow(clippy::unwrap_used)]

use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use rustix::net::{
    sendmsg, socketpair, AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
    SocketFlags, SocketType,
};
use sluice_handoff::*;

fn session(id: u64) -> Message {
    Message::Session {
        id,
        cluster: "api".into(),
        slice: "default".into(),
        instance: "10.0.0.1".into(),
    }
}

/// A connected TCP pair on loopback: (the end we hand off, the far end).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let near = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (far, _) = listener.accept().unwrap();
    (near, far)
}

/// Proves `fd` is the near end of the pair: bytes flow both ways through it, and once it is
/// dropped the far end reads EOF — so no other copy of it is open anywhere.
fn assert_is_near_end(fd: OwnedFd, mut far: TcpStream) {
    let mut near = TcpStream::from(fd);
    far.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    near.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    near.write_all(b"pong").unwrap();
    far.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"pong");
    drop(near);
    assert_eq!(
        far.read(&mut buf).unwrap(),
        0,
        "another copy of the fd is open"
    );
}

/// Sends a datagram with any fds, bypassing the crate's own checks (a misbehaving peer).
fn raw_send(sock: BorrowedFd<'_>, line: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    sendmsg(
        sock,
        &[IoSlice::new(line)],
        &mut control,
        SendFlags::empty(),
    )
    .unwrap();
}

/// A raw SEQPACKET pair: (the misbehaving peer's end, our end as a `Handoff`).
fn raw_pair() -> (OwnedFd, Handoff) {
    let (raw, ours) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    (raw, Handoff::from_fd(ours).unwrap())
}

/// A UNIX stream pair whose second end reads EOF once every copy of the first is closed.
fn watched() -> (OwnedFd, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    (OwnedFd::from(a), b)
}

fn assert_closed(mut witness: UnixStream) {
    let mut buf = [0u8; 1];
    assert_eq!(witness.read(&mut buf).unwrap(), 0, "the fd was leaked");
}

#[tokio::test]
async fn a_session_fd_moves_to_the_peer_and_works() {
    let (a, b) = Handoff::pair().unwrap();
    let (near, far) = tcp_pair();
    a.send(&session(7), Some(near.into())).await.unwrap();
    let (msg, fd) = b.recv().await.unwrap();
    assert_eq!(msg, session(7));
    assert_is_near_end(fd.unwrap(), far);
}

#[tokio::test]
async fn messages_arrive_in_order_and_fdless_ones_bring_no_fd() {
    let (a, b) = Handoff::pair().unwrap();
    let (keep, _other) = watched();
    let sent = [
        Message::Credit {
            cluster: "api".into(),
            slice: "default".into(),
            n: 2,
        },
        Message::Gone { id: 1 },
        Message::Return { id: 2 },
        Message::Done,
    ];
    let mut fds = vec![None, None, Some(keep), None].into_iter();
    for msg in &sent {
        a.send(msg, fds.next().unwrap()).await.unwrap();
    }
    for msg in &sent {
        let (got, fd) = b.recv().await.unwrap();
        assert_eq!(&got, msg);
        assert_eq!(fd.is_some(), msg.carries_fd());
    }
}

#[tokio::test]
async fn one_task_sends_while_another_receives() {
    let (a, b) = Handoff::pair().unwrap();
    let a = Arc::new(a);
    let sender = {
        let a = Arc::clone(&a);
        tokio::spawn(async move {
            for id in 0..1000 {
                a.send(&Message::Gone { id }, None).await.unwrap();
            }
        })
    };
    let echo = tokio::spawn(async move {
        for _ in 0..1000 {
            let (msg, _) = b.recv().await.unwrap();
            b.send(&msg, None).await.unwrap();
        }
    });
    for id in 0..1000 {
        assert_eq!(a.recv().await.unwrap().0, Message::Gone { id });
    }
    sender.await.unwrap();
    echo.await.unwrap();
}

#[tokio::test]
async fn end_of_stream_is_closed() {
    let (a, b) = Handoff::pair().unwrap();
    a.send(&Message::Done, None).await.unwrap();
    drop(a);
    assert_eq!(b.recv().await.unwrap().0, Message::Done);
    assert!(matches!(b.recv().await, Err(Error::Closed)));
    assert!(matches!(
        b.send(&Message::Ready, None).await,
        Err(Error::Closed)
    ));
}

#[tokio::test]
async fn the_hello_exchange_checks_the_version() {
    let (a, b) = Handoff::pair().unwrap();
    let (ra, rb) = tokio::join!(a.hello(Role::Consumer), b.hello(Role::Acceptor));
    assert_eq!((ra.unwrap(), rb.unwrap()), (Role::Acceptor, Role::Consumer));

    let (raw, ours) = raw_pair();
    raw_send(raw.as_fd(), b"HELLO 2 acceptor", &[]);
    let err = ours.hello(Role::Consumer).await.unwrap_err();
    assert!(
        matches!(err, Error::Version { ours: 1, theirs: 2 }),
        "{err}"
    );

    let (raw, ours) = raw_pair();
    raw_send(raw.as_fd(), b"READY", &[]);
    let err = ours.hello(Role::Upgrade).await.unwrap_err();
    assert!(matches!(err, Error::NoHello { got: "READY" }), "{err}");
}

#[tokio::test]
async fn an_fd_on_a_message_that_carries_none_is_refused_and_closed() {
    let (raw, ours) = raw_pair();
    let (fd, witness) = watched();
    raw_send(raw.as_fd(), b"GONE 5", &[fd.as_fd()]);
    drop(fd);
    let err = ours.recv().await.unwrap_err();
    assert!(matches!(err, Error::UnexpectedFd { verb: "GONE" }), "{err}");
    assert!(err.is_peer_fault());
    assert_closed(witness);
}

#[tokio::test]
async fn a_session_without_its_fd_is_refused() {
    let (raw, ours) = raw_pair();
    raw_send(raw.as_fd(), b"SESSION 1 api default 10.0.0.1", &[]);
    let err = ours.recv().await.unwrap_err();
    assert!(matches!(err, Error::MissingFd { verb: "SESSION" }), "{err}");
    // The socket stays usable after a refused datagram.
    raw_send(raw.as_fd(), b"READY\n", &[]);
    assert_eq!(ours.recv().await.unwrap().0, Message::Ready);
}

#[tokio::test]
async fn two_fds_are_refused_and_both_closed() {
    let (raw, ours) = raw_pair();
    let (fd1, witness1) = watched();
    let (fd2, witness2) = watched();
    raw_send(raw.as_fd(), b"RETURN 3", &[fd1.as_fd(), fd2.as_fd()]);
    drop((fd1, fd2));
    let err = ours.recv().await.unwrap_err();
    assert!(matches!(err, Error::TooManyFds { count: 2 }), "{err}");
    assert_closed(witness1);
    assert_closed(witness2);
}

#[tokio::test]
async fn more_fds_than_the_control_buffer_holds_are_refused_and_all_closed() {
    let (raw, ours) = raw_pair();
    let (fds, witnesses): (Vec<_>, Vec<_>) = (0..8).map(|_| watched()).unzip();
    let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
    raw_send(raw.as_fd(), b"RETURN 3", &borrowed);
    drop(fds);
    assert!(matches!(ours.recv().await, Err(Error::ControlTruncated)));
    witnesses.into_iter().for_each(assert_closed);
}

#[tokio::test]
async fn malformed_and_oversized_datagrams_are_refused_and_their_fd_closed() {
    let (raw, ours) = raw_pair();
    let (fd, witness) = watched();
    raw_send(
        raw.as_fd(),
        b"SESSION x api default 10.0.0.1",
        &[fd.as_fd()],
    );
    drop(fd);
    let err = ours.recv().await.unwrap_err();
    assert!(
        matches!(err, Error::Parse(ParseError::BadNumber { .. })),
        "{err}"
    );
    assert_closed(witness);

    let (fd, witness) = watched();
    let huge = vec![b'A'; 4096];
    raw_send(raw.as_fd(), &huge, &[fd.as_fd()]);
    drop(fd);
    assert!(matches!(ours.recv().await, Err(Error::Truncated)));
    assert_closed(witness);
}

#[tokio::test]
async fn the_sender_refuses_an_fd_mismatch_and_sends_nothing() {
    let (a, b) = Handoff::pair().unwrap();
    let (fd, witness) = watched();
    let err = a.send(&Message::Ready, Some(fd)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongFd {
                verb: "READY",
                needs_fd: false
            }
        ),
        "{err}"
    );
    assert!(!err.is_peer_fault());
    assert_closed(witness);
    let err = a.send(&session(1), None).await.unwrap_err();
    assert!(
        matches!(err, Error::WrongFd { needs_fd: true, .. }),
        "{err}"
    );
    let bad = Message::Drain {
        instance: "a b".into(),
    };
    assert!(matches!(a.send(&bad, None).await, Err(Error::Invalid(_))));
    // Nothing of the above reached the peer: the next message it reads is this one.
    a.send(&Message::Done, None).await.unwrap();
    assert_eq!(b.recv().await.unwrap().0, Message::Done);
}

#[tokio::test]
async fn peer_credentials_are_ours() {
    let (a, _b) = Handoff::pair().unwrap();
    let cred = a.peer_credentials().unwrap();
    assert_eq!(cred.uid, rustix::process::geteuid().as_raw());
    assert_eq!(cred.gid, rustix::process::getegid().as_raw());
    assert_eq!(cred.pid, i32::try_from(std::process::id()).unwrap());
}

#[tokio::test]
async fn only_seqpacket_sockets_are_wrapped() {
    let (a, _b) = UnixStream::pair().unwrap();
    assert!(matches!(Handoff::from_fd(a.into()), Err(Error::Io(_))));
}
