//! Why a handoff connection ended: the peer broke the protocol, or the socket failed.

use sluice_handoff::Role;

/// Why the link to one handoff peer (a consumer, or the acceptor) ended; either way the
/// connection is dropped, and the sessions lent over it go with it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    /// The peer said something the protocol does not allow at this point: it is disconnected.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// The socket failed, closed, or carried something that is not a message
    /// (`sluice_handoff::Error` says which).
    #[error(transparent)]
    Handoff(#[from] sluice_handoff::Error),
}

/// What a misbehaving peer did.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerError {
    /// A message the receiving side never accepts (or without the fd it needs).
    #[error("unexpected {verb} from {from}")]
    Unexpected {
        /// The message's verb.
        verb: &'static str,
        /// Who sent it: `a consumer` or `the acceptor`.
        from: &'static str,
    },
    /// The greeting named another role than the one this side talks to.
    #[error("the peer is a {0}, not an acceptor")]
    NotAnAcceptor(Role),
    /// `CREDIT` for a cluster the acceptor does not have.
    #[error("credit for unknown cluster {0:?}")]
    UnknownCluster(String),
    /// `RETURN` or `GONE` of a session lent to another consumer.
    #[error("session {0} was lent to another consumer")]
    LentElsewhere(u64),
    /// `RETURN` or `GONE` of a session nobody holds.
    #[error("no session {0} is lent to this consumer")]
    NotLent(u64),
}
