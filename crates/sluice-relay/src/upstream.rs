//! Connections to the next hop: tuned connects to its addresses now (fixed, or a name's that
//! follows DNS), and the preamble that names the target to a tunnel end.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use sluice_net::dns::Followed;
use tokio::net::TcpStream;

use crate::copy::write_all;
use crate::options::{Forward, NextHop, RelayOptions};
use crate::preamble;
use crate::stats::Stats;

/// Connects to one next hop and speaks the preamble there.
#[derive(Debug)]
pub(crate) struct Connector {
    /// The next hop as configured, for log lines.
    pub(crate) to: String,
    /// Its addresses.
    addrs: Addrs,
    /// Where the next connect starts among the addresses (each tries them in turn).
    turn: AtomicUsize,
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
        let addrs = match &forward.to {
            NextHop::Addrs(addrs) => Addrs::Fixed(addrs.as_slice().into()),
            NextHop::Follow { name, resolve, dns } => {
                let followed = Followed::new(name.clone(), dns.clone(), *resolve);
                Addrs::Followed(Arc::new(followed))
            }
        };
        Self {
            to: forward.to.to_string(),
            addrs,
            turn: AtomicUsize::new(0),
            hello,
            target,
            opts: opts.clone(),
            stats,
        }
    }

    /// The name it follows, if its next hop is one with `resolve`.
    pub(crate) fn followed(&self) -> Option<&Arc<Followed>> {
        match &self.addrs {
            Addrs::Followed(f) => Some(f),
            Addrs::Fixed(_) => None,
        }
    }

    /// Whether `conn` (a pooled connection) goes to one of the next hop's addresses now: one
    /// made before the name moved does not, and is not handed to a client.
    pub(crate) fn is_current(&self, conn: &TcpStream) -> bool {
        match &self.addrs {
            Addrs::Fixed(_) => true,
            Addrs::Followed(f) => conn.peer_addr().is_ok_and(|a| f.has(a)),
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

    /// Connects to the next hop's addresses now, in turn from the next one on, until one
    /// answers (each within `connect_timeout`).
    async fn connect(&self) -> io::Result<TcpStream> {
        let addrs = match &self.addrs {
            Addrs::Fixed(addrs) => Arc::clone(addrs),
            Addrs::Followed(f) => f.addrs(),
        };
        let first = self.turn.fetch_add(1, Relaxed);
        let mut failed = io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "next hop `{}` has no addresses yet (its name has not resolved)",
                self.to
            ),
        );
        for i in 0..addrs.len() {
            let addr = addrs[first.wrapping_add(i) % addrs.len()];
            let start = Instant::now();
            match crate::tune::connect(addr, &self.opts).await {
                Ok(conn) => {
                    self.stats.connected(start.elapsed());
                    return Ok(conn);
                }
                Err(e) => failed = e,
            }
        }
        Err(failed)
    }
}

/// A next hop's addresses: fixed, or a name's now.
#[derive(Debug)]
enum Addrs {
    Fixed(Arc<[SocketAddr]>),
    Followed(Arc<Followed>),
}
