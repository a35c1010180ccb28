//! Reverse clusters: services dial in to the acceptor and register sessions; the proxy never
//! connects to them (docs/design.md §3).
//!
//! The engine — the acceptor, slice pools and their admission queues, leases, hand-over and
//! lending across processes — is the `sluice-reverse` crate, and speaks no HTTP. This module
//! is the HTTP half: [`Http1`] says how the proxy's HTTP/1.1 client starts on a registered
//! stream, [`send`] leases a session and exchanges a request on it, `buffer` reads bodies
//! ahead so slow clients do not hold sessions.

pub(crate) mod buffer;
mod http1;
mod link;
pub(crate) mod raw;
mod send;

pub use self::http1::{
    Acceptor, ReverseCluster, ReverseClusterOptions, ReverseSlice, StandaloneAcceptor,
};
pub(crate) use self::http1::{BrokerView, HandoffSource};
pub(crate) use self::send::send;
pub(crate) use sluice_reverse::{
    HandedSession, Limit, ReverseMetrics, SessionGauges, SliceId, UpgradedSession,
};
