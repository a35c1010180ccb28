//! HTTP/1.1 for the fast path: request heads read into offsets over the client's buffer
//! ([`parse_request`]), chunked bodies decoded as they arrive ([`Chunked`]), and the head
//! sent upstream written by copying the client's field lines with the proxy's edits applied
//! ([`write_head`]).
//!
//! This is Sluice's second HTTP/1 parser (hyper's is the first), so it takes only what it is
//! sure of and leaves the rest to hyper ([`Defer`]). The corpus in `corpus/h1-requests.json`
//! runs through both paths in `crates/sluice/tests/h1_differential.rs`, and the fuzz target
//! `h1_request` checks every head it takes against hyper.

mod chunked;
mod forward;
mod request;

pub use chunked::{ChunkError, Chunked, Progress};
pub use forward::{write_head, Forward};
pub use request::{
    parse_request, BodyFraming, Defer, Field, Parsed, RequestHead, Role, MAX_HEADERS,
};
