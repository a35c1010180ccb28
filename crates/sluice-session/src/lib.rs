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
//! * [`stream`]: [`Prefixed`], which replays bytes read past a head.
//! * [`client`]: `Sluice-Client-Addr`, the client's address on every request over a session.
//! * `vectors` (feature `vectors`): the shared protocol test vectors, typed, for test suites.

pub mod client;
pub mod hello;
pub mod reply;
pub mod stream;
#[cfg(feature = "vectors")]
pub mod vectors;

pub use client::{client_addr_value, parse_client_addr, HEADER_CLIENT_ADDR};
pub use hello::{parse_hello, Drain, Hello, Identity, Registration};
pub use reply::{parse_reply, Rejection, Reply};
pub use stream::Prefixed;

/// The path of the registration request.
pub const SESSION_PATH: &str = "/.sluice/v1/session";
/// The path of the drain request.
pub const DRAIN_PATH: &str = "/.sluice/v1/drain";
/// The `Upgrade` protocol token of a session.
pub const UPGRADE_TOKEN: &str = "sluice-session/1";
/// Header naming the cluster a session serves (required).
pub const HEADER_SERVICE: &str = "sluice-service";
/// Header naming the slice (optional, default [`DEFAULT_SLICE`]).
pub const HEADER_SLICE: &str = "sluice-slice";
/// Header naming the instance (optional, default: the peer's IP address).
pub const HEADER_INSTANCE: &str = "sluice-instance";
/// Header with the instance's intended session count (optional, informational).
pub const HEADER_CAPACITY: &str = "sluice-capacity";
/// The slice of a session that names none.
pub const DEFAULT_SLICE: &str = "default";
/// The default limit on a handshake's head, in bytes.
pub const DEFAULT_MAX_HEAD: usize = 8 * 1024;
/// The most headers a handshake may carry.
const MAX_HEADERS: usize = 32;

/// The outcome of feeding bytes to an incremental parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<T> {
    /// A whole message, and how many bytes of the input it used (the rest belongs to what
    /// follows it on the connection).
    Complete(T, usize),
    /// The input so far is a valid prefix; read more.
    Partial,
}
