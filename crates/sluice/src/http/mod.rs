//! The core both data paths render, without I/O: request checks, rate limits (`rate_limit`),
//! basic authentication (`basic_auth`, whose hashes run on the blocking pool), CORS (`cors`),
//! response compression (`compression`), hop-by-hop stripping, forwarding headers, a route's
//! path rewrite (`rewrite`) and redirect (`redirect`), reading bodies ahead (`read_ahead`),
//! when a request goes out again (`retry`), request IDs (`request_id`), W3C trace context
//! (`trace_context`), and what is known of a request's client ([`ClientInfo`]). Request
//! normalisation is `sluice_wire::normalize`'s.

pub(crate) mod basic_auth;
pub(crate) mod checks;
pub(crate) mod client;
pub(crate) mod compression;
pub(crate) mod cors;
pub(crate) mod grpc;
pub(crate) mod headers;
pub(crate) mod rate_limit;
pub(crate) mod read_ahead;
pub(crate) mod redirect;
pub(crate) mod request_id;
pub(crate) mod retry;
pub(crate) mod rewrite;
pub(crate) mod trace_context;

pub use client::ClientInfo;

/// How much body data hyper may hold per connection and direction: the read buffer of an
/// upstream connection or session, and the write queue towards a client.
///
/// hyper's default (about 400 KiB each, which also pins the read buffers its chunks were cut
/// from) let 500 slow readers of large responses grow the proxy to 700 MB and spend seconds
/// copying. At 64 KiB a stream that cannot move on waits in the kernel's socket buffers
/// instead, as it does behind HAProxy (16 KiB) and NGINX (`proxy_buffers`, 32-64 KiB).
pub(crate) const IO_BUFFER_BYTES: usize = 64 * 1024;

/// Inserted by the server's framing guard into the extensions of an HTTP/1 request whose
/// head carried both Content-Length and Transfer-Encoding. hyper removes Content-Length before
/// the service sees the request, so this marker is the only evidence left;
/// [`check_request`](checks::check_request) refuses it (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AmbiguousFraming;
