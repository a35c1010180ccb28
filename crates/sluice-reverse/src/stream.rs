//! The byte stream under a session, and how its socket is taken back for a handoff.
//!
//! A session is served by hyper's HTTP/1.1 client, which owns the stream and closes it when
//! the connection ends. To move an idle session to another process (a hot restart's new
//! Sluice, or back to a standalone acceptor), the pool marks its [`Parking`] and lets go of the
//! session: hyper then ends the connection cleanly, [`ParkedIo`] skips the shutdown (the
//! socket stays open for its next owner) and parks the stream instead of closing it, and the
//! session's task passes the socket on.

use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// A registered session's byte stream.
pub trait SessionStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    /// The socket, for passing to another process; `None` when it cannot move (TLS keeps
    /// state in this process).
    fn into_fd(self: Box<Self>) -> Option<OwnedFd>;
}

impl SessionStream for TcpStream {
    fn into_fd(self: Box<Self>) -> Option<OwnedFd> {
        self.into_std().ok().map(OwnedFd::from)
    }
}

impl SessionStream for UnixStream {
    fn into_fd(self: Box<Self>) -> Option<OwnedFd> {
        self.into_std().ok().map(OwnedFd::from)
    }
}

impl<S: AsyncRead + AsyncWrite + Send + Unpin + 'static> SessionStream
    for tokio_rustls::server::TlsStream<S>
{
    fn into_fd(self: Box<Self>) -> Option<OwnedFd> {
        None
    }
}

/// A stream from a socket another process handed over: TCP or UNIX, whichever it is.
pub(crate) fn from_fd(fd: OwnedFd) -> io::Result<Box<dyn SessionStream>> {
    let socket = socket2::Socket::from(fd);
    socket.set_nonblocking(true)?;
    if socket.r#type()? != socket2::Type::STREAM {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a stream socket",
        ));
    }
    if socket.domain()? == socket2::Domain::UNIX {
        let std = std::os::unix::net::UnixStream::from(OwnedFd::from(socket));
        return Ok(Box::new(UnixStream::from_std(std)?));
    }
    let std = std::net::TcpStream::from(socket);
    Ok(Box::new(TcpStream::from_std(std)?))
}

/// Whether a session's stream is to be kept when its connection ends, and where it waits.
///
/// `state` settles a race between the pool handing an idle session over and its connection
/// ending on its own (the service closed it): exactly one side learns that the session was
/// wanted but will never be parked, so the hand-over can count it as lost.
#[derive(Default)]
pub(crate) struct Parking {
    state: AtomicU8,
    parked: Mutex<Option<Box<dyn SessionStream>>>,
}

/// Neither wanted nor ended.
const RUNNING: u8 = 0;
/// The pool let go of the session and wants its stream back.
const WANTED: u8 = 1;
/// The connection task finished without the stream being wanted.
const ENDED: u8 = 2;

impl std::fmt::Debug for Parking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parking")
            .field("wanted", &self.wanted())
            .finish_non_exhaustive()
    }
}

impl Parking {
    /// Asks for the stream back when the connection ends (set before letting go of it).
    /// False when the connection task had already finished: nothing will be parked.
    pub(crate) fn want(&self) -> bool {
        let set = self
            .state
            .compare_exchange(RUNNING, WANTED, Ordering::AcqRel, Ordering::Acquire);
        matches!(set, Ok(_) | Err(WANTED))
    }

    fn wanted(&self) -> bool {
        self.state.load(Ordering::Acquire) == WANTED
    }

    /// Called once by the connection task when the connection has ended: whether the stream
    /// was wanted (from then on [`want`](Self::want) answers false).
    pub(crate) fn end(&self) -> bool {
        let set = self
            .state
            .compare_exchange(RUNNING, ENDED, Ordering::AcqRel, Ordering::Acquire);
        set == Err(WANTED)
    }

    /// The parked stream, once hyper has let go of it.
    pub(crate) fn take(&self) -> Option<Box<dyn SessionStream>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The stream as hyper sees it: everything passes through, except that a wanted stream is
/// neither shut down nor closed but parked.
pub struct ParkedIo {
    io: Option<Box<dyn SessionStream>>,
    parking: Arc<Parking>,
}

impl std::fmt::Debug for ParkedIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkedIo")
            .field("parking", &self.parking)
            .finish_non_exhaustive()
    }
}

impl ParkedIo {
    pub(crate) fn new(io: Box<dyn SessionStream>, parking: Arc<Parking>) -> Self {
        Self {
            io: Some(io),
            parking,
        }
    }

    fn io(&mut self) -> io::Result<&mut Box<dyn SessionStream>> {
        // `io` is only `None` inside `drop`.
        self.io
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "session stream parked"))
    }
}

impl Drop for ParkedIo {
    fn drop(&mut self) {
        if self.parking.wanted() {
            let mut slot = self
                .parking
                .parked
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            *slot = self.io.take();
        }
    }
}

impl AsyncRead for ParkedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(self.io()?).poll_read(cx, buf)
    }
}

impl AsyncWrite for ParkedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.io()?).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.io()?).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.parking.wanted() {
            // The socket lives on in another process: no FIN.
            return Poll::Ready(Ok(()));
        }
        Pin::new(self.io()?).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.io()?).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }
}
