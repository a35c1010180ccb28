//! [`IdleTimeout`]: closes a connection on which no byte has moved for a while, or that has not
//! begun its next request by a deadline.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::active::ActiveRequests;

/// Wraps a stream so that reads and writes fail with `TimedOut` once neither direction has
/// made progress for `timeout` while no request is in flight on it (or, with
/// [`with_first_wait`](Self::with_first_wait), for a shorter first wait until the first byte
/// moves), and, while a deadline set by [`wait_until`](Self::wait_until) stands, from that
/// deadline on whatever moves.
///
/// The timer is re-armed lazily: progress only records an instant, and the sleep is pushed
/// back when it fires early, so the per-operation cost is one clock read. It is made (and
/// entered into Tokio's timer wheel) only when the stream first has to wait: a connection
/// whose bytes are there each time it reads (a request sent with the connect) never has one.
#[derive(Debug)]
pub struct IdleTimeout<T> {
    inner: T,
    timeout: Duration,
    /// How long the connection may stay silent from `last_progress`: `timeout`, or a shorter
    /// first wait until its first byte moves.
    window: Duration,
    last_progress: Instant,
    /// A deadline progress does not move ([`wait_until`](Self::wait_until)): a client must
    /// begin its next request by then, however it moves bytes (over TLS, a record trickled
    /// byte by byte moves bytes but brings no request).
    until: Option<Instant>,
    /// Made at the first wait.
    sleep: Option<Pin<Box<Sleep>>>,
    active: Arc<ActiveRequests>,
    /// Bytes received and sent, when the listener counts them.
    bytes: Option<crate::counters::ByteCounters>,
}

impl<T> IdleTimeout<T> {
    /// Wraps `inner`; the clock starts now. While `active` counts a request in flight (an
    /// upstream taking its time, a long poll, a server-sent event stream), the timer re-arms.
    pub fn new(inner: T, timeout: Duration, active: Arc<ActiveRequests>) -> Self {
        Self {
            inner,
            timeout,
            window: timeout,
            last_progress: Instant::now(),
            until: None,
            sleep: None,
            active,
            bytes: None,
        }
    }

    /// The stream it wraps.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Adds every byte read and written to these counters.
    pub fn with_byte_counters(mut self, bytes: Option<crate::counters::ByteCounters>) -> Self {
        self.bytes = bytes;
        self
    }

    /// Until its first byte moves, the connection may wait only `first` (the listener's
    /// `request_header_timeout`; the idle timeout if that is shorter): a client that connects
    /// and sends nothing is closed then, by the timer this stream has anyway, with no timer of
    /// its own per connection.
    pub fn with_first_wait(mut self, first: Duration) -> Self {
        self.window = first.min(self.timeout);
        self
    }

    /// Reads fail from `until` on, even with bytes there, and a write that has to wait fails
    /// then, whatever moved before, until [`request_began`](Self::request_began): the header
    /// timeout for the next request on a keep-alive connection.
    pub fn wait_until(&mut self, until: Instant) {
        self.until = Some(until);
        let at = self.expiry();
        if let Some(sleep) = &mut self.sleep {
            sleep.as_mut().reset(at);
        }
    }

    /// The request waited for by [`wait_until`](Self::wait_until) has begun: only the idle
    /// timeout counts again.
    pub fn request_began(&mut self) {
        self.until = None;
    }

    /// When the connection fails unless a byte moves first (or, with `until`, regardless).
    fn expiry(&self) -> Instant {
        let idle = deadline(self.last_progress, self.window);
        self.until.map_or(idle, |until| until.min(idle))
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
        self.window = self.timeout;
    }

    fn count_sent(&self, written: &io::Result<usize>) {
        if let (Some((_, sent)), Ok(n)) = (&self.bytes, written) {
            sent.inc_by(*n as u64);
        }
    }

    /// Ready with an error when the idle deadline (or `until`) has passed; registers the waker
    /// otherwise.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let at = self.expiry();
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.active.any() {
                self.progressed();
            }
            let at = self.expiry();
            let now = Instant::now();
            if at <= now {
                let what = if self.until.is_some_and(|until| until <= now) {
                    "no request within request_header_timeout"
                } else if self.window < self.timeout {
                    "no byte within request_header_timeout"
                } else {
                    "connection idle timeout"
                };
                return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, what));
            }
            if let Some(sleep) = &mut self.sleep {
                sleep.as_mut().reset(at);
            }
        }
    }
}

/// How much a connection's first read for a request takes: most request heads whole.
pub const FIRST_READ_BYTES: usize = 4096;

