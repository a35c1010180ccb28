//! [`Conn`]: one keep-alive HTTP/1.1 client connection, and [`Pool`]: the idle ones.

use std::io;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::response::{Done, ResponseParser};

/// How much of a response one read takes; bodies are discarded as they arrive.
const READ_BUF: usize = 16 * 1024;

/// A connection that sends one request at a time and reads each response to its end.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    buf: Box<[u8]>,
}

impl Conn {
    /// Connects with `TCP_NODELAY`, as the small requests should leave at once.
    pub(crate) async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: vec![0; READ_BUF].into_boxed_slice(),
        })
    }

    /// Sends `request` and reads the whole response. `Done::close` says the connection must
    /// not be reused: the server said so, or sent more than the response.
    pub(crate) async fn request(&mut self, request: &[u8]) -> io::Result<Done> {
        self.stream.write_all(request).await?;
        let mut parser = ResponseParser::new();
        loop {
            let n = self.stream.read(&mut self.buf).await?;
            if n == 0 {
                return parser.eof().map_err(invalid);
            }
            let (used, done) = parser.feed(&self.buf[..n]).map_err(invalid)?;
            if let Some(done) = done {
                let close = done.close || used < n;
                return Ok(Done { close, ..done });
            }
        }
    }
}

fn invalid(e: crate::response::ParseError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// What the pool offers a request about to be sent.
#[derive(Debug)]
pub(crate) enum Checkout {
    /// An idle keep-alive connection.
    Idle(Conn),
    /// Room for a new connection, already counted as open: open it.
    Open,
    /// `max_conns` connections are open and none is idle.
    Full,
}

#[derive(Debug, Default)]
struct Inner {
    idle: Vec<Conn>,
    /// Connections open or opening, idle or busy.
    open: usize,
    /// The most open at once since the last `mark`.
    max_open: usize,
    /// Connections opened since the last `mark`.
    opened: u64,
}

/// The idle connections, and the count of all open ones, bounded by `max`.
#[derive(Debug)]
pub(crate) struct Pool {
    inner: Mutex<Inner>,
    max: usize,
}

impl Pool {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            inner: Mutex::default(),
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently idle connection (so that few stay warm), else room for a new one.
    pub(crate) fn checkout(&self) -> Checkout {
        let mut p = self.lock();
        if let Some(conn) = p.idle.pop() {
            return Checkout::Idle(conn);
        }
        if p.open >= self.max {
            return Checkout::Full;
        }
        p.open += 1;
        p.opened += 1;
        p.max_open = p.max_open.max(p.open);
        Checkout::Open
    }

    /// Returns a connection whose response ended cleanly.
    pub(crate) fn put(&self, conn: Conn) {
        self.lock().idle.push(conn);
    }

    /// A connection (or an attempt to open one) ended.
    pub(crate) fn closed(&self) {
        let mut p = self.lock();
        p.open = p.open.saturating_sub(1);
    }

    /// Starts counting `opened` and `max_open` afresh, at the end of the warmup.
    pub(crate) fn mark(&self) {
        let mut p = self.lock();
        p.opened = 0;
        p.max_open = p.open;
    }

    /// Connections opened and the most open at once, since the last `mark`.
    pub(crate) fn marks(&self) -> (u64, usize) {
        let p = self.lock();
        (p.opened, p.max_open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_bounds_open_connections_and_counts_them() {
        let pool = Pool::new(2);
        assert!(matches!(pool.checkout(), Checkout::Open));
        assert!(matches!(pool.checkout(), Checkout::Open));
        assert!(matches!(pool.checkout(), Checkout::Full));
        pool.closed();
        assert!(matches!(pool.checkout(), Checkout::Open));
        assert_eq!(pool.marks(), (3, 2));
        pool.closed();
        pool.mark();
        assert_eq!(pool.marks(), (0, 1));
    }
}
