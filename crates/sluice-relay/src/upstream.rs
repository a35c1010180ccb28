//! Connections to the next hop: tuned connects, and the preamble that names the target to a
//! tunnel end.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::copy::write_all;
use crate::options::{Forward, RelayOptions};
use crate::preamble;
use crate::stats::Stats;

/// Connects to one next hop and speaks the preamble there.
#[derive(Debug)]
pub(crate) struct Connector {
    /// The next hop.
    pub(crate) to: SocketAddr,
    /// The hello sent as soon as a connection is up (tunnel only).
    hello: Vec<u8>,
    /// The target sent when a client takes the connection (tunnel only).
    target: Vec<u8>,
    opts: RelayOptions,
    pub(crate) stats: Arc<Stats>,
}

impl Connector {
    pub(crate) fn new(forward: &Forward, opts: &RelayOptions, stats: Arc<Stats>) -> Self {
        let (mut hello, mut target) = (Vec::new(), Vec::new());
        if let Some(t) = &forward.tunnel {
            preamble::encode_hello(&t.token.0, &mut hello);
            preamble::encode_target(t.target, &mut target);
        }
        Self {
            to: forward.to,
            hello,
            target,
            opts: opts.clone(),
            stats,
        }
    }

    /// Whether this connector names a target to a tunnel end (else: a plain forwarder).
    pub(crate) fn names_target(&self) -> bool {
        !self.hello.is_empty()
    }

    /// A connection for the pool: connected, and authenticated by the hello.
    pub(crate) async fn pooled(&self) -> io::Result<TcpStream> {
        let conn = self.connect().await?;
        write_all(&conn, &self.hello).await?;
        Ok(conn)
    }

    /// A connection for a client now: `pooled` (taken from the pool) if there is one, else a
    /// new one; either way with the target named.
    pub(crate) async fn for_client(&self, pooled: Option<TcpStream>) -> io::Result<TcpStream> {
        if let Some(conn) = pooled {
            write_all(&conn, &self.target).await?;
            return Ok(conn);
        }
        let conn = self.connect().await?;
        write_all(&conn, &[&self.hello[..], &self.target[..]].concat()).await?;
        Ok(conn)
    }

    async fn connect(&self) -> io::Result<TcpStream> {
        let start = Instant::now();
        let conn = crate::tune::connect(self.to, &self.opts).await?;
        self.stats.connected(start.elapsed());
        Ok(conn)
    }
}
