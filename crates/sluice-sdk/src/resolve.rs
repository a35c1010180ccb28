//! [`Resolver`]: how the names of a many-node acceptor become nodes (`ip:port`), and the
//! order the SDK lists them in (the split's ties fall to the first listed).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

type Resolve = dyn Fn(String, u16) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>
    + Send
    + Sync;

/// Resolves a host and port to socket addresses: every A and AAAA record. The default is the
/// system resolver (`getaddrinfo`, as [`tokio::net::lookup_host`]); tests inject a table.
#[derive(Clone)]
pub struct Resolver(Arc<Resolve>);

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resolver")
    }
}

impl Default for Resolver {
    fn default() -> Self {
        Self::system()
    }
}

impl Resolver {
    /// The system resolver (`/etc/hosts`, DNS), via [`tokio::net::lookup_host`].
    pub fn system() -> Self {
        Self::new(|host, port| async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    }

    /// A resolver that calls `resolve(host, port)`; an error keeps the nodes the name had.
    pub fn new<F, Fut>(resolve: F) -> Self
    where
        F: Fn(String, u16) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'static,
    {
        Self(Arc::new(move |host, port| Box::pin(resolve(host, port))))
    }

    /// Every address of `host` at `port`.
    pub(crate) async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        (self.0)(host.to_owned(), port).await
    }
}

/// The nodes, in the order the SDK lists them: by entry, and within one entry by address;
/// an address that two entries name counts once, at the first.
pub(crate) fn listed(per_entry: &[Vec<SocketAddr>]) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for addrs in per_entry {
        let mut sorted = addrs.clone();
        sorted.sort();
        for addr in sorted {
            if !out.contains(&addr) {
                out.push(addr);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|_| panic!("{s}"))
    }

    #[test]
    fn nodes_are_listed_by_entry_then_address_once_each() {
        let per_entry = vec![
            vec![addr("10.0.0.3:7"), addr("10.0.0.2:7")],
            vec![addr("10.0.0.1:7"), addr("10.0.0.2:7")],
        ];
        assert_eq!(
            listed(&per_entry),
            [addr("10.0.0.2:7"), addr("10.0.0.3:7"), addr("10.0.0.1:7")]
        );
    }
}
