//! [`Compressed`]: a body compressed as it streams, chunk by chunk.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use async_compression::tokio::write::{BrotliEncoder, GzipEncoder, ZstdEncoder};
use async_compression::Level;
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use sluice_config::{Encoding, Levels};
use tokio::io::AsyncWrite;

use super::{BoxError, ProxyBody};

/// The largest window an encoder keeps (a power of two): 256 KiB, so that a stream's memory
/// stays bounded whatever the level (zstd's and brotli's defaults reach megabytes).
const WINDOW_LOG: u32 = 18;

/// `body`, compressed as it is read: each chunk goes through the encoder as it comes, and what
/// the encoder has produced goes out (after a flush of the encoder when `flush`, so that an
/// event is readable as soon as it was sent). Nothing but the encoder's state and one chunk's
/// output is held.
#[derive(Debug)]
pub struct Compressed {
    body: Pin<Box<ProxyBody>>,
    encoder: Encoder,
    flush: bool,
    /// The body has ended and the encoder has written its end.
    finished: bool,
    trailers: Option<HeaderMap>,
}

impl Compressed {
    pub fn new(body: ProxyBody, encoding: Encoding, levels: &Levels, flush: bool) -> Self {
        Self {
            body: Box::pin(body),
            encoder: Encoder::new(encoding, levels),
            flush,
            finished: false,
            trailers: None,
        }
    }

    /// Feeds the encoder what `frame` brings; trailers end the stream.
    fn take(&mut self, frame: Option<Frame<Bytes>>) -> io::Result<()> {
        match frame.map(Frame::into_data) {
            Some(Ok(data)) => {
                self.encoder.write(&data)?;
                if self.flush {
                    self.encoder.flush()?;
                }
            }
            Some(Err(frame)) => {
                self.trailers = frame.into_trailers().ok();
                self.finish()?;
            }
            None => self.finish()?,
        }
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        self.finished = true;
        self.encoder.finish()
    }
}

impl Body for Compressed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(data) = this.encoder.output() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if this.finished {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match std::task::ready!(this.body.as_mut().poll_frame(cx)) {
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(frame)) => this.take(Some(frame))?,
                None => this.take(None)?,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.trailers.is_none() && self.encoder.is_drained()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// One of the encoders, writing into a buffer that [`output`](Self::output) empties.
#[derive(Debug)]
enum Encoder {
    Zstd(ZstdEncoder<Vec<u8>>),
    /// Boxed: its state is some 5 KiB inline, the others' a few hundred bytes.
    Brotli(Box<BrotliEncoder<Vec<u8>>>),
    Gzip(GzipEncoder<Vec<u8>>),
}

impl Encoder {
    fn new(encoding: Encoding, levels: &Levels) -> Self {
        match encoding {
            Encoding::Zstd => {
                use async_compression::zstd::CParameter;
                let window = [CParameter::window_log(WINDOW_LOG)];
                let level = Level::Precise(levels.zstd);
                Self::Zstd(ZstdEncoder::with_quality_and_params(
                    Vec::new(),
                    level,
                    &window,
                ))
            }
            Encoding::Brotli => {
                let params = async_compression::brotli::EncoderParams::default()
                    .quality(Level::Precise(i32::try_from(levels.br).unwrap_or(11)))
                    .window_size(WINDOW_LOG as i32);
                Self::Brotli(Box::new(BrotliEncoder::with_params(Vec::new(), params)))
            }
            Encoding::Gzip => {
                let level = Level::Precise(i32::try_from(levels.gzip).unwrap_or(9));
                Self::Gzip(GzipEncoder::with_quality(Vec::new(), level))
            }
        }
    }

    fn writer(&mut self) -> Pin<&mut (dyn AsyncWrite + Send + Unpin)> {
        match self {
            Self::Zstd(e) => Pin::new(e),
            Self::Brotli(e) => Pin::new(&mut **e),
            Self::Gzip(e) => Pin::new(e),
        }
    }

    fn buffer(&mut self) -> &mut Vec<u8> {
        match self {
            Self::Zstd(e) => e.get_mut(),
            Self::Brotli(e) => e.get_mut(),
            Self::Gzip(e) => e.get_mut(),
        }
    }

    fn is_drained(&self) -> bool {
        match self {
            Self::Zstd(e) => e.get_ref().is_empty(),
            Self::Brotli(e) => e.get_ref().is_empty(),
            Self::Gzip(e) => e.get_ref().is_empty(),
        }
    }

    /// What the encoder has produced since the last call, if anything.
    fn output(&mut self) -> Option<Bytes> {
        let buffer = self.buffer();
        (!buffer.is_empty()).then(|| Bytes::from(std::mem::take(buffer)))
    }

    fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = now(|cx| self.writer().poll_write(cx, data))?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            data = &data[n..];
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        now(|cx| self.writer().poll_flush(cx))
    }

    fn finish(&mut self) -> io::Result<()> {
        now(|cx| self.writer().poll_shutdown(cx))
    }
}

/// Runs an encoder's step: it writes into memory, which is always ready, so it never waits.
fn now<T>(step: impl FnOnce(&mut Context<'_>) -> Poll<io::Result<T>>) -> io::Result<T> {
    match step(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => Err(io::Error::other("an encoder waited on memory")),
    }
}
