//! systemd's readiness protocol (`sd_notify(3)`, `Type=notify` with `NotifyAccess=all`): when
//! `NOTIFY_SOCKET` is set (a path, or `@name` for an abstract socket), each state change is
//! one datagram of `KEY=VALUE` lines to it. Nothing is sent without it.
//!
//! * `READY=1` once the listeners are bound (`run` and `acceptor`);
//! * `RELOADING=1` with `MONOTONIC_USEC=` (systemd 253 and later want both) when a reload
//!   starts, then `READY=1` from this process when it was applied in place or refused;
//! * after a hot restart, `MAINPID=` and `READY=1` from the successor once it serves, and
//!   `MAINPID=` of the successor from the old process before it exits, so that the unit never
//!   has a dead main PID while the successor is still binding (the old one may drain in
//!   milliseconds);
//! * `STOPPING=1` on SIGTERM or SIGINT (never on a hot restart: the service goes on).
//!
//! `NOTIFY_SOCKET` stays in the environment: the successor of a hot restart needs it. A
//! notification that cannot be sent is logged at debug and changes nothing else.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;

use tracing::debug;

/// The proxy (or acceptor) serves.
pub(crate) fn ready() {
    send("READY=1\n");
}

/// This process is a hot restart's successor and serves: it is the service's main process now.
pub(crate) fn successor_ready() {
    send(&format!("MAINPID={}\nREADY=1\n", std::process::id()));
}

/// The successor `pid` has taken over and this process is about to exit.
pub(crate) fn handed_to(pid: u32) {
    send(&format!("MAINPID={pid}\n"));
}

/// A reload starts.
pub(crate) fn reloading() {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let usec = now.tv_sec * 1_000_000 + now.tv_nsec / 1_000;
    send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}\n"));
}

/// Shutting down (SIGTERM or SIGINT).
pub(crate) fn stopping() {
    send("STOPPING=1\n");
}

fn send(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(error) = send_to(&target, state) {
        debug!(%error, socket = ?target, state = state.trim_end(), "cannot notify the service manager");
    }
}

fn send_to(target: &OsStr, state: &str) -> io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    let sent = match target.as_bytes() {
        [b'/', ..] => socket.send_to(state.as_bytes(), target)?,
        [b'@', name @ ..] => send_abstract(&socket, name, state)?,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither an absolute path nor @name",
            ))
        }
    };
    match sent == state.len() {
        true => Ok(()),
        false => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "datagram cut short",
        )),
    }
}

#[cfg(target_os = "linux")]
fn send_abstract(socket: &UnixDatagram, name: &[u8], state: &str) -> io::Result<usize> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    socket.send_to_addr(state.as_bytes(), &addr)
}

#[cfg(not(target_os = "linux"))]
fn send_abstract(_: &UnixDatagram, _: &[u8], _: &str) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract sockets are Linux's",
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sends_one_datagram_to_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        send_to(path.as_os_str(), "READY=1\n").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\n");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn sends_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("sluice-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        send_to(OsStr::new(&format!("@{name}")), "STOPPING=1\n").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1\n");
    }

    #[test]
    fn a_relative_path_is_refused() {
        let err = send_to(OsStr::new("notify.sock"), "READY=1\n").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
