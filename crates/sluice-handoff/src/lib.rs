//! The Sluice handoff protocol (docs/design.md §4): registered sessions, and on hot restart
//! listening sockets, move between processes as file descriptors over a UNIX
//! `SOCK_SEQPACKET` socket with `SCM_RIGHTS`.
//!
//! Every message is one datagram holding one ASCII text line of at most [`MAX_MESSAGE`] bytes
//! (words separated by single spaces, one optional trailing `\n`), with at most one fd beside
//! it: `SESSION`, `RETURN` and `LISTENER` carry exactly one, every other message none.
//! Ownership is exclusive: sending takes the `OwnedFd` by value, so the sender's copy is
//! closed once the peer has it. Received fds are close-on-exec, and any fd that arrives where
//! the protocol has none is closed, never leaked. Peers are identified with `SO_PEERCRED`.
//!
//! ```text
//! HELLO <version> <role>                      both ways, first; role = consumer|acceptor|upgrade
//! CREDIT <cluster> <slice> <n>                consumer → acceptor
//! SESSION <id> <cluster> <slice> <instance>   + fd, acceptor → consumer (or old → new)
//! RETURN <id>                                 + fd, consumer → acceptor
//! GONE <id>                                   consumer → acceptor
//! DRAIN <instance>                            acceptor → consumer
//! SLICE <cluster> <slice> empty|registered    acceptor → consumer
//! LISTENER <name> <addr>                      + fd, old → new on hot restart
//! READY                                       new → old on hot restart
//! DONE                                        old → new on hot restart
//! ```
//!
//! # Layout
//! * [`message`]: [`Message`] with its parser and encoder, [`Role`], [`SliceState`],
//!   [`ListenAddr`] and [`ParseError`]; pure, no I/O, never panics on any input.
//! * [`socket`]: [`Handoff`], one connected socket: send and receive a message with its fd,
//!   the `HELLO` exchange, the peer's [`Credentials`].
//! * [`listener`]: [`HandoffListener`], the socket file (safe permissions, its mode and
//!   group as [`SocketAccess`] asks, stale files replaced, removed on drop) and
//!   [`AllowedUids`].
//! * [`error`]: [`Error`], which says whether the peer, the caller or the system failed.

pub mod error;
pub mod listener;
pub mod message;
pub mod socket;

pub use error::Error;
pub use listener::{remove_stale, AllowedUids, HandoffListener, SocketAccess, DEFAULT_SOCKET_MODE};
pub use message::{
    ListenAddr, Message, ParseError, Role, SliceState, MAX_MESSAGE, MAX_WORD, PROTOCOL_VERSION,
};
pub use socket::{Credentials, Handoff};