/// Polls one read of up to [`FIRST_READ_BYTES`] into a buffer on the stack, which lives only
/// while the read is polled (never in a connection's state, so an idle connection holds no
/// room for it), and gives the bytes to `take` (not called at the end of the stream); ready
/// with how many came.
pub fn poll_read_first<I: AsyncRead + Unpin>(
    io: &mut I,
    cx: &mut Context<'_>,
    take: impl FnOnce(&[u8]),
) -> Poll<io::Result<usize>> {
    let mut first = [MaybeUninit::<u8>::uninit(); FIRST_READ_BYTES];
    let mut read = ReadBuf::uninit(&mut first);
    ready!(Pin::new(io).poll_read(cx, &mut read))?;
    let bytes = read.filled();
    if !bytes.is_empty() {
        take(bytes);
    }
    Poll::Ready(Ok(bytes.len()))
}

/// `start + timeout`, or a far future when that overflows (a timeout of centuries).
pub fn deadline(start: Instant, timeout: Duration) -> Instant {
    start
        .checked_add(timeout)
        .unwrap_or_else(|| start + Duration::from_secs(86_400 * 365 * 30))
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Checked before the read: a request that comes after its deadline is not served.
        if let Some(until) = self.until {
            if until <= Instant::now() {
                let late = "no request within request_header_timeout";
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, late)));
            }
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                self.progressed();
                if let Some((received, _)) = &self.bytes {
                    received.inc_by((buf.filled().len() - before) as u64);
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.poll_expired(cx).map(Err),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                self.progressed();
                self.count_sent(&r);
                Poll::Ready(r)
            }
            Poll::Pending => self.poll_expired(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => {
                self.progressed();
                self.count_sent(&r);
                Poll::Ready(r)
            }
            Poll::Pending => self.poll_expired(cx).map(Err),
        }
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

    /// Bytes that keep coming do not move a deadline set by `wait_until` (over TLS, a record
    /// trickled byte by byte brings no request); once the request has begun, only the idle
    /// timeout counts again.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_no_byte_moves() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut idle = IdleTimeout::new(a, Duration::from_secs(60), Arc::default());
        let started = Instant::now();
        idle.wait_until(started + Duration::from_secs(2));
        let trickle = tokio::spawn(async move {
            while b.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut buf = [0u8; 8];
        let err = loop {
            match idle.read(&mut buf).await {
                Ok(n) => assert!(n > 0),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        idle.request_began();
        assert!(idle.read(&mut buf).await.unwrap() > 0);
        trickle.abort();
    }

    /// A request whose bytes are there only after its deadline is not read (its connection
    /// waited too long), even though the read would not have to wait.
    #[tokio::test(start_paused = true)]
    async fn bytes_there_after_the_deadline_are_not_read() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut idle = IdleTimeout::new(a, Duration::from_secs(60), Arc::default());
        idle.wait_until(Instant::now() + Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(2)).await;
        b.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let err = idle.read(&mut [0u8; 16]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn read_fails_after_idle_and_progress_postpones_it() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut idle = IdleTimeout::new(a, Duration::from_secs(10), Arc::default());
        let mut buf = [0u8; 8];
        tokio::time::sleep(Duration::from_secs(6)).await;
        b.write_all(b"x").await.unwrap();
        assert_eq!(idle.read(&mut buf).await.unwrap(), 1);
        // 6 s after the byte: still alive, although 12 s have passed since the start.
        let started = Instant::now();
        let err = idle.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_wait_is_shorter_until_a_byte_moves() {
        let first = Duration::from_secs(2);
        let mut buf = [0u8; 8];
        // Silent from the start: closed after the first wait, not the idle timeout.
        let (a, _silent_peer) = tokio::io::duplex(64);
        let mut silent =
            IdleTimeout::new(a, Duration::from_secs(10), Arc::default()).with_first_wait(first);
        let started = Instant::now();
        let err = silent.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), first);
        // Once a byte has moved, the idle timeout rules.
        let (a, mut b) = tokio::io::duplex(64);
        let mut talking =
            IdleTimeout::new(a, Duration::from_secs(10), Arc::default()).with_first_wait(first);
        b.write_all(b"x").await.unwrap();
        assert_eq!(talking.read(&mut buf).await.unwrap(), 1);
        let started = Instant::now();
        let err = talking.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_the_connection_open() {
        let (a, b) = tokio::io::duplex(64);
        let active = Arc::new(ActiveRequests::default());
        let mut idle = IdleTimeout::new(a, Duration::from_secs(10), Arc::clone(&active));
        let guard = active.begin();
        let mut buf = [0u8; 8];
        // A minute of silence while a request is in flight: the read is still pending.
        let read = tokio::time::timeout(Duration::from_secs(60), idle.read(&mut buf)).await;
        assert!(
            read.is_err(),
            "the idle timer fired under a request in flight"
        );
        drop(guard);
        let started = Instant::now();
        assert_eq!(
            idle.read(&mut buf).await.unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
        assert!(started.elapsed() <= Duration::from_secs(10));
        drop(b);
    }
}
