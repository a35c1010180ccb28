//! [`UpgradeCarrier`]: a connection that switched protocols (WebSocket and the like) stays its
//! connection task's to finish, so a shutdown drains it within the grace period like any open
//! HTTP connection and closes it when the grace ends (as NGINX's `worker_shutdown_timeout`
//! does), instead of losing it the moment the HTTP side is done.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// What copies bytes between the two sides of a switched connection.
type Bridge = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where a request that switches protocols leaves its bridge for the connection's task. The
/// server puts one in the extensions of each HTTP/1 request that asks for a switch.
#[derive(Clone, Default)]
pub struct UpgradeCarrier(Arc<Mutex<Option<Bridge>>>);

impl std::fmt::Debug for UpgradeCarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpgradeCarrier")
            .field("carrying", &self.slot().is_some())
            .finish()
    }
}

impl UpgradeCarrier {
    /// Runs `bridge` on the task of the connection this carrier came from, once its HTTP side
    /// has ended; without a carrier (a request that no [`Server`](super::Server) served), on a
    /// task of its own.
    pub fn carry(carrier: Option<&Self>, bridge: impl Future<Output = ()> + Send + 'static) {
        match carrier {
            Some(carrier) => *carrier.slot() = Some(Box::pin(bridge)),
            None => drop(tokio::spawn(bridge)),
        }
    }

    /// The bridge left here, if a switch happened.
    pub(super) fn take(&self) -> Option<Bridge> {
        self.slot().take()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Bridge>> {
        // Only ever holds a value or not: a poisoned lock is still usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
