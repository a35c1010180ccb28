//! Handing idle sessions to another process (a hot restart's successor, docs/design.md §4).
//!
//! While a cluster hands over, a session that becomes idle while nobody in this process waits
//! for one leaves the pool: its socket goes to the [`Handover`]'s receiver, with the names the
//! next owner needs. Optionally the last idle session of each slice stays, for requests that
//! still reach this process while its client connections drain.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;
use tracing::debug;

use crate::instance::SessionPermit;
use crate::slice_id::SliceId;
use crate::stream::SessionStream;

/// A session's socket on its way to another process.
#[derive(Debug)]
pub struct HandedSession {
    /// The reverse cluster and slice.
    pub slice: SliceId,
    /// The instance id.
    pub instance: String,
    /// The connected socket.
    pub fd: OwnedFd,
    /// The session's place in the limits; a standalone acceptor keeps it while a consumer
    /// holds the session, a hot restart drops it.
    pub(crate) permit: SessionPermit,
}

/// A parked stream and its names, before its socket is taken out.
pub(crate) struct Handed {
    io: Box<dyn SessionStream>,
    slice: SliceId,
    permit: SessionPermit,
}

impl Handed {
    pub(crate) fn new(io: Box<dyn SessionStream>, slice: SliceId, permit: SessionPermit) -> Self {
        Self { io, slice, permit }
    }
}

/// Where a session that becomes idle goes.
#[derive(Debug, Default)]
enum Destination {
    /// It stays in this process's slice.
    #[default]
    Local,
    /// A hot restart: every session that becomes idle while nobody here waits for one leaves
    /// for `to`, except, with `keep_one`, each slice's last idle session.
    Handover {
        to: mpsc::UnboundedSender<HandedSession>,
        keep_one: bool,
    },
    /// Lending (a standalone acceptor) or returning (a consumer): sessions leave for `to` only
    /// when [`SlicePool::hand_over_some`](crate::pool::SlicePool::hand_over_some) takes them.
    /// `lost`, if given, hears the slice of each session let go that never reaches `to`
    /// (its connection ended first, or it cannot move), so that a lender counting sessions on
    /// their way stays exact.
    Lend {
        to: mpsc::UnboundedSender<HandedSession>,
        lost: Option<mpsc::UnboundedSender<SliceId>>,
    },
}

/// Where a cluster's idle sessions go; [`Destination::Local`] by default.
#[derive(Debug)]
pub(crate) struct Handover {
    destination: Mutex<Destination>,
    /// Whether the destination is [`Destination::Local`], readable without the lock: every
    /// returned session asks, and almost always the answer is that it stays.
    local: AtomicBool,
}

impl Default for Handover {
    fn default() -> Self {
        Self {
            destination: Mutex::default(),
            local: AtomicBool::new(true),
        }
    }
}

impl Handover {
    fn destination(&self) -> std::sync::MutexGuard<'_, Destination> {
        self.destination.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, destination: Destination) {
        let mut current = self.destination();
        self.local
            .store(matches!(destination, Destination::Local), Ordering::Release);
        *current = destination;
    }

    /// Starts a hot restart's hand-over to `to`.
    pub(crate) fn start(&self, to: mpsc::UnboundedSender<HandedSession>, keep_one: bool) {
        self.set(Destination::Handover { to, keep_one });
    }

    /// Starts lending (or returning) to `to`; `lost`, if given, hears of each session let go
    /// that never reaches `to`.
    pub(crate) fn start_pull(
        &self,
        to: mpsc::UnboundedSender<HandedSession>,
        lost: Option<mpsc::UnboundedSender<SliceId>>,
    ) {
        self.set(Destination::Lend { to, lost });
    }

    /// Ends the hand-over: later idle sessions stay, and the receiver sees the end once
    /// every sender is gone.
    pub(crate) fn stop(&self) {
        self.set(Destination::Local);
    }

    /// A session of `slice` was let go but will not be handed over.
    pub(crate) fn lost(&self, slice: &SliceId) {
        if let Destination::Lend {
            lost: Some(lost), ..
        } = &*self.destination()
        {
            let _ = lost.send(slice.clone());
        }
    }

    /// A hot restart's hand-over keeps no idle session back any more.
    pub(crate) fn keep_none(&self) {
        if let Destination::Handover { keep_one, .. } = &mut *self.destination() {
            *keep_one = false;
        }
    }

    /// Whether a session returning to a slice with `idle` idle sessions and no waiter leaves.
    pub(crate) fn takes(&self, idle: usize) -> bool {
        if !self.active() {
            return false;
        }
        match &*self.destination() {
            Destination::Handover { keep_one, .. } => !(idle == 0 && *keep_one),
            Destination::Local | Destination::Lend { .. } => false,
        }
    }

    /// How many idle sessions a slice keeps while handing over.
    pub(crate) fn keeps(&self) -> usize {
        match &*self.destination() {
            Destination::Handover { keep_one, .. } => usize::from(*keep_one),
            Destination::Local | Destination::Lend { .. } => 0,
        }
    }

    /// Whether sessions may leave at all.
    pub(crate) fn active(&self) -> bool {
        !self.local.load(Ordering::Acquire)
    }

    /// Sends a parked session on; one that cannot move (TLS) or has nowhere to go closes.
    pub(crate) fn send(&self, handed: Handed) {
        let Handed { io, slice, permit } = handed;
        let instance = permit.instance.id().to_owned();
        let Some(fd) = io.into_fd() else {
            debug!(cluster = %slice.cluster, %instance, "session cannot move to another process; closing it");
            return self.lost(&slice);
        };
        let session = HandedSession {
            slice,
            instance,
            fd,
            permit,
        };
        match &*self.destination() {
            // A closed receiver drops the socket, which closes it: the service re-dials.
            Destination::Handover { to, .. } | Destination::Lend { to, .. } => {
                let _ = to.send(session);
            }
            Destination::Local => {}
        }
    }
}
