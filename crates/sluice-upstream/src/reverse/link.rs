//! [`Link`]: the proxy's end of one session, driven two ways.
//!
//! The fast path (`proxy::fast`) writes requests on the session's socket and reads the answers
//! itself; hyper's HTTP/1.1 client serves what the fast path leaves (HTTP/2 clients,
//! streamed uploads, upgrades). A session is *raw* while the fast path has it or while it is
//! idle after the fast path used it, and *hyper* from the first request hyper sends on it until
//! the fast path takes it back: hyper's connection then ends without a shutdown and gives the
//! socket back ([`Link::take_io`]). Each way keeps its own cost when traffic is all of one kind.
//!
//! Someone must notice a service closing an idle session, so that its place in the session
//! limits is freed and the slice's counts are true. In the hyper way hyper's connection task
//! reads the socket. In the raw way the session's task ([`Watch`], the engine's connection
//! future) is the socket's reader while the session is idle: each return to the idle ring
//! registers it on the socket ([`Link::put_io`]), so no task runs and nothing is polled per
//! request beyond that registration.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use sluice_reverse::ParkedIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tracing::debug;

use sluice_core::body::ProxyBody;
use sluice_core::read_ahead::IO_BUFFER_BYTES;

/// A session's socket, wherever it is (idle in its [`Link`], borrowed by the fast path, or
/// inside hyper's connection). Dropping it ends the session: its [`Watch`] resolves, after the
/// socket was parked when the session is being handed to another process.
pub struct SessionIo {
    /// `None` only while it is being dropped.
    io: Option<ParkedIo>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SessionIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionIo").finish_non_exhaustive()
    }
}

impl Drop for SessionIo {
    fn drop(&mut self) {
        // The socket first (parked, or closed), then the news.
        drop(self.io.take());
        self.shared.end();
    }
}

impl SessionIo {
    fn io(&mut self) -> io::Result<Pin<&mut ParkedIo>> {
        self.io
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "session ended"))
    }

    /// Reads without waiting: `true` when nothing is there (the service is quiet), `false`
    /// when it closed the session, failed, or sent bytes no request asked for. While quiet,
    /// `cx`'s task is woken when that changes.
    fn quiet(&mut self, cx: &mut Context<'_>) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        let Ok(io) = self.io() else {
            return false;
        };
        io.poll_read(cx, &mut buf).is_pending()
    }
}

impl AsyncRead for SessionIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.io()?.poll_read(cx, buf)
    }
}

impl AsyncWrite for SessionIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io()?.poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io()?.poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io()?.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.io()?.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(AsyncWrite::is_write_vectored)
    }
}

/// What a session's [`Link`], its socket and its [`Watch`] share.
#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
    /// The session has ended: its socket was dropped, or handed to an upgrade.
    done: AtomicBool,
    /// It ended badly (closed by the service, a protocol error): not to be handed over.
    failed: AtomicBool,
    /// The link let go of hyper's client (to take the socket back, or because the session is
    /// being dropped or handed over): hyper's connection ending is expected. Unset, the
    /// connection ended on its own (the service closed the session) and its socket is done.
    reclaimed: AtomicBool,
}

/// The socket of an idle raw session, and the session task that watches it.
#[derive(Default)]
struct Slot {
    io: Option<SessionIo>,
    watcher: Option<Waker>,
}

impl Shared {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // Nothing spans two fields: a poisoned lock is still consistent.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session has ended (its socket is gone or upgraded): wakes its task.
    fn end(&self) {
        self.done.store(true, Ordering::Release);
        let watcher = self.slot().watcher.take();
        if let Some(waker) = watcher {
            waker.wake();
        }
    }

    fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Takes the idle socket out of the slot.
    fn take(&self) -> Option<SessionIo> {
        self.slot().io.take()
    }
}

/// The session's task: resolves when the session ends, `Err` when it ended badly. While the
/// session idles raw, it is the one reading its socket.
pub struct Watch {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

impl Watch {
    fn ended(&self) -> Poll<io::Result<()>> {
        if self.shared.failed.load(Ordering::Acquire) {
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the service closed the session or broke the protocol",
            )))
        } else {
            Poll::Ready(Ok(()))
        }
    }
}

impl Future for Watch {
    type Output = io::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.shared.is_done() {
            return self.ended();
        }
        let mut slot = self.shared.slot();
        if !slot
            .watcher
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            slot.watcher = Some(cx.waker().clone());
        }
        let noisy = slot.io.as_mut().is_some_and(|io| !io.quiet(cx));
        if noisy {
            self.shared.fail();
            let io = slot.io.take();
            drop(slot);
            debug!("an idle session was closed by its service");
            drop(io);
            return self.ended();
        }
        drop(slot);
        // `end` may have come between the first check and the waker's registration.
        if self.shared.is_done() {
            return self.ended();
        }
        Poll::Pending
    }
}

/// The proxy's end of a session: its socket, or hyper's client on it.
pub struct Link {
    shared: Arc<Shared>,
    hyper: Option<Hyper>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("hyper", &self.hyper.is_some())
            .finish_non_exhaustive()
    }
}

/// hyper's client on a session, and where its connection gives the socket back.
struct Hyper {
    sender: http1::SendRequest<ProxyBody>,
    /// The socket, once hyper's connection has ended cleanly with nothing unread.
    back: oneshot::Receiver<Option<SessionIo>>,
    /// Started for an upgrade: the socket is never given back.
    upgrade: bool,
}

