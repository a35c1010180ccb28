//! Handing idle sessions to another process (a hot restart's successor, DESIGN.md §4).
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

use super::instance::SessionPermit;
use super::stream::SessionStream;

/// A session's socket on its way to another process.
#[derive(Debug)]
pub struct HandedSession {
    /// The reverse cluster.
    pub cluster: String,
    /// The slice.
    pub slice: String,
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
    cluster: String,
    slice: String,
    permit: SessionPermit,
}

impl Handed {
    pub(crate) fn new(
        io: Box<dyn SessionStream>,
        cluster: &str,
        slice: &str,
        permit: SessionPermit,
    ) -> Self {
        Self {
            io,
            cluster: cluster.to_owned(),
            slice: slice.to_owned(),
            permit,
        }
    }
}

/// Where a cluster's sessions go while it hands over; inactive by default.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    to: Mutex<Option<mpsc::UnboundedSender<HandedSession>>>,
    /// Told (cluster, slice) of each session let go that will never reach `to` (it ended
    /// first, or cannot move), so that a lender counting sessions on their way stays exact.
    lost: Mutex<Option<mpsc::UnboundedSender<(String, String)>>>,
    /// Every session that becomes idle leaves (a hot restart), rather than only those asked
    /// for (a standalone acceptor or a consumer).
    auto: AtomicBool,
    keep_one: AtomicBool,
}

impl Handover {
    pub(crate) fn start(&self, to: mpsc::UnboundedSender<HandedSession>, keep_one: bool) {
        self.keep_one.store(keep_one, Ordering::Release);
        self.auto.store(true, Ordering::Release);
        *self.to.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
    }

    /// Sessions leave only when [`SlicePool::hand_over_some`] takes them.
    /// `lost`, if given, hears of each session let go that never reaches `to`.
    pub(crate) fn start_pull(
        &self,
        to: mpsc::UnboundedSender<HandedSession>,
        lost: Option<mpsc::UnboundedSender<(String, String)>>,
    ) {
        self.auto.store(false, Ordering::Release);
        *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = lost;
        *self.to.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
    }

    /// Ends the hand-over: later idle sessions stay, and the receiver sees the end once
    /// every sender is gone.
    pub(crate) fn stop(&self) {
        self.to.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// A session of (`cluster`, `slice`) was let go but will not be handed over.
    pub(crate) fn lost(&self, cluster: &str, slice: &str) {
        let lost = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lost) = lost.as_ref() {
            let _ = lost.send((cluster.to_owned(), slice.to_owned()));
        }
    }

    pub(crate) fn keep_none(&self) {
        self.keep_one.store(false, Ordering::Release);
    }

    /// Whether a session returning to a slice with `idle` idle sessions and no waiter leaves.
    pub(crate) fn takes(&self, idle: usize) -> bool {
        self.auto.load(Ordering::Acquire)
            && self.active()
            && !(idle == 0 && self.keep_one.load(Ordering::Acquire))
    }

    /// How many idle sessions a slice keeps while handing over.
    pub(crate) fn keeps(&self) -> usize {
        usize::from(self.keep_one.load(Ordering::Acquire))
    }

    /// Whether sessions may leave at all.
    pub(crate) fn active(&self) -> bool {
        self.to.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Sends a parked session on; one that cannot move (TLS) or has nowhere to go closes.
    pub(crate) fn send(&self, handed: Handed) {
        let Handed {
            io,
            cluster,
            slice,
            permit,
        } = handed;
        let instance = permit.instance.id().to_owned();
        let Some(fd) = io.into_fd() else {
            debug!(%cluster, %instance, "session cannot move to another process; closing it");
            return self.lost(&cluster, &slice);
        };
        let session = HandedSession {
            cluster,
            slice,
            instance,
            fd,
            permit,
        };
        let to = self.to.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(to) = to.as_ref() {
            // A closed receiver drops the socket, which closes it: the service re-dials.
            let _ = to.send(session);
        }
    }
}
