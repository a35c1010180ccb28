//! Reverse clusters: services dial in to the acceptor and register sessions; the proxy never
//! connects to them (docs/design.md §3).
//!
//! The engine — the acceptor, slice pools and their admission queues, leases, hand-over and
//! lending across processes — is the `sluice-reverse` crate, and speaks no HTTP. This module
//! is the HTTP half: [`SessionHttp`] says how the proxy's client starts on a registered stream
//! (HTTP/1.1 over a `link`, or HTTP/2 with one `h2` stream per declared stream, whose lease
//! its request and response share: `halves`), [`send`]
//! leases a session and exchanges a request on it, `buffer` reads bodies ahead so slow
//! clients do not hold sessions.

pub(crate) mod buffer;
mod h2;
mod halves;
mod link;
mod protocol;
pub mod raw;
mod send;

pub use self::protocol::{
    Acceptor, ReverseCluster, ReverseClusterOptions, ReverseSlice, StandaloneAcceptor,
};
pub use self::protocol::{BrokerView, HandoffSource};
pub(crate) use self::send::send;
pub use sluice_reverse::SliceId;
pub use sluice_reverse::{HandedSession, Limit, ReverseMetrics, SessionGauges, UpgradedSession};
