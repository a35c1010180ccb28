//! [`Fake`]: a session protocol for the engine's tests, with no HTTP in it. Its client reads
//! nothing and writes nothing: the tests say when it can take a request ([`Line::busy`],
//! [`Line::ready`]) and when its connection fails ([`Line::fail`]); its connection runs over
//! the real [`ParkedIo`] stream and ends as hyper's HTTP/1.1 client does:
//!
//! * cleanly when the client is dropped (the session was let go, or retired): the stream is
//!   shut down (which a parked stream skips) and dropped (which parks a wanted one);
//! * cleanly at EOF (the service closed its end);
//! * with an error when the service sends bytes nobody asked for, or the test fails it. A
//!   failed connection is never parked.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::protocol::Protocol;
use crate::stream::ParkedIo;

/// The protocol: see the module's documentation.
#[derive(Debug)]
pub(crate) struct Fake;

/// A fake client: what a lease hands out. Dropping it ends its connection cleanly.
#[derive(Debug)]
pub(crate) struct FakeClient {
    line: Line,
}

impl FakeClient {
    /// A handle to steer this client while it is idle in a pool.
    pub(crate) fn line(&self) -> Line {
        self.line.clone()
    }
}

impl Drop for FakeClient {
    fn drop(&mut self) {
        self.line.end(End::Dropped);
    }
}

/// A handle to one fake client and its connection (clones share it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Line(Arc<Mutex<LineState>>);

#[derive(Debug, Default)]
struct LineState {
    /// The client cannot take a request yet (the exchange before has not wound down).
    busy: bool,
    /// The connection has ended (or is ending: the client knows it is done).
    closed: bool,
    /// Why the connection is to end, once it is.
    end: Option<End>,
    /// Waits for the client to be ready.
    ready: Option<Waker>,
    /// The connection, waiting for its end.
    conn: Option<Waker>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The client was dropped: a clean end.
    Dropped,
    /// The test failed the connection.
    Failed,
}

impl Line {
    fn state(&self) -> MutexGuard<'_, LineState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client cannot take a request until [`ready`](Self::ready).
    pub(crate) fn busy(&self) {
        self.state().busy = true;
    }

    /// The client can take a request again.
    pub(crate) fn ready(&self) {
        let waker = {
            let mut st = self.state();
            st.busy = false;
            st.ready.take()
        };
        waker.into_iter().for_each(Waker::wake);
    }

    /// Ends the connection with an error, as a broken exchange does: the socket closes.
    pub(crate) fn fail(&self) {
        self.end(End::Failed);
    }

    fn end(&self, why: End) {
        let wakers = {
            let mut st = self.state();
            st.closed = true;
            st.end.get_or_insert(why);
            [st.ready.take(), st.conn.take()]
        };
        wakers.into_iter().flatten().for_each(Waker::wake);
    }

    /// The connection's end has come (by the client's side).
    fn poll_end(&self, cx: &mut Context<'_>) -> Poll<End> {
        let mut st = self.state();
        match st.end {
            Some(end) => Poll::Ready(end),
            None => {
                st.conn = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Protocol for Fake {
    type Client = FakeClient;
    type Connection = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;
    type Error = io::Error;
    type Options = ();

    async fn handshake(
        io: ParkedIo,
        _streams: Option<u32>,
    ) -> io::Result<(FakeClient, Self::Connection)> {
        let line = Line::default();
        let conn = Box::pin(run(io, line.clone()));
        Ok((FakeClient { line }, conn))
    }

    fn share(_: &FakeClient) -> Option<FakeClient> {
        None
    }

    fn is_shared(_: &FakeClient) -> bool {
        false
    }

    fn end(_: &FakeClient) -> bool {
        true
    }

    fn is_closed(client: &FakeClient) -> bool {
        client.line.state().closed
    }

    fn poll_ready(client: &mut FakeClient, cx: &mut Context<'_>) -> Poll<bool> {
        let mut st = client.line.state();
        if st.closed {
            return Poll::Ready(false);
        }
        if st.busy {
            st.ready = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(true)
    }
}

/// The connection: waits for its end, from either side.
async fn run(mut io: ParkedIo, line: Line) -> io::Result<()> {
    let mut byte = [0u8; 1];
    let ended = tokio::select! {
        end = std::future::poll_fn(|cx| line.poll_end(cx)) => match end {
            End::Dropped => Ok(()),
            End::Failed => Err(io::Error::other("the test failed the connection")),
        },
        read = io.read(&mut byte) => match read {
            Ok(0) => Ok(()),
            Ok(_) => Err(io::Error::new(io::ErrorKind::InvalidData, "bytes nobody asked for")),
            Err(error) => Err(error),
        },
    };
    line.end(End::Dropped);
    if ended.is_ok() {
        // As hyper closes a connection; a stream wanted elsewhere is not shut down.
        let _ = io.shutdown().await;
    }
    // A wanted stream parks here, before the session's task looks for it.
    drop(io);
    ended
}
