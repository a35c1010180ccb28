//! Sessions lent across processes (docs/design.md §4, `docs/handoff.md`): a standalone acceptor
//! (`sluice acceptor`) owns the service-facing listener and the registered sessions and lends
//! them to consumers (Sluice processes) by credit over a UNIX socket; consumers keep a local
//! idle pool, so steady-state requests cost no handoff, and give back what they do not need.
//!
//! # Layout
//! * `broker`: the acceptor's side: [`StandaloneAcceptor`] = the acceptor plus the handoff
//!   socket, credit bookkeeping, lending, `RETURN`/`GONE`, `DRAIN` and `SLICE` to consumers.
//! * `consumer`: a Sluice's side: credit ahead of demand, adopt lent sessions, report
//!   `GONE`, return surplus idle sessions, reconnect with backoff.
//! * `ledger`: the broker's accounts (credit, loans, recalls, sessions on their way),
//!   without sockets, so the lending rules are tested alone.
//! * `emptiness`: which slices consumers were told have no session registered (`SLICE`).
//! * `error`: why a link to a peer ended: the peer misbehaved, or the socket failed.

mod broker;
mod consumer;
mod emptiness;
mod error;
mod ledger;
#[cfg(test)]
mod tests;

pub use broker::{BrokerError, BrokerView, StandaloneAcceptor};
pub use consumer::{consume, Source};
pub use ledger::ConsumerView;
