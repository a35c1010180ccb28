//! Sniffing the HTTP/2 preface on plaintext connections without losing what was read.

use std::io;

use sluice_session::Prefixed;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads until the first bytes either are the HTTP/2 preface or cannot become it, then returns
/// the stream with those bytes put back and whether it speaks HTTP/2 with prior knowledge.
pub(super) async fn sniff_h2<T: AsyncRead + Unpin>(mut io: T) -> io::Result<(bool, Prefixed<T>)> {
    let mut buf = Vec::with_capacity(H2_PREFACE.len());
    while buf.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&buf) {
        let mut chunk = [0u8; 24];
        let want = H2_PREFACE.len() - buf.len();
        let n = io.read(&mut chunk[..want]).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let is_h2 = buf.as_slice() == H2_PREFACE;
    Ok((is_h2, Prefixed::new(buf, io)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn detects_preface_split_across_reads_and_replays_it() {
        let (a, mut b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            b.write_all(&H2_PREFACE[..10]).await.unwrap();
            b.write_all(&H2_PREFACE[10..]).await.unwrap();
            b.write_all(b"rest").await.unwrap();
        });
        let (is_h2, mut io) = sniff_h2(a).await.unwrap();
        writer.await.unwrap();
        assert!(is_h2);
        let mut all = vec![0u8; 28];
        io.read_exact(&mut all).await.unwrap();
        assert_eq!(&all[..24], H2_PREFACE);
        assert_eq!(&all[24..], b"rest");
    }

    #[tokio::test]
    async fn http1_request_stops_sniffing_at_first_mismatch() {
        let (a, mut b) = tokio::io::duplex(64);
        b.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let (is_h2, mut io) = sniff_h2(a).await.unwrap();
        assert!(!is_h2);
        let mut head = [0u8; 16];
        io.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"GET / HTTP/1.1\r\n");
    }
}
