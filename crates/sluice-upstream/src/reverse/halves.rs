//! [`Halves`]: a stream of an HTTP/2 session is leased by its exchange's two halves.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use super::protocol::Lease;
use sluice_core::body::Release;

/// One stream's lease, held by the exchange's two halves: the request body (hyper drops it
/// once it has sent it whole, or when the stream ends or is reset) and the response (its body
/// read to the end, or dropped). The stream goes back when both are done, so a service that
/// answers before it has read the whole request never has more streams open than it declared.
pub(super) struct Halves {
    lease: Mutex<Option<Lease>>,
    left: AtomicU8,
}

impl Halves {
    /// The two halves of `lease`: the request's and the response's.
    pub(super) fn split(lease: Lease) -> (Half, Half) {
        let halves = Arc::new(Self {
            lease: Mutex::new(Some(lease)),
            left: AtomicU8::new(2),
        });
        (Half(Some(Arc::clone(&halves))), Half(Some(halves)))
    }

    fn take(&self) -> Option<Lease> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// One half of a stream's lease ([`Halves`]): done when it is finished or dropped.
pub(super) struct Half(Option<Arc<Halves>>);

impl std::fmt::Debug for Half {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Half").finish_non_exhaustive()
    }
}

impl Half {
    /// Gives the stream back now, whatever the other half: the exchange failed, so nothing is
    /// open at the service; `end` (hyper gave the request back unsent: the connection is going
    /// away) ends the session too, so that its other idle streams are not leased.
    pub(super) fn give_back_now(mut self, end: bool) {
        let Some(mut lease) = self.0.take().and_then(|h| h.take()) else {
            return;
        };
        if end {
            if let Some(session) = lease.session() {
                session.end();
            }
        }
        drop(lease);
    }
}

impl Release for Half {
    fn finish(&mut self) {
        let Some(halves) = self.0.take() else { return };
        if halves.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            // A shared session's lease checks its stream in as it drops.
            drop(halves.take());
        }
    }
}

impl Drop for Half {
    fn drop(&mut self) {
        self.finish();
    }
}
