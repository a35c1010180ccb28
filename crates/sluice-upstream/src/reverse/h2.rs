//! [`H2Stream`]: one stream of an HTTP/2 session (protocol/README.md, "HTTP/2 sessions").
//!
//! The session's connection is hyper's HTTP/2 client, started as the session registers; each
//! of the streams the service declared is one unit of its slice's capacity, leased as an
//! HTTP/1.1 session is, and each unit holds a handle on the one client. The connection ends
//! when every unit is dropped (hyper then says `GOAWAY` and closes it) or the service closes
//! it; once a unit is [`end`](H2Stream::end)ed, none takes another request.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_reverse::ParkedIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tracing::warn;

use crate::connect::h2_client;
use sluice_core::body::ProxyBody;

/// One stream's lease on an HTTP/2 session.
pub struct H2Stream {
    sender: SendRequest<ProxyBody>,
    /// Set once the session is ending: shared by all its streams.
    ending: Arc<AtomicBool>,
}

impl std::fmt::Debug for H2Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Stream")
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// The session's connection, driven by its task: resolves when the connection ends.
pub(super) type H2Connection = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

impl H2Stream {
    /// Starts hyper's HTTP/2 client on a registered stream that takes `streams` requests at
    /// once (the client sends the connection preface; the service is the server).
    /// The session's task ends when its socket is closed: hyper's client may stop before
    /// (a `GOAWAY` from the service) while the connection still carries streams, and until
    /// then the session counts against its limits.
    pub(super) async fn start(io: ParkedIo, streams: u32) -> io::Result<(Self, H2Connection)> {
        let (closed, on_close) = oneshot::channel::<()>();
        let io = Watched {
            io,
            _closed: closed,
        };
        let (sender, conn) = h2_client(streams)
            .handshake(TokioIo::new(io))
            .await
            .map_err(io::Error::other)?;
        let conn: H2Connection = Box::pin(async move {
            let ended = conn.await;
            if let Err(error) = &ended {
                // Most often a service whose server does not speak HTTP/2 (it registered with
                // Sluice-Protocol: h2 all the same): no request will ever succeed on it.
                warn!(%error, "an HTTP/2 session failed; is the service's server speaking HTTP/2?");
            }
            let _ = on_close.await;
            ended.map_err(io::Error::other)
        });
        let stream = Self {
            sender,
            ending: Arc::default(),
        };
        Ok((stream, conn))
    }

    /// Another stream of the same session.
    pub(super) fn share(&self) -> Self {
        Self {
            sender: self.sender.clone(),
            ending: Arc::clone(&self.ending),
        }
    }

    /// Whether the session has ended or is ending: no stream of it takes another request.
    pub(super) fn is_closed(&self) -> bool {
        self.ending.load(Ordering::Acquire) || self.sender.is_closed()
    }

    /// Ends the session once its streams are dropped; false when it was ending already.
    pub(super) fn end(&self) -> bool {
        !self.ending.swap(true, Ordering::AcqRel)
    }

    /// Ready with `true` when a request can go, `false` when the session has ended.
    pub(super) fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if self.ending.load(Ordering::Acquire) {
            return Poll::Ready(false);
        }
        self.sender.poll_ready(cx).map(|r| r.is_ok())
    }

    /// The client, to send this stream's request with.
    pub(super) fn sender(&mut self) -> &mut SendRequest<ProxyBody> {
        &mut self.sender
    }
}

/// A session's socket as hyper's HTTP/2 client holds it: dropping it (the connection closed)
/// tells the session's task.
struct Watched {
    io: ParkedIo,
    _closed: oneshot::Sender<()>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
