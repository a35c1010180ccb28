//! [`Links`]: the control links a cluster's services hold open to this node (many nodes,
//! `protocol/README.md`), and what each says: the instance, its slice, the capacity it
//! declared. `/status` lists them; the acceptor's link tasks keep them current.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::instance::locked;

/// The open control links of one cluster.
#[derive(Debug, Default)]
pub struct Links {
    open: Mutex<BTreeMap<u64, Arc<LinkInfo>>>,
    next: AtomicU64,
    /// Wakes [`told_draining`](Links::told_draining): a link said `DRAINING`, or closed.
    changed: tokio::sync::Notify,
    /// Counts changes of what decides the floors (links opened or closed, a capacity).
    version: AtomicU64,
    /// Each slice's floor holder ([`floor_holder`](Links::floor_holder)) as of a version, so
    /// that every link's tick reads it, and one pass over the links makes it per change.
    floors: Mutex<Option<(u64, Holders)>>,
}

/// Each slice's floor holder (`None`: nobody).
type Holders = HashMap<String, Option<String>>;

/// One open control link.
#[derive(Debug)]
pub struct LinkInfo {
    /// The instance that opened it.
    pub instance: String,
    /// Its slice.
    pub slice: String,
    /// The capacity it declared last (`Sluice-Capacity`, then `CAPACITY`).
    capacity: AtomicU64,
    /// Sessions it asked to retire here, in all.
    retired: AtomicU64,
    /// Whether this node told it `DRAINING`.
    told_draining: std::sync::atomic::AtomicBool,
    /// Whether its SDK keeps the floor per service (`Sluice-Split: service`, `FLOOR` lines).
    pub per_service: bool,
}

impl LinkInfo {
    /// The capacity the instance declared last.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Sessions the instance asked to retire here since the link opened.
    pub fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    pub(crate) fn set_capacity(&self, n: u64) {
        self.capacity.store(n, Ordering::Relaxed);
    }

    pub(crate) fn count_retired(&self, n: u64) {
        self.retired.fetch_add(n, Ordering::Relaxed);
    }
}

impl LinkEntry {
    /// The link's id, unique in its cluster for the process's life.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The instance declared `n` (`CAPACITY`): the floors may move.
    pub(crate) fn declared(&self, n: u64) {
        self.info.set_capacity(n);
        self.links.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The link has said `DRAINING`.
    pub(crate) fn said_draining(&self) {
        self.info.told_draining.store(true, Ordering::Release);
        self.links.changed.notify_waiters();
    }
}

/// A link's place in [`Links`]; dropping it removes the link.
#[derive(Debug)]
pub struct LinkEntry {
    id: u64,
    links: Arc<Links>,
    /// What the link said.
    pub info: Arc<LinkInfo>,
}

impl Drop for LinkEntry {
    fn drop(&mut self) {
        locked(&self.links.open).remove(&self.id);
        self.links.version.fetch_add(1, Ordering::AcqRel);
        self.links.changed.notify_waiters();
    }
}

impl Links {
    /// Lists a link that just opened; it stays listed while the entry lives.
    pub fn open(
        self: &Arc<Self>,
        instance: &str,
        slice: &str,
        capacity: u64,
        per_service: bool,
    ) -> LinkEntry {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let info = Arc::new(LinkInfo {
            instance: instance.to_owned(),
            slice: slice.to_owned(),
            capacity: AtomicU64::new(capacity),
            retired: AtomicU64::new(0),
            told_draining: std::sync::atomic::AtomicBool::new(false),
            per_service,
        });
        locked(&self.open).insert(id, Arc::clone(&info));
        self.version.fetch_add(1, Ordering::AcqRel);
        LinkEntry {
            id,
            links: Arc::clone(self),
            info,
        }
    }

    /// The instance this node asks for its floor of one session in `slice` (`FLOOR 1`,
    /// protocol/README.md): of the slice's open links, the instance that declared the largest
    /// capacity, ties to the smallest id; nobody while a link of the slice keeps its floor
    /// per instance (an older SDK, which keeps one here anyway).
    pub fn floor_holder(&self, slice: &str) -> Option<String> {
        let version = self.version.load(Ordering::Acquire);
        let mut floors = locked(&self.floors);
        if floors.as_ref().is_none_or(|(v, _)| *v != version) {
            *floors = Some((version, self.holders()));
        }
        floors.as_ref()?.1.get(slice).cloned().flatten()
    }

    /// Every slice's floor holder, in one pass over the open links.
    fn holders(&self) -> Holders {
        let mut best: HashMap<String, Option<(u64, String)>> = HashMap::new();
        for l in locked(&self.open).values() {
            let slot = best
                .entry(l.slice.clone())
                .or_insert_with(|| Some((0, String::new())));
            let Some((capacity, instance)) = slot else {
                continue;
            };
            if !l.per_service {
                *slot = None;
            } else if instance.is_empty()
                || (l.capacity(), std::cmp::Reverse(&l.instance))
                    > (*capacity, std::cmp::Reverse(&*instance))
            {
                *slot = Some((l.capacity(), l.instance.clone()));
            }
        }
        best.into_iter()
            .map(|(slice, holder)| (slice, holder.map(|(_, instance)| instance)))
            .collect()
    }

    /// The open links, oldest first.
    pub fn list(&self) -> Vec<Arc<LinkInfo>> {
        locked(&self.open).values().cloned().collect()
    }

    /// Resolves once every open link has said `DRAINING` (or closed): a stopping node waits
    /// for it, so that its services hear it before the process exits.
    pub async fn told_draining(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let all = locked(&self.open)
                .values()
                .all(|l| l.told_draining.load(Ordering::Acquire));
            if all {
                return;
            }
            changed.await;
        }
    }
}

/// Waits until every link of `all` has said `DRAINING` (or closed), at most `limit`.
pub async fn told_draining(all: &[Arc<Links>], limit: std::time::Duration) {
    let told = async {
        for links in all {
            links.told_draining().await;
        }
    };
    let _ = tokio::time::timeout(limit, told).await;
}
