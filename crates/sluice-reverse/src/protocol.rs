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

    /// Starts a client over a registered stream. The stream parks itself instead of closing
    /// when the engine hands the session to another process.
    fn handshake(
        io: ParkedIo,
    ) -> impl Future<Output = Result<(Self::Client, Self::Connection), Self::Error>> + Send;

    /// Whether the connection has ended.
    fn is_closed(client: &Self::Client) -> bool;

    /// Ready when the client can take a request (`true`) or has ended (`false`).
    fn poll_ready(client: &mut Self::Client, cx: &mut Context<'_>) -> Poll<bool>;
}
