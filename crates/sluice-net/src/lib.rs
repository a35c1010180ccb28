//! What every Sluice process needs of its sockets alike, whether it proxies HTTP
//! (`sluice`), lends sessions (`sluice-reverse`) or both: below the protocols, above the
//! kernel.
//!
//! # Layout
//! * [`sockets`]: [`Sockets`], every listening socket by the name it
//!   travels under in a hot restart: taken from a predecessor, or bound and remembered.
//! * [`accept`]: what an accept loop does when `accept` fails (out of descriptors: shed the
//!   backlog, back off, say so once in a while).
//! * [`shutdown`]: one trigger, many listeners of it; SIGINT and SIGTERM.
//! * [`tls`]: the crypto provider, ticket keys, PEM chains and keys, the acceptor's config.
//! * [`http`]: [`HttpOptions`](http::HttpOptions), how a listener speaks HTTP (the
//!   configuration fills it, the transport takes it).
//! * [`log_limit`]: events that could flood the log, reported once per interval with a count.
//! * [`addr`]: [`client_key`](addr::client_key), the address per-address limits count by
//!   (an IPv6 /64 is one client).
//! * [`readiness`]: [`Readiness`], whether the node takes traffic (starting, ready, draining).
//! * [`dns`]: names that follow DNS (hickory-resolver): [`Dns`](dns::Dns) (`[dns]`),
//!   [`Resolve`](dns::Resolve) (a TTL's bounds), [`Followed`](dns::Followed) (one name's
//!   addresses now).

pub mod accept;
pub mod addr;
pub mod dns;
pub mod http;
pub mod log_limit;
pub mod readiness;
pub mod shutdown;
pub mod sockets;
pub mod tls;

pub use readiness::{NodeState, Readiness};
pub use shutdown::{os_signal, Shutdown, ShutdownSignal};
pub use sockets::Sockets;
