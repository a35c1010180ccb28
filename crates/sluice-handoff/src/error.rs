//! What can go wrong on a handoff socket, and whose fault it is.

use std::io;
use std::path::PathBuf;

use crate::message::{ParseError, MAX_MESSAGE};

/// A failure of a handoff socket or listener.
///
/// Variants say who is at fault: the *peer* (a protocol error: the received datagram and any
/// fds it carried are discarded and closed, and the caller should close the connection), the
/// *caller* (a message that must not be sent; nothing was sent), or the system (`Io`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call on the handoff socket failed.
    #[error("handoff socket: {0}")]
    Io(#[from] io::Error),
    /// The peer closed its end (end of stream); not an error of either side.
    #[error("the handoff peer closed the connection")]
    Closed,
    /// The peer sent a datagram that is not a protocol message.
    #[error("the handoff peer sent a malformed message: {0}")]
    Parse(#[source] ParseError),
    /// The peer sent a datagram longer than [`MAX_MESSAGE`] bytes (`MSG_TRUNC`).
    #[error("the handoff peer sent a datagram longer than {MAX_MESSAGE} bytes")]
    Truncated,
    /// The peer attached more control data than a message may carry (`MSG_CTRUNC`); any fds
    /// that did arrive were closed.
    #[error("the handoff peer attached more control data than one fd (truncated, fds closed)")]
    ControlTruncated,
    /// The peer attached an fd to a message that never carries one; it was closed.
    #[error("the handoff peer attached an fd to {verb}, which carries none (fd closed)")]
    UnexpectedFd {
        /// The message's verb.
        verb: &'static str,
    },
    /// The peer sent `SESSION`, `RETURN` or `LISTENER` without its fd.
    #[error("the handoff peer sent {verb} without the fd it must carry")]
    MissingFd {
        /// The message's verb.
        verb: &'static str,
    },
    /// The peer attached more than one fd; all were closed.
    #[error("the handoff peer attached {count} fds; a message carries at most one (all closed)")]
    TooManyFds {
        /// How many fds arrived.
        count: usize,
    },
    /// The caller asked to send a message that fails [`crate::Message::encode`]; nothing was
    /// sent (any fd given was closed).
    #[error("refusing to send an invalid handoff message (caller bug): {0}")]
    Invalid(#[source] ParseError),
    /// The caller gave an fd to a message that carries none, or none to one that must carry
    /// one; nothing was sent (any fd given was closed).
    #[error("refusing to send {verb} {}: caller bug", if *.needs_fd { "without an fd" } else { "with an fd" })]
    WrongFd {
        /// The message's verb.
        verb: &'static str,
        /// Whether the message needs an fd.
        needs_fd: bool,
    },
    /// The peer's first message was not the `HELLO` the handshake expects.
    #[error("the handoff peer sent {got} where HELLO was expected")]
    NoHello {
        /// The verb it sent instead.
        got: &'static str,
    },
    /// The peer speaks another protocol version.
    #[error("the handoff peer speaks protocol version {theirs}; this side speaks {ours}")]
    Version {
        /// Our version ([`crate::PROTOCOL_VERSION`]).
        ours: u32,
        /// The peer's.
        theirs: u32,
    },
    /// The peer's uid is not in the allowed list (SO_PEERCRED); close the connection.
    #[error("handoff peer uid {uid} (pid {pid}) is not allowed")]
    PeerNotAllowed {
        /// The peer's uid.
        uid: u32,
        /// The peer's pid, for the log.
        pid: i32,
    },
    /// The socket file could not be given its group: the process is neither root nor a
    /// member of that group (or another system error).
    #[error("cannot give the handoff socket file group {gid}: {source} (the acceptor must run as root or be a member of that group)")]
    Group {
        /// The gid asked for.
        gid: u32,
        /// What chown(2) said.
        #[source]
        source: io::Error,
    },
    /// A live process already listens on the socket path.
    #[error("another process is listening on {}", .0.display())]
    InUse(PathBuf),
    /// The socket path exists and is not a socket; it is left alone.
    #[error("{} exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(PathBuf),
}

impl Error {
    /// Whether the error is the peer's fault (a protocol violation or a refused peer).
    pub fn is_peer_fault(&self) -> bool {
        matches!(
            self,
            Error::Parse(_)
                | Error::Truncated
                | Error::ControlTruncated
                | Error::UnexpectedFd { .. }
                | Error::MissingFd { .. }
                | Error::TooManyFds { .. }
                | Error::NoHello { .. }
                | Error::Version { .. }
                | Error::PeerNotAllowed { .. }
        )
    }
}
