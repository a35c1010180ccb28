//! The socket file: safe permissions, stale files replaced, live ones and non-sockets left
//! alone, peers checked, and the file removed only by its owner.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use sluice_handoff::*;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test]
async fn the_socket_file_is_owner_only_and_removed_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("handoff.sock");
    let listener = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(mode(&path), 0o600);
    assert_eq!(listener.path(), path);
    // Only the socket is left in the directory: the staging directory is gone.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    drop(listener);
    assert!(!path.exists());
}

#[tokio::test]
async fn another_mode_can_be_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group.sock");
    let _listener = HandoffListener::bind(&path, 0o660).unwrap();
    assert_eq!(mode(&path), 0o660);
}

#[tokio::test]
async fn an_fd_moves_through_a_bound_listener() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sock");
    let listener = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap();
    let allowed = AllowedUids::default();
    let (client, accepted) =
        tokio::join!(Handoff::connect(&path), listener.accept_allowed(&allowed));
    let (client, (server, peer)) = (client.unwrap(), accepted.unwrap());
    assert_eq!(peer.uid, rustix::process::geteuid().as_raw());
    assert_eq!(peer.pid, i32::try_from(std::process::id()).unwrap());

    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let near = TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
    let (mut far, _) = tcp.accept().unwrap();
    let msg = Message::Listener {
        name: "web".into(),
        addr: ListenAddr::Inet(tcp.local_addr().unwrap()),
    };
    // A listening socket travels the same way as a session; here, the connected stream.
    server.send(&msg, Some(near.into())).await.unwrap();
    let (got, fd) = client.recv().await.unwrap();
    assert_eq!(got, msg);
    let mut near = TcpStream::from(fd.unwrap());
    far.write_all(b"hi").unwrap();
    let mut buf = [0u8; 2];
    near.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hi");
    drop(near);
    assert_eq!(far.read(&mut buf).unwrap(), 0, "the sender kept a copy");
}

#[tokio::test]
async fn the_socket_file_gets_the_mode_and_group_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group.sock");
    // Root may give any group; anyone else one of their own.
    let gid = if rustix::process::geteuid().is_root() {
        65534
    } else {
        rustix::process::getegid().as_raw()
    };
    let access = SocketAccess {
        mode: 0o660,
        group: Some(gid),
    };
    let _listener = HandoffListener::bind_with(&path, access).unwrap();
    assert_eq!(mode(&path), 0o660);
    assert_eq!(std::fs::symlink_metadata(&path).unwrap().gid(), gid);
    assert_eq!(SocketAccess::default().mode, 0o600);
}

/// `allowed_uids` adds to the acceptor's own uid; it never replaces it.
#[tokio::test]
async fn the_own_uid_is_allowed_beside_the_listed_ones() {
    let me = rustix::process::geteuid().as_raw();
    let (other, stranger) = (me.wrapping_add(1), me.wrapping_add(2));
    let allowed = AllowedUids::new([other]);
    assert!(allowed.allows(me) && allowed.allows(other));
    assert!(!allowed.allows(stranger));
    assert!(AllowedUids::default().allows(me));
    assert!(!AllowedUids::default().allows(other));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sock");
    let listener = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap();
    let (client, accepted) =
        tokio::join!(Handoff::connect(&path), listener.accept_allowed(&allowed));
    let (_client, (_server, peer)) = (client.unwrap(), accepted.unwrap());
    assert_eq!(peer.uid, me);
}

#[tokio::test]
async fn a_peer_outside_the_allowed_uids_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sock");
    let listener = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap();
    let me = rustix::process::geteuid().as_raw();
    // As a listener owned by another uid sees us.
    let others = AllowedUids::for_owner(me.wrapping_add(1), [me.wrapping_add(2)]);
    assert!(!others.allows(me));

    let (client, accepted) =
        tokio::join!(Handoff::connect(&path), listener.accept_allowed(&others));
    let err = accepted.unwrap_err();
    assert!(
        matches!(err, Error::PeerNotAllowed { uid, .. } if uid == me),
        "{err}"
    );
    assert!(err.is_peer_fault());
    // The refused connection is closed.
    assert!(matches!(client.unwrap().recv().await, Err(Error::Closed)));
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sock");
    // A crashed process: its socket file stays, nobody listens on it.
    let crashed = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(crashed);
    assert!(path.exists());
    let listener = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap();
    let (client, accepted) = tokio::join!(Handoff::connect(&path), listener.accept());
    client.unwrap();
    accepted.unwrap();
}

#[tokio::test]
async fn a_live_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sock");
    let _live = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap();
    let err = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap_err();
    assert!(matches!(&err, Error::InUse(p) if p == &path), "{err}");
    assert_eq!(
        err.to_string(),
        format!("another process is listening on {}", path.display())
    );
    // A live stream socket of another program counts as live too.
    let other = dir.path().join("stream.sock");
    let _stream = std::os::unix::net::UnixListener::bind(&other).unwrap();
    let err = HandoffListener::bind(&other, DEFAULT_SOCKET_MODE).unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err}");
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sock");
    std::fs::write(&path, "precious").unwrap();
    let err = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap_err();
    assert!(matches!(err, Error::NotASocket(_)), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
}

#[tokio::test]
async fn drop_leaves_a_successors_socket_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sock");
    let old = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap();
    // The successor takes the path over (as after the old one was thought dead).
    std::fs::remove_file(&path).unwrap();
    let new = HandoffListener::bind(&path, DEFAULT_SOCKET_MODE).unwrap();
    drop(old);
    assert!(
        path.exists(),
        "the old listener removed its successor's file"
    );
    let (client, accepted) = tokio::join!(Handoff::connect(&path), new.accept());
    client.unwrap();
    accepted.unwrap();
}
