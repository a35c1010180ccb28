//! HTTP/2 to a static cluster's endpoints (`protocol = "h2"`, `"h2c"`, or `"auto"` where ALPN
//! agrees to it): a few multiplexed connections per endpoint, each carrying up to
//! `h2.max_streams` streams (fewer when the endpoint's `SETTINGS_MAX_CONCURRENT_STREAMS` says
//! so: hyper holds a stream back until the endpoint has room), another opened while those
//! open are full, up to `h2.max_connections`. A connection that closed or received GOAWAY is
//! left for a new one; a request hyper gives back unsent goes out again on another (the stale
//! rule of `sluice_core::retry`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use tokio::sync::Notify;

use sluice_config::H2Options;

use crate::exchange::{self, Failure};
use sluice_core::body::ProxyBody;
use sluice_core::error::ProxyError;
use sluice_core::retry;

/// One endpoint's HTTP/2 connections.
#[derive(Debug, Default)]
pub(crate) struct H2Pool {
    conns: Mutex<Vec<H2Conn>>,
    /// Connections being opened now.
    opening: AtomicUsize,
    /// Told when an opening connection opened or failed.
    opened: Notify,
}

/// What a request finds in the pool.
enum Found {
    Stream(H2Stream),
    /// No connection has room and more may open: this request opens one.
    Open,
    /// None is open yet, and as many as may are opening: wait for one.
    Wait,
}

#[derive(Debug, Clone)]
struct H2Conn {
    sender: SendRequest<ProxyBody>,
    /// Streams open on it now.
    open: Arc<AtomicUsize>,
    /// Streams it carried, ever.
    carried: Arc<AtomicU64>,
    /// It gave a request back unsent or refused a stream: it is going away (GOAWAY), and
    /// takes no new stream.
    going: Arc<AtomicBool>,
}

/// A stream leased on one of an endpoint's connections; its slot is given back when the
/// response body ends (or the stream is dropped).
#[derive(Debug)]
pub(crate) struct H2Stream {
    sender: SendRequest<ProxyBody>,
    slot: Slot,
    /// The connection carried streams before this one.
    reused: bool,
    /// Its connection's [`H2Conn::going`].
    going: Arc<AtomicBool>,
}

/// A connection's count of open streams, held by one stream until its response ends.
#[derive(Debug)]
pub(super) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl H2Pool {
    fn lock(&self) -> MutexGuard<'_, Vec<H2Conn>> {
        // Nothing spans two fields under the lock: a poisoned one is still consistent.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A stream on the least busy open connection with room; else whether to open one or to
    /// wait for those opening.
    fn take(&self, max_streams: usize, max_connections: usize) -> Found {
        let mut conns = self.lock();
        conns.retain(|c| !c.sender.is_closed() && !c.going.load(Ordering::Acquire));
        let least = conns.iter().min_by_key(|c| c.open.load(Ordering::Acquire));
        let full = least.is_none_or(|c| c.open.load(Ordering::Acquire) >= max_streams);
        if full && conns.len() + self.opening.load(Ordering::Acquire) < max_connections {
            self.opening.fetch_add(1, Ordering::AcqRel);
            return Found::Open;
        }
        // At the cap, the least busy takes it anyway: hyper holds the stream until there is
        // room.
        match least {
            Some(conn) => Found::Stream(conn.stream()),
            None => Found::Wait,
        }
    }

    /// Keeps a new connection and takes a stream on it.
    pub(super) fn add(&self, sender: SendRequest<ProxyBody>) -> H2Stream {
        let conn = H2Conn {
            sender,
            open: Arc::default(),
            carried: Arc::default(),
            going: Arc::default(),
        };
        let stream = conn.stream();
        self.lock().push(conn);
        stream
    }

    /// Closes every connection (the endpoint was removed): streams open on them end first.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Connections open now.
    pub(crate) fn connections(&self) -> usize {
        self.lock().len()
    }
}

impl H2Conn {
    fn stream(&self) -> H2Stream {
        self.open.fetch_add(1, Ordering::AcqRel);
        let carried = self.carried.fetch_add(1, Ordering::AcqRel);
        H2Stream {
            sender: self.sender.clone(),
            slot: Slot(Arc::clone(&self.open)),
            reused: carried > 0,
            going: Arc::clone(&self.going),
        }
    }
}

impl H2Stream {
    /// Whether its connection carried streams before (a failure before any response byte may
    /// then mean it was going away).
    pub(crate) fn is_reused(&self) -> bool {
        self.reused
    }

    /// Sends `req` on the stream and waits at most `timeout` for the response head: the head,
    /// and the stream's slot for the response body to hold until it ends.
    pub(super) async fn send(
        mut self,
        req: Request<ProxyBody>,
        timeout: exchange::HeadTimeout,
        (scheme, addr): (&str, std::net::SocketAddr),
    ) -> Result<(Response<Incoming>, Slot), Failure> {
        let res = exchange::send_h2(&mut self.sender, req, timeout, scheme, &addr).await;
        let res = res.inspect_err(|failure| {
            if failure.failed == retry::Failed::Unsent {
                // Its next requests go to another connection (this one's streams finish).
                self.going.store(true, Ordering::Release);
            }
        })?;
        Ok((res, self.slot))
    }
}

/// Leases a stream on one of `pool`'s connections with room, or on a new one `connect` opens.
pub(super) async fn lease<F, Fut>(
    opts: &H2Options,
    pool: &H2Pool,
    mut connect: F,
) -> Result<H2Stream, ProxyError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<SendRequest<ProxyBody>, ProxyError>>,
{
    loop {
        let opened = pool.opened.notified();
        let mut opened = std::pin::pin!(opened);
        // Registered before the pool is looked at, so that an opening that ends meanwhile is
        // not missed.
        opened.as_mut().enable();
        match pool.take(opts.max_streams, opts.max_connections) {
            Found::Stream(stream) => return Ok(stream),
            Found::Wait => opened.await,
            Found::Open => {
                // Counted as opening until it opened or failed, or the request was dropped
                // meanwhile (its client left): the waiters are told either way.
                let opening = Opening(pool);
                let connected = connect().await;
                let stream = connected.map(|sender| pool.add(sender));
                drop(opening);
                return stream;
            }
        }
    }
}

/// A connection being opened, counted in its pool's `opening` until this is dropped; dropping
/// it tells the requests waiting for it.
struct Opening<'a>(&'a H2Pool);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0.opening.fetch_sub(1, Ordering::AcqRel);
        self.0.opened.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    type Connected = Result<SendRequest<ProxyBody>, ProxyError>;

    #[tokio::test]
    async fn a_request_dropped_while_its_connection_opens_does_not_block_the_next() {
        let opts = H2Options {
            max_connections: 1,
            ..H2Options::default()
        };
        let pool = H2Pool::default();
        // The first request opens the pool's one connection, and is dropped meanwhile (its
        // client left).
        let never = || std::future::pending::<Connected>();
        let first = tokio::time::timeout(Duration::from_millis(20), lease(&opts, &pool, never));
        assert!(first.await.is_err(), "the connect never ends");
        // The next request opens one itself instead of waiting for the dropped one forever.
        let refused = || async { Err::<SendRequest<ProxyBody>, _>(ProxyError::ConnectTimeout) };
        let next = tokio::time::timeout(Duration::from_secs(5), lease(&opts, &pool, refused));
        let next = next
            .await
            .expect("the next request waited for a dropped connect");
        assert!(matches!(next, Err(ProxyError::ConnectTimeout)));
    }
}
