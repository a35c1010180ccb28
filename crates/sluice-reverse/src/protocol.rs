//! [`Protocol`]: what the proxy speaks over a registered session, as the engine needs to
//! know it. The engine pools, leases, queues, hands over and lends sessions; it never reads
//! or writes a request. The proxy (`sluice`) says how a client starts on a session's stream
//! and how to tell that it can take a request, and drives every exchange itself.

use std::future::Future;
use std::task::{Context, Poll};

use crate::stream::ParkedIo;

/// The client side of a session protocol (HTTP/1.1 in Sluice): implemented by the proxy, once.
pub trait Protocol: Send + Sync + std::fmt::Debug + 'static {
    /// A client connection over one session: what a lease hands out.
    type Client: Send + std::fmt::Debug + 'static;
    /// Drives the connection; resolves when it ends (`Ok`: it ended cleanly, and the stream
    /// may be parked for another process).
    type Connection: Future<Output = Result<(), Self::Error>> + Send + 'static;
    /// Why a connection could not start or ended badly.
    type Error: std::error::Error + Send + Sync + 'static;
    /// The proxy's own settings of a cluster (its retry rule, say): kept by the cluster and
    /// its slices for the proxy, never read by the engine.
    type Options: Default + Send + Sync + std::fmt::Debug + 'static;

    /// Starts a client over a registered stream: one request at a time (`streams` is `None`,
    /// an HTTP/1.1 session), or up to `streams` at once (an HTTP/2 session, whose client
    /// [`share`](Self::share) gives out once per further stream). The stream parks itself
    /// instead of closing when the engine hands the session to another process.
    fn handshake(
        io: ParkedIo,
        streams: Option<u32>,
    ) -> impl Future<Output = Result<(Self::Client, Self::Connection), Self::Error>> + Send;

    /// Another client on the same connection, for one more request at once (an HTTP/2
    /// session's next stream); `None` for a connection that carries one request at a time.
    /// Such a connection is *shared*: it never moves to another process (its state cannot
    /// move with its socket), and it ends once [`end`](Self::end) was called on any of its
    /// clients and all of them are dropped.
    fn share(client: &Self::Client) -> Option<Self::Client>;

    /// Whether `client` is on a shared connection: one that may carry several requests at
    /// once (HTTP/2, even of one declared stream).
    fn is_shared(client: &Self::Client) -> bool;

    /// Ends the client's connection once every client on it is dropped; no client on it may
    /// take another request ([`is_closed`](Self::is_closed) is then true). False when it was
    /// ending already. A connection that carries one request at a time ends as its client
    /// drops, so this only says true.
    fn end(client: &Self::Client) -> bool;

    /// Whether the connection has ended.
    fn is_closed(client: &Self::Client) -> bool;

    /// Ready when the client can take a request (`true`) or has ended (`false`).
    fn poll_ready(client: &mut Self::Client, cx: &mut Context<'_>) -> Poll<bool>;
}
