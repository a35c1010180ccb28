//! The Sluice session protocol (DESIGN.md §3): how a service registers a connection as a
//! session, and how it asks for its instance to be drained.
//!
//! One codec, shared by the proxy's acceptor (which parses [`Hello`]s and answers with
//! [`Reply`]s) and the Rust SDK (which encodes `Hello`s and parses `Reply`s), so the two cannot
//! drift. Parsing is incremental ([`Parsed::Partial`] asks for more bytes), bounded by a size
//! limit, and never panics on any input.
//!
//! # Layout
//! * [`hello`]: what a service sends: [`Registration`] (an HTTP/1.1 Upgrade) or [`Drain`].
//! * [`reply`]: what the acceptor answers: `101`, `200`, or a [`Rejection`] with its status.
//! * [`protocol`]: the paths, header names, limits and [`Parsed`] both directions share.
//! * [`stream`]: [`Prefixed`], which replays bytes read past a head.
//! * [`client`]: `Sluice-Client-Addr`, the client's address on every request over a session.
//! * `vectors` (feature `vectors`): the shared protocol test vectors, typed, for test suites.

pub mod client;
pub mod hello;
pub mod protocol;
pub mod reply;
pub mod stream;
#[cfg(feature = "vectors")]
pub mod vectors;

pub use client::{client_addr_value, parse_client_addr, HEADER_CLIENT_ADDR};
pub use hello::{parse_hello, Drain, Hello, Identity, Registration};
pub use protocol::{
    Parsed, DEFAULT_MAX_HEAD, DEFAULT_SLICE, DRAIN_PATH, HEADER_CAPACITY, HEADER_INSTANCE,
    HEADER_SERVICE, HEADER_SLICE, SESSION_PATH, UPGRADE_TOKEN,
};
pub use reply::{parse_reply, Rejection, Reply};
pub use stream::Prefixed;
