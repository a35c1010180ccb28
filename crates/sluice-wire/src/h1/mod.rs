//! HTTP/1.1 for the fast path: request heads read into offsets over the client's buffer
//! ([`parse_request`]), response heads likewise ([`parse_response`]), chunked bodies decoded
//! as they arrive ([`Chunked`]), and the heads sent on written by copying the sender's field
//! lines with the proxy's edits applied ([`write_head`], [`write_response_head`]).
//!
//! This is Sluice's second HTTP/1 parser (hyper's is the first), so it takes only what it is
//! sure of and leaves the rest to hyper ([`Defer`]); responses it must judge itself, as hyper's
//! client does. The corpora in `corpus/` (requests, responses) run through both paths in
//! `crates/sluice/tests/h1_differential.rs`, and the fuzz targets `h1_request` and
//! `h1_response` check the parsers against hyper.

mod chunked;
mod forward;
mod request;
mod response;

pub use chunked::{ChunkError, Chunked, Progress};
pub use forward::{write_head, write_response_head, Answer, ClientIp, Forward};
pub use request::{
    parse_request, BodyFraming, Defer, Field, Parsed, RequestHead, Role, MAX_HEADERS,
};
pub use response::{parse_response, ParsedResponse, ResponseBody, ResponseHead, UNASKED_SWITCH};