impl Drop for Link {
    fn drop(&mut self) {
        // hyper's connection, if it has the socket, ends as the client drops: expected.
        self.shared.reclaimed.store(true, Ordering::Release);
        // Dropped outside the lock: dropping the socket takes it.
        let io = self.shared.take();
        drop(io);
    }
}

impl Link {
    /// A link over a freshly registered socket, idle, and the task that watches it.
    pub(super) fn new(io: ParkedIo) -> (Self, Watch) {
        let shared = Arc::new(Shared::default());
        let io = SessionIo {
            io: Some(io),
            shared: Arc::clone(&shared),
        };
        shared.slot().io = Some(io);
        let watch = Watch {
            shared: Arc::clone(&shared),
        };
        let link = Self {
            shared,
            hyper: None,
        };
        (link, watch)
    }

    /// Whether the session has ended.
    pub(super) fn is_closed(&self) -> bool {
        self.shared.is_done() || self.hyper.as_ref().is_some_and(|h| h.sender.is_closed())
    }

    /// Ready with `true` when the session can take a request, `false` when it has ended.
    pub(super) fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if let Some(hyper) = &mut self.hyper {
            return hyper.sender.poll_ready(cx).map(|r| r.is_ok());
        }
        let mut slot = self.shared.slot();
        let Some(io) = slot.io.as_mut() else {
            return Poll::Ready(false);
        };
        if io.quiet(cx) {
            return Poll::Ready(true);
        }
        self.shared.fail();
        let io = slot.io.take();
        drop(slot);
        drop(io);
        Poll::Ready(false)
    }

    /// The socket, for the fast path to exchange a request on; hyper's connection, if it had
    /// the session, ends first and gives it back. `None`: the session has ended.
    pub(crate) async fn take_io(&mut self) -> Option<SessionIo> {
        match self.hyper.take() {
            Some(Hyper { sender, back, .. }) => {
                self.shared.reclaimed.store(true, Ordering::Release);
                drop(sender);
                back.await.ok().flatten()
            }
            None => self.shared.take(),
        }
    }

    /// Gives the socket back after a clean exchange: the session idles raw, and its task is
    /// the socket's reader until the next lease. `false` (and the socket is closed) when the
    /// service has closed it or sent more than it was asked for.
    pub(crate) fn put_io(&mut self, mut io: SessionIo) -> bool {
        let mut slot = self.shared.slot();
        // Borrowed, not cloned: the socket's registration clones it only when it changed.
        let watcher = slot.watcher.as_ref().unwrap_or(Waker::noop());
        if io.quiet(&mut Context::from_waker(watcher)) {
            slot.io = Some(io);
            return true;
        }
        self.shared.fail();
        drop(slot);
        drop(io);
        false
    }

    /// hyper's client on the session, started if the session was raw; `upgrade` when the
    /// request asks to switch protocols (hyper then keeps the socket for the upgrade, and
    /// the session ends with the exchange). `None`: the session has ended.
    pub(super) async fn hyper(
        &mut self,
        upgrade: bool,
    ) -> Option<&mut http1::SendRequest<ProxyBody>> {
        if self.hyper.as_ref().is_some_and(|h| h.upgrade != upgrade) {
            let io = self.take_io().await?;
            self.hyper = Some(self.start(io, upgrade).await?);
        } else if self.hyper.is_none() {
            let io = self.shared.take()?;
            self.hyper = Some(self.start(io, upgrade).await?);
        }
        self.hyper.as_mut().map(|h| &mut h.sender)
    }

    /// Whether hyper's client was started for an upgrade: such a session does not carry
    /// another request (its socket stays with hyper's connection, which closes it).
    pub(super) fn is_upgrade(&self) -> bool {
        self.hyper.as_ref().is_some_and(|h| h.upgrade)
    }

    async fn start(&self, io: SessionIo, upgrade: bool) -> Option<Hyper> {
        let started = http1::Builder::new()
            .max_buf_size(IO_BUFFER_BYTES)
            .handshake(TokioIo::new(io))
            .await;
        let (sender, conn) = match started {
            Ok(started) => started,
            Err(e) => {
                debug!(error = %e, "hyper's client did not start on a session");
                self.shared.fail();
                return None;
            }
        };
        let (tx, back) = oneshot::channel();
        let shared = Arc::clone(&self.shared);
        if upgrade {
            tokio::spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    debug!(error = %e, "session ended with an error");
                    shared.fail();
                }
                // Upgraded or not, the session ends here: a 101 moved the socket to the
                // proxy's bridge, and the service may register a replacement.
                shared.end();
                drop(tx);
            });
        } else {
            self.shared.reclaimed.store(false, Ordering::Release);
            tokio::spawn(async move {
                let ended = conn.without_shutdown().await;
                let asked = shared.reclaimed.load(Ordering::Acquire);
                let io = match ended {
                    Ok(parts) if asked && parts.read_buf.is_empty() => Some(parts.io.into_inner()),
                    Ok(_) if !asked => {
                        debug!("an idle session was closed by its service");
                        shared.fail();
                        None
                    }
                    Ok(_) => {
                        debug!("a session sent more than its last response; closed");
                        shared.fail();
                        None
                    }
                    Err(e) => {
                        debug!(error = %e, "session ended with an error");
                        shared.fail();
                        None
                    }
                };
                // Nobody waits for it when the link has gone: it is dropped (and parked, when
                // the session is being handed over).
                let _ = tx.send(io);
            });
        }
        Some(Hyper {
            sender,
            back,
            upgrade,
        })
    }
}
