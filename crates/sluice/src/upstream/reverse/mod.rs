//! Reverse clusters: services dial in to the acceptor and register sessions; the proxy never
//! connects to them (DESIGN.md §3).
//!
//! A [`ReverseCluster`] holds one [`SlicePool`] per slice and the registered [`Instance`]s. A
//! route targets a [`ReverseSlice`], a cheap handle to one pool. A request leases one idle
//! session exclusively (or waits in the slice's admission queue) and gives it back when its
//! response body ends; so in-flight work never exceeds the sessions a service registered.

mod buffer;
mod cluster;
mod gauges;
mod handover;
mod instance;
mod lease;
pub mod metrics;
mod pool;
mod send;
mod session;
mod slice_id;
mod stream;
#[cfg(test)]
mod tests;

pub use self::cluster::{AdoptError, ReverseCluster, ReverseSlice};
pub use self::gauges::SessionGauges;
pub use self::handover::HandedSession;
pub use self::instance::{Instance, Limit, UpgradedSession};
pub(crate) use self::instance::{Lent, SessionPermit};
pub use self::lease::Lease;
pub use self::metrics::ReverseMetrics;
pub use self::pool::SlicePool;
pub use self::slice_id::SliceId;
pub use self::stream::SessionStream;
