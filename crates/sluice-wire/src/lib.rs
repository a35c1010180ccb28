//! The parsers Sluice runs over bytes it does not control, kept free of I/O and of the engine
//! so that each can be fuzzed alone (`fuzz/` in the repository) and read in one sitting.
//!
//! # Layout
//! * [`framing`]: [`Scanner`](framing::Scanner) follows HTTP/1 request heads and bodies in a
//!   client's byte stream and finds the request that carried both `Content-Length` and
//!   `Transfer-Encoding` (the smuggling vector hyper accepts silently).
//! * [`h1`]: the fast path's HTTP/1.1 request heads (offsets, framing, the verdict take or
//!   leave to hyper), chunked bodies, and the head written upstream with the proxy's edits.
//! * [`normalize`]: the path, host and header names a request is routed on, normalised so the
//!   route is chosen on the request the upstream will see ([`RequestRules`]).
//! * [`cert`]: the names of a client certificate (mTLS at the acceptor).
//! * [`fields`]: header fields by what they are to a proxy (hop-by-hop, forwarding,
//!   Sluice's own): the one table both data paths consult.
//! * [`grpc`]: `grpc-timeout` and the gRPC health protocol's messages.

pub mod cert;
pub mod fields;
pub mod framing;
pub mod grpc;
pub mod h1;
pub mod normalize;

pub use normalize::{BadRequest, EscapedSlashes, RequestRules, Underscores};
