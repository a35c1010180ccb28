//! Sluice's own HTTP/2 codec: what the server transport (`sluice-server`'s `h2own`) reads and
//! writes on a connection, over bytes and without I/O, so that each part is fuzzed alone and
//! checked against the `h2` crate (the transport it stands beside).
//!
//! - [`frame`]: frames (RFC 9113 §4, §6): heads, payloads checked, the frames a server writes.
//! - [`hpack`]: header blocks (RFC 7541): a decoder whose table grows only as far as the peer
//!   uses it, and an encoder that keeps no state (no dynamic table: nothing per connection).
//! - [`head`]: a request's fields checked as RFC 9113 §8 says (pseudo-fields, connection-specific
//!   fields, field values) and made into an `http::Request`, its trailers into a `HeaderMap`.

pub mod error;
pub mod frame;
pub mod head;
pub mod hpack;

pub use error::{Error, Reason};
