//! The reverse-session engine: services dial in to the acceptor and register sessions, each one
//! unit of declared concurrency; the proxy never connects to them (docs/design.md §3).
//!
//! A [`ReverseCluster`] holds one [`SlicePool`] per slice and the registered [`Instance`]s. A
//! route targets a [`ReverseSlice`], a cheap handle to one pool. A request leases one idle
//! session exclusively (or waits in the slice's admission queue) and gives it back through its
//! [`Lease`] when its response ends; so in-flight work never exceeds the sessions a service
//! registered. A session that takes several requests at once (HTTP/2, `streams` at its
//! registration) is that many units in the pool, each leased alike, on one *shared*
//! connection. The engine speaks no HTTP: the proxy says, as a [`Protocol`], how a client
//! starts on a session's stream (and shares it), and drives every exchange itself.
//!
//! # Layout
//! * [`acceptor`]: the service-facing listener: TLS and mTLS (certificate names mapped to
//!   services), registration handshakes, tokens, session limits, drain requests.
//! * `cluster`: [`ReverseCluster`] (slices, instances, and its roles towards the acceptor, the
//!   admin API, a hot restart and a standalone acceptor) and [`ReverseSlice`].
//! * `pool`: [`SlicePool`], one slice's idle ring and admission queue.
//! * `instance`: `Instances` — registered instances, their limits, operator holds.
//! * `lease`: a session's way in (attached as idle) and out ([`Lease`]).
//! * [`links`]: the control links services hold open here (many nodes): who, which slice,
//!   what capacity they declared.
//! * `session`, `stream`: a session, and the stream under it that can be parked and passed to
//!   another process.
//! * `handover`: where an idle session goes (stays, hands over to a successor, is lent).
//! * [`handoff`]: sessions lent across processes: the standalone acceptor (`sluice acceptor`)
//!   and the consumer side of a cluster with `handoff = "PATH"`.
//! * [`metrics`], `gauges`: the engine's Prometheus families and session gauges.
//! * `protocol`: [`Protocol`], what the proxy speaks over sessions.
//! * `error`: [`LeaseError`], [`AdoptError`].
//! * `options`: the engine's settings ([`ReverseOptions`], [`AcceptorOptions`],
//!   [`BrokerOptions`]), plain values the application converts its configuration into.

pub mod acceptor;
mod changes;
mod cluster;
mod error;
mod gauges;
pub mod handoff;
mod handover;
mod instance;
mod lease;
pub mod links;
pub mod metrics;
mod options;
mod pool;
mod protocol;
mod session;
mod slice_id;
mod stream;
#[cfg(test)]
pub(crate) mod tests;

pub use self::cluster::{ExpectSessions, ReverseCluster, ReverseSlice};
pub use self::error::{AdoptError, LeaseError, RETRY_AFTER_SECS};
pub use self::gauges::SessionGauges;
pub use self::handover::HandedSession;
pub use self::instance::{Instance, Limit, SessionPermit, UpgradedSession};
pub use self::lease::Lease;
pub use self::metrics::ReverseMetrics;
pub use self::options::{AcceptorOptions, BrokerOptions, ReverseOptions, ServiceGrant};
pub use self::pool::{Load, SlicePool};
pub use self::protocol::Protocol;
pub use self::session::Session;
pub use self::slice_id::SliceId;
pub use self::stream::{ParkedIo, SessionStream};
