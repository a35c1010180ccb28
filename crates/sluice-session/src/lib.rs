//! The Sluice session protocol (`protocol/README.md`): how a service registers a connection as
//! a session, asks for its instance to be drained, and, with many nodes, hears their demand and
//! splits its capacity among them.
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
//! * [`address`]: what an acceptor address names: one node, a DNS name's records, a list.
//! * [`control`]: the lines of a control link (many nodes): demand reports, retirements.
//! * [`split`]: how a service splits its capacity across nodes by their demand.
//! * `token`: [`Token`], a bearer token (registration, relay tunnels, the admin API): never
//!   printed, compared in constant time.
//! * `vectors` (feature `vectors`): the shared protocol test vectors, typed, for test suites.

pub mod address;
pub mod client;
pub mod control;
pub mod hello;
pub mod protocol;
pub mod reply;
pub mod split;
pub mod stream;
mod token;
#[cfg(feature = "vectors")]
pub mod vectors;

pub use address::Address;
pub use client::{client_addr_value, parse_client_addr, HEADER_CLIENT_ADDR};
pub use control::{Demand, NodeLine, ServiceLine};
pub use hello::{parse_hello, Drain, Hello, Identity, Registration, SplitBy};
pub use protocol::{
    Parsed, CONTROL_PATH, CONTROL_TOKEN, DEFAULT_MAX_HEAD, DEFAULT_SLICE, DRAIN_PATH,
    HEADER_CAPACITY, HEADER_INSTANCE, HEADER_PROTOCOL, HEADER_SERVICE, HEADER_SLICE, HEADER_SPLIT,
    HEADER_STREAMS, MAX_STREAMS, PROTOCOL_H2, PROTOCOL_HTTP1, SESSION_PATH, SPLIT_BY_SERVICE,
    UPGRADE_TOKEN,
};
pub use reply::{parse_reply, Rejection, Reply};
pub use stream::Prefixed;
pub use token::Token;
