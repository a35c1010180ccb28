//! [`Handoff`]: one connected `SOCK_SEQPACKET` socket that carries messages and their fds.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::net::{
    recvmsg, sendmsg, socket_with, socketpair, sockopt, AddressFamily, RecvAncillaryBuffer,
    RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use tokio::io::Interest;
use tokio::net::UnixDatagram;

use crate::error::Error;
use crate::message::{Message, Role, MAX_MESSAGE, PROTOCOL_VERSION};

/// How many fds a received datagram may bring before the kernel reports `MSG_CTRUNC`: more
/// than one is already an error, but room for a few lets us say how many arrived.
const FDS_ROOM: usize = 4;

/// The longest datagram: a full line and its optional `\n`.
const MAX_DATAGRAM: usize = MAX_MESSAGE + 1;

/// Who is at the other end of a handoff socket, as the kernel saw it at connect time
/// (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    /// The peer's process id (0 if it lives in another pid namespace).
    pub pid: i32,
    /// The peer's effective uid.
    pub uid: u32,
    /// The peer's effective gid.
    pub gid: u32,
}

/// One end of a connected handoff socket.
///
/// Every method takes `&self`, so one task may [`send`](Handoff::send) while another
/// [`recv`](Handoff::recv)s (share it in an `Arc`). Each message is one datagram, so
/// messages never interleave. Must be created inside a tokio runtime.
#[derive(Debug)]
pub struct Handoff {
    /// The `SOCK_SEQPACKET` socket. Tokio has no type for those, so it is registered with the
    /// reactor as a `UnixDatagram`, used only for readiness (`async_io`): all I/O goes
    /// through `sendmsg`/`recvmsg` here. (`AsyncFd::new` is deprecated and its replacement is
    /// `unsafe`, which the workspace forbids.)
    sock: UnixDatagram,
}

impl Handoff {
    /// Connects to a [`crate::HandoffListener`] at `path`. The connect runs on tokio's blocking
    /// pool, since a UNIX connect waits when the listener's backlog is full.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_owned();
        let fd = tokio::task::spawn_blocking(move || -> io::Result<OwnedFd> {
            let fd = socket_with(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )?;
            rustix::net::connect(&fd, &SocketAddrUnix::new(path.as_path())?)?;
            Ok(fd)
        })
        .await
        .map_err(io::Error::other)??;
        Self::from_fd(fd)
    }

    /// Two connected ends, for tests and for handoffs within one process.
    pub fn pair() -> Result<(Self, Self), Error> {
        let (a, b) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(io::Error::from)?;
        Ok((Self::from_fd(a)?, Self::from_fd(b)?))
    }

    /// Wraps an already connected `SOCK_SEQPACKET` UNIX socket (say, one inherited from a
    /// parent), making it non-blocking. Any other kind of socket is refused.
    pub fn from_fd(fd: OwnedFd) -> Result<Self, Error> {
        Ok(Self {
            sock: register(fd, SocketType::SEQPACKET)?,
        })
    }

    /// The peer's pid, uid and gid (`SO_PEERCRED`).
    pub fn peer_credentials(&self) -> Result<Credentials, Error> {
        let cred = sockopt::socket_peercred(&self.sock).map_err(io::Error::from)?;
        Ok(Credentials {
            pid: cred.pid.as_raw_nonzero().get(),
            uid: cred.uid.as_raw(),
            gid: cred.gid.as_raw(),
        })
    }

    /// Sends `msg` with `fd`, which must be `Some` exactly when [`Message::carries_fd`].
    ///
    /// The fd is consumed: on success the peer owns the only copy, on failure it is closed.
    /// Waits while the peer's receive queue is full. A closed peer gives [`Error::Closed`].
    pub async fn send(&self, msg: &Message, fd: Option<OwnedFd>) -> Result<(), Error> {
        let line = msg.encode().map_err(Error::Invalid)?;
        if msg.carries_fd() != fd.is_some() {
            return Err(Error::WrongFd {
                verb: msg.verb(),
                needs_fd: msg.carries_fd(),
            });
        }
        let send = || send_datagram(self.sock.as_fd(), &line, fd.as_ref());
        let sent = self.sock.async_io(Interest::WRITABLE, send).await;
        sent.map_err(closed_or_io)
    }

    /// Receives the next message and its fd (`Some` exactly when [`Message::carries_fd`]).
    ///
    /// At end of stream it returns [`Error::Closed`] (an empty datagram reads the same).
    /// A datagram that breaks the protocol gives the matching error and is discarded, its fds
    /// closed; the socket stays usable, but the peer is at fault and should be dropped.
    pub async fn recv(&self) -> Result<(Message, Option<OwnedFd>), Error> {
        let recv = || Datagram::recv(self.sock.as_fd());
        let datagram = self.sock.async_io(Interest::READABLE, recv).await;
        datagram.map_err(closed_or_io)?.into_message()
    }

    /// Sends our `HELLO` and reads the peer's; returns the peer's role. A first message other
    /// than `HELLO`, or another protocol version, is an error.
    pub async fn hello(&self, role: Role) -> Result<Role, Error> {
        let ours = PROTOCOL_VERSION;
        self.send(
            &Message::Hello {
                version: ours,
                role,
            },
            None,
        )
        .await?;
        match self.recv().await?.0 {
            Message::Hello { version, role } if version == ours => Ok(role),
            Message::Hello { version, .. } => Err(Error::Version {
                ours,
                theirs: version,
            }),
            other => Err(Error::NoHello { got: other.verb() }),
        }
    }
}

