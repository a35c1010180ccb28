//! Sniffing the HTTP/2 preface on plaintext connections without losing what was read.

use std::future::poll_fn;
use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use super::io::poll_read_first;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the connection's first bytes (most request heads whole, so that the fast path parses
/// the first request with no second read), and on until they either are the HTTP/2 preface
/// or cannot become it; returns whether it speaks HTTP/2 with prior knowledge, and those bytes
/// (whoever serves the connection starts from them).
///
/// The first read has no timer of its own: the stream's (the connection's
/// [`IdleTimeout`](super::io::IdleTimeout) with its first wait) bounds it. A preface split
/// across reads, which is rare, must be complete by `deadline` (the header timeout from the
/// accept), not a fresh timeout after its first byte.
pub(super) async fn sniff_h2<T: AsyncRead + Unpin>(
    io: &mut T,
    deadline: Instant,
) -> io::Result<(bool, Vec<u8>)> {
    let mut buf = Vec::new();
    poll_fn(|cx| poll_read_first(io, cx, |bytes| buf.extend_from_slice(bytes))).await?;
    if !buf.is_empty() && undecided(&buf) {
        let rest = async {
            while undecided(&buf) {
                let mut chunk = [0u8; 24];
                let n = io.read(&mut chunk[..H2_PREFACE.len() - buf.len()]).await?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Ok::<_, io::Error>(())
        };
        // Boxed: a preface split across reads is rare, and its timer would otherwise take
        // room in every connection's state.
        Box::pin(tokio::time::timeout_at(deadline, rest))
            .await
            .map_err(|_| {
                io::Error::new(io::ErrorKind::TimedOut, "the HTTP/2 preface timed out")
            })??;
    }
    Ok((buf.starts_with(H2_PREFACE), buf))
}

/// Whether `buf` is a proper beginning of the preface: more bytes decide.
fn undecided(buf: &[u8]) -> bool {
    buf.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(buf)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::pin::Pin;
    use std::task::Poll;
    use std::time::Duration;

    use sluice_session::Prefixed;
    use tokio::io::{AsyncWriteExt, ReadBuf};

    use super::*;

    fn in_5s() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn detects_preface_split_across_reads_and_replays_it() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            b.write_all(&H2_PREFACE[..10]).await.unwrap();
            b.write_all(&H2_PREFACE[10..]).await.unwrap();
            b.write_all(b"rest").await.unwrap();
        });
        let (is_h2, first) = sniff_h2(&mut a, in_5s()).await.unwrap();
        writer.await.unwrap();
        assert!(is_h2);
        let mut io = Prefixed::new(first, a);
        let mut all = vec![0u8; 28];
        io.read_exact(&mut all).await.unwrap();
        assert_eq!(&all[..24], H2_PREFACE);
        assert_eq!(&all[24..], b"rest");
    }

    #[tokio::test]
    async fn http1_request_stops_sniffing_at_first_mismatch() {
        let (mut a, mut b) = tokio::io::duplex(64);
        b.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let (is_h2, first) = sniff_h2(&mut a, in_5s()).await.unwrap();
        assert!(!is_h2);
        assert_eq!(first, b"GET / HTTP/1.1\r\n");
    }

    /// Counts the reads that returned bytes.
    struct Counting<T>(T, usize);

    impl<T: AsyncRead + Unpin> AsyncRead for Counting<T> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let before = buf.filled().len();
            let polled = Pin::new(&mut self.0).poll_read(cx, buf);
            if buf.filled().len() > before {
                self.1 += 1;
            }
            polled
        }
    }

    #[tokio::test]
    async fn a_whole_head_is_taken_in_one_read() {
        let head = b"GET /a/longer/path HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n";
        let (a, mut b) = tokio::io::duplex(4096);
        b.write_all(head).await.unwrap();
        drop(b);
        let mut counting = Counting(a, 0);
        let (is_h2, first) = sniff_h2(&mut counting, in_5s()).await.unwrap();
        assert!(!is_h2);
        let mut io = Prefixed::new(first, counting);
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, head);
        // The sniff's read took the head whole: what followed found only the end.
        assert_eq!(io.get_ref().1, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_preface_that_stalls_times_out_at_the_deadline_from_the_accept() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let started = Instant::now();
        let deadline = started + Duration::from_secs(2);
        // Its first bytes come late; the rest never: the deadline stays where it was.
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            b.write_all(&H2_PREFACE[..8]).await.unwrap();
            b
        });
        let err = sniff_h2(&mut a, deadline).await.err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        drop(writer.await.unwrap());
    }
}
