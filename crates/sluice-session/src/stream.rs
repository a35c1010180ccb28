//! [`Prefixed`]: a stream with bytes already read from it put back in front.
//!
//! Both ends of the protocol read a head and may read past it: the service can find the first
//! request in the same segment as the acceptor's `101`, and the proxy reads ahead while
//! sniffing protocols. Whatever was read past the head belongs to what follows.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Yields `prefix` before reading from `inner`; writes go straight through.
#[derive(Debug)]
pub struct Prefixed<T> {
    prefix: Bytes,
    inner: T,
}

impl<T> Prefixed<T> {
    /// A stream that first yields `prefix`, then reads `inner`.
    pub fn new(prefix: impl Into<Bytes>, inner: T) -> Self {
        Self {
            prefix: prefix.into(),
            inner,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if !self.prefix.has_remaining() {
                // Read out: its allocation goes now, not with the stream (a connection may
                // idle for minutes after its first request).
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn replays_the_prefix_then_reads_and_writes_through() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut io = Prefixed::new(&b"GET / "[..], a);
        b.write_all(b"HTTP/1.1\r\n").await.unwrap();
        let mut got = [0u8; 16];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"GET / HTTP/1.1\r\n");
        io.write_all(b"ok").await.unwrap();
        let mut back = [0u8; 2];
        b.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ok");
    }

    #[tokio::test]
    async fn a_prefix_read_out_is_let_go() {
        let (a, _b) = tokio::io::duplex(64);
        let mut io = Prefixed::new(vec![b'x'; 4096], a);
        let mut got = vec![0u8; 4096];
        io.read_exact(&mut got).await.unwrap();
        // Not the 4 KiB allocation, advanced to its end: no allocation at all.
        assert_eq!(io.prefix.as_ptr(), Bytes::new().as_ptr());
    }
}