impl AsFd for Handoff {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// Registers a non-blocking socket of type `ty` with the reactor (see [`Handoff::sock`]).
pub(crate) fn register(fd: OwnedFd, ty: SocketType) -> io::Result<UnixDatagram> {
    if sockopt::socket_type(&fd)? != ty {
        let msg = "a handoff socket must be a UNIX SOCK_SEQPACKET socket";
        return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
    }
    rustix::io::ioctl_fionbio(&fd, true)?;
    UnixDatagram::from_std(std::os::unix::net::UnixDatagram::from(fd))
}

fn closed_or_io(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Error::Closed,
        _ => Error::Io(e),
    }
}

fn send_datagram(sock: BorrowedFd<'_>, line: &[u8], fd: Option<&OwnedFd>) -> io::Result<()> {
    let one;
    let fds: &[BorrowedFd<'_>] = match fd {
        Some(fd) => {
            one = [fd.as_fd()];
            &one
        }
        None => &[],
    };
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other(
            "no room for SCM_RIGHTS in the control buffer",
        ));
    }
    let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    let sent = sendmsg(sock, &[IoSlice::new(line)], &mut control, flags)?;
    if sent != line.len() {
        // SOCK_SEQPACKET sends whole datagrams; a short count means the kernel broke that.
        return Err(io::Error::other("short send on a SOCK_SEQPACKET socket"));
    }
    Ok(())
}

/// One received datagram, before it is checked against the protocol.
struct Datagram {
    buf: [u8; MAX_DATAGRAM],
    len: usize,
    fds: Vec<OwnedFd>,
    flags: ReturnFlags,
}

impl Datagram {
    fn recv(sock: BorrowedFd<'_>) -> io::Result<Self> {
        let mut buf = [0u8; MAX_DATAGRAM];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_ROOM))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let flags = RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT;
        let got = recvmsg(sock, &mut [IoSliceMut::new(&mut buf)], &mut control, flags)?;
        let mut fds = Vec::new();
        for cmsg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = cmsg {
                fds.extend(received);
            }
        }
        Ok(Self {
            buf,
            len: got.bytes.min(MAX_DATAGRAM),
            fds,
            flags: got.flags,
        })
    }

    /// Checks the datagram against the protocol. Returning early drops (closes) the fds.
    fn into_message(mut self) -> Result<(Message, Option<OwnedFd>), Error> {
        if self.flags.contains(ReturnFlags::CTRUNC) {
            return Err(Error::ControlTruncated);
        }
        if self.flags.contains(ReturnFlags::TRUNC) {
            return Err(Error::Truncated);
        }
        if self.len == 0 && self.fds.is_empty() {
            return Err(Error::Closed);
        }
        if self.fds.len() > 1 {
            return Err(Error::TooManyFds {
                count: self.fds.len(),
            });
        }
        let msg = Message::parse(&self.buf[..self.len]).map_err(Error::Parse)?;
        match (msg.carries_fd(), self.fds.pop()) {
            (true, Some(fd)) => Ok((msg, Some(fd))),
            (false, None) => Ok((msg, None)),
            (true, None) => Err(Error::MissingFd { verb: msg.verb() }),
            (false, Some(_closed)) => Err(Error::UnexpectedFd { verb: msg.verb() }),
        }
    }
}
