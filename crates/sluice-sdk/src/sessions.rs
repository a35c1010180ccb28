//! [`Sessions`]: the application's handle on its registered sessions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};

use crate::dial;
use crate::error::Error;
use crate::fleet::Fleet;
use crate::options::Options;
use crate::service::SessionService;
use crate::slot::Slot;
use crate::state::{NodeStatus, Shared, Status};

/// Starts one slot task; the sender is dropped when the task ends.
type Spawner = Box<dyn Fn(mpsc::Sender<()>) + Send + Sync>;

/// The sessions of one instance, kept at [`capacity`](Sessions::capacity) by background tasks.
///
/// Dropping the handle stops re-dialing; sessions already registered keep serving until the
/// proxy closes them. Use [`shutdown`](Sessions::shutdown) to leave gracefully.
pub struct Sessions {
    shared: Arc<Shared>,
    options: Arc<Options>,
    /// Many nodes: the nodes, their control links and the split.
    fleet: Option<Arc<Fleet>>,
    spawner: Spawner,
    /// Cloned into every slot; `shutdown` drops it and waits for `ended` to report all gone.
    alive: Option<mpsc::Sender<()>>,
    ended: mpsc::Receiver<()>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("identity", &self.options.identity)
            .field("acceptor", &self.options.acceptor)
            .field("counts", &self.shared.counts())
            .field("status", &self.shared.status())
            .finish_non_exhaustive()
    }
}

impl Sessions {
    pub(crate) fn start<S: SessionService>(options: Options, service: S) -> Result<Self, Error> {
        options.validate()?;
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let shared = Arc::new(Shared::new(options.acceptor.to_string()));
        let options = Arc::new(options);
        let (alive, ended) = mpsc::channel(1);
        let fleet = options
            .acceptor
            .is_many()
            .then(|| Fleet::start(options.clone(), shared.clone(), runtime.clone()));
        let spawner = spawner(
            shared.clone(),
            options.clone(),
            fleet.clone(),
            service,
            runtime,
        );
        let sessions = Self {
            shared,
            options,
            fleet,
            spawner,
            alive: Some(alive),
            ended,
        };
        sessions.set_capacity(sessions.options.capacity);
        Ok(sessions)
    }

    /// Changes how many sessions to keep registered. Growing dials new sessions at once;
    /// shrinking retires surplus ones: idle sessions close at once (the proxy drops a session
    /// it sees closed while idle), busy ones answer their response with `Connection: close`,
    /// and slots not registered at the moment simply stop dialing. Setting the current
    /// capacity again restarts slots that were refused for good, and ends a drained
    /// instance's wait for its probe (the slots dial at once).
    ///
    /// With many nodes, every node hears the new capacity and the split is planned again:
    /// nodes holding more than their share are asked to retire sessions (`RETIRE`), and no
    /// slot dials while the sessions held everywhere number the capacity or more.
    pub fn set_capacity(&self, capacity: usize) {
        let (old, spawn) = self.shared.resize(capacity);
        if let Some(fleet) = &self.fleet {
            fleet.set_capacity(capacity);
        }
        if old != capacity {
            tracing::info!(service = %self.options.identity.service, old, new = capacity, "capacity changed");
        }
        if let Some(alive) = &self.alive {
            for _ in 0..spawn {
                (self.spawner)(alive.clone());
            }
        }
    }

    /// The capacity asked for (initially [`Options::capacity`]); the sessions converge on it.
    pub fn capacity(&self) -> usize {
        self.shared.counts().target
    }

    /// Sessions registered right now; 0 until the first handshake completes.
    pub fn registered(&self) -> usize {
        self.shared.status().registered
    }

    /// The most recent error any session hit, such as a 401 that stopped a slot for good;
    /// `None` until one happens.
    pub fn last_error(&self) -> Option<Error> {
        self.shared.status().last_error
    }

    /// Many nodes: every node with its liveness, demand, sessions held and target (the
    /// split); empty with one acceptor.
    pub fn nodes(&self) -> Vec<NodeStatus> {
        self.shared.status().nodes
    }

    /// Watches [`Status`] (registered count, last error, nodes): for readiness probes and
    /// tests.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.shared.subscribe_status()
    }

    /// Leaves gracefully (docs/design.md §3 "Drain"): stops re-dialing, sends
    /// `POST /.sluice/v1/drain` for this instance on a new connection, and once the proxy
    /// answers `200`, waits — with no deadline of its own — until the proxy has closed every
    /// session. HTTP/2 sessions ([`Options::streams`]) also send `GOAWAY` once the drain is
    /// answered, and close when their streams in flight end. If the drain request fails,
    /// returns its error at once; re-dialing stays off.
    ///
    /// With many nodes, every node holding sessions gets the drain request; where it fails,
    /// the SDK closes the sessions itself (idle ones at once, busy ones after their
    /// response), and the first failure is returned once every session is closed.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        self.shared.stop();
        tracing::info!(service = %self.options.identity.service, "draining");
        let drained = match &self.fleet {
            None => dial::drain(&self.options, dial::Endpoint::Acceptor).await,
            Some(fleet) => {
                let drained = fleet.drain().await;
                if drained.is_err() {
                    self.alive = None;
                    while self.ended.recv().await.is_some() {}
                }
                drained
            }
        };
        drained?;
        self.shared.drained();
        self.alive = None;
        // Every slot holds a sender; `None` means the last one ended with its session.
        while self.ended.recv().await.is_some() {}
        tracing::info!(service = %self.options.identity.service, "drained");
        Ok(())
    }

    /// The same as [`shutdown`](Sessions::shutdown), named after the protocol step.
    pub async fn drain(self) -> Result<(), Error> {
        self.shutdown().await
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        self.shared.stop();
        if let Some(fleet) = &self.fleet {
            fleet.stop();
        }
    }
}

fn spawner<S: SessionService>(
    shared: Arc<Shared>,
    options: Arc<Options>,
    fleet: Option<Arc<Fleet>>,
    service: S,
    rt: Handle,
) -> Spawner {
    // The mutex makes the handle `Sync` for services that are only `Send`.
    let service = Mutex::new(service);
    let next_id = AtomicU64::new(0);
    Box::new(move |alive| {
        let service = service
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let slot = Slot {
            id: next_id.fetch_add(1, Ordering::Relaxed),
            shared: shared.clone(),
            options: options.clone(),
            fleet: fleet.clone(),
            service,
        };
        rt.spawn(slot.run(alive));
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_handle_can_be_shared_across_tasks() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::Sessions>();
    }
}
