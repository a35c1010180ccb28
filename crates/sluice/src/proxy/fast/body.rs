//! A response body on its way to the client: relayed by its framing through a [`Sink`], which
//! decides when the client gets what.
//!
//! A static connection's response streams: each read goes out before the next. A session's is
//! read ahead, as the hyper path reads it (`upstream::reverse::buffer`): gathered until it
//! ends, outgrows the cluster's `response_buffer`, or pauses for [`STREAM_GAP`] once some of it
//! has come, so the session goes back before a slow client has read a byte of a body that fits.
//! A chunked (or until-close) body that ends while gathered goes out with `Content-Length`.
//! Once the read-ahead is over, the rest is read off the session as the service sends it while
//! the client takes what it can, within the same budget. Events (`text/event-stream`) are never
//! read ahead.

use std::io;

use sluice_wire::h1::{self, Chunked, ResponseBody};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::answer;
use crate::http::IO_BUFFER_BYTES;
use crate::upstream::reverse::STREAM_GAP;

/// The client's side of a response relay: the head and the body bytes not sent yet, in one
/// buffer, and when to send them. The head goes out with the body's first bytes, as hyper's
/// server sends it.
pub(super) struct Sink<'c, C> {
    client: &'c mut C,
    /// The head (while unsent, its first `head` bytes), then body bytes; those before `sent`
    /// have been sent.
    out: Vec<u8>,
    head: usize,
    sent: usize,
    /// Whether body bytes (or the body's end) are in, not only the head.
    data: bool,
    /// How much body may wait in `out` (the read-ahead budget; 0: nothing waits).
    ahead: usize,
    /// The read-ahead is on: nothing has been sent yet.
    gathering: bool,
    /// The body goes out chunked. While gathered its data is kept unframed, to go out with
    /// `Content-Length` if it ends in time, or as one chunk if not.
    chunks: bool,
    /// The body's length is not in its head (chunked, or until the upstream closes): read
    /// whole ahead, it goes out with `Content-Length`.
    length_unknown: bool,
    /// Whether anything reached the client.
    pub(super) wrote: bool,
}

impl<'c, C: AsyncWrite + Unpin> Sink<'c, C> {
    /// A sink for the response whose head (written for `framing`) is all of `out`, reading
    /// ahead `ahead` bytes.
    pub(super) fn new(
        client: &'c mut C,
        out: Vec<u8>,
        framing: &h1::ResponseHead,
        head_request: bool,
        ahead: usize,
    ) -> Self {
        let chunked = matches!(
            framing.body,
            ResponseBody::Chunked | ResponseBody::UntilClose
        );
        Self {
            client,
            head: out.len(),
            out,
            sent: 0,
            data: false,
            ahead,
            gathering: ahead > 0,
            chunks: chunked && framing.http11 && !head_request,
            length_unknown: chunked && !head_request,
            wrote: false,
        }
    }

    /// The buffer, emptied, for the next response.
    pub(super) fn into_buffer(mut self) -> Vec<u8> {
        self.out.clear();
        self.out
    }

    /// Bytes not sent yet, the head included.
    fn pending(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Body bytes waiting.
    fn body_pending(&self) -> usize {
        self.out.len() - self.sent.max(self.head)
    }

    /// Adds body data, framed as the response goes out.
    fn data(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.chunks && !self.gathering {
            answer::chunk(&mut self.out, bytes);
        } else {
            self.out.extend_from_slice(bytes);
        }
        self.data = true;
    }

    /// The body has ended (`trailers`: with trailer fields, which the client does not get).
    fn end(&mut self, trailers: bool) {
        if self.gathering && self.length_unknown && !trailers {
            self.set_length();
        } else if self.chunks {
            // As the hyper path's read-ahead: a body with trailers stays chunked.
            self.stop_gathering();
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        self.data = true;
    }

    /// A body of unknown length read whole goes out with its length instead, as the hyper
    /// path's read-ahead sends it.
    fn set_length(&mut self) {
        use std::io::Write as _;
        let Some(fields_end) = self.head.checked_sub(2) else {
            return;
        };
        let mut length = Vec::with_capacity(32);
        let _ = write!(length, "content-length: {}\r\n", self.out.len() - self.head);
        let framing = b"transfer-encoding: chunked\r\n";
        let replaced = match find(&self.out[..fields_end], framing) {
            Some(at) => at..at + framing.len(),
            None => fields_end..fields_end,
        };
        self.head = self.head - replaced.len() + length.len();
        self.out.splice(replaced, length);
        self.chunks = false;
    }

    /// Ends the read-ahead: what was gathered of a chunked body becomes one chunk.
    fn stop_gathering(&mut self) {
        if !self.gathering {
            return;
        }
        self.gathering = false;
        if self.chunks && self.out.len() > self.head {
            let gathered = self.out.split_off(self.head);
            answer::chunk(&mut self.out, &gathered);
        }
    }

    /// Sends what waits once it outgrows the budget (the read-ahead then ends).
    async fn pass(&mut self) -> io::Result<()> {
        if self.data && self.body_pending() > self.ahead {
            self.stop_gathering();
            self.send().await?;
        }
        Ok(())
    }

    /// Body data straight from the upstream's read: written from `bytes` when nothing waits
    /// and nothing may, else through `out`.
    async fn forward(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.ahead == 0 && self.pending() == 0 && !self.chunks {
            self.wrote = true;
            return self.client.write_all(bytes).await;
        }
        self.data(bytes);
        self.pass().await
    }

    /// Sends everything not sent yet (a head alone only for a bodiless response, or one whose
    /// body streams with no end in sight).
    pub(super) async fn send(&mut self) -> io::Result<()> {
        if self.pending() > 0 {
            self.wrote = true;
            self.client.write_all(&self.out[self.sent..]).await?;
        }
        self.out.clear();
        self.head = 0;
        self.sent = 0;
        Ok(())
    }

    /// The body failed: when it was streaming, what was read of it still goes out (the client
    /// sees it cut short); a head without data, or a gathered body, does not.
    pub(super) async fn fail(&mut self) {
        if !self.gathering && self.data {
            let _ = self.send().await;
        }
    }

    /// Reads more of the body into `buf`. While gathering, once some body has come, a pause
    /// of [`STREAM_GAP`] ends the read-ahead. After it, what waits goes to the client while
    /// the upstream is read, so the upstream is read at its own pace within the budget.
    async fn read<U>(&mut self, upstream: &mut U, buf: &mut [u8]) -> io::Result<usize>
    where
        U: AsyncRead + Unpin,
    {
        if self.gathering && self.data {
            if let Ok(read) = tokio::time::timeout(STREAM_GAP, upstream.read(buf)).await {
                return read;
            }
            self.stop_gathering();
        }
        if self.gathering || !self.data {
            return upstream.read(buf).await;
        }
        if self.sent < self.head {
            // The head goes out with what was gathered, at once.
            self.send().await?;
        }
        while self.pending() > 0 {
            tokio::select! {
                read = upstream.read(buf) => return read,
                wrote = self.client.write(&self.out[self.sent..]) => {
                    let n = wrote?;
                    if n == 0 {
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                    self.wrote = true;
                    self.sent += n;
                }
            }
        }
        self.out.clear();
        self.sent = 0;
        upstream.read(buf).await
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Whether a response is a `text/event-stream`, whose events must reach the client as sent.
pub(super) fn is_event_stream(buf: &[u8], head: &h1::ResponseHead) -> bool {
    let value = head
        .fields
        .iter()
        .find(|f| buf[f.name.clone()].eq_ignore_ascii_case(b"content-type"))
        .map(|f| &buf[f.value.clone()]);
    value.is_some_and(|v| {
        let media = v.split(|b| *b == b';').next().unwrap_or_default();
        media
            .trim_ascii()
            .eq_ignore_ascii_case(b"text/event-stream")
    })
}

/// Relays the body by its framing: what `early` holds first, then what the upstream sends.
/// `Ok(true)` when the body ended cleanly with nothing after it (the connection or session may
/// carry another request). What is left to send stays in `sink`.
pub(super) async fn relay<U, C>(
    upstream: &mut U,
    sink: &mut Sink<'_, C>,
    head: &h1::ResponseHead,
    early: &[u8],
) -> io::Result<bool>
where
    U: AsyncRead + Unpin,
    C: AsyncWrite + Unpin,
{
    match head.body {
        ResponseBody::None => Ok(early.is_empty()),
        ResponseBody::Length(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            let now = n.min(early.len());
            sink.data(&early[..now]);
            sink.pass().await?;
            relay_exact(upstream, sink, (n - now) as u64).await?;
            Ok(early.len() <= n)
        }
        ResponseBody::Chunked => relay_chunked(upstream, sink, early).await,
        ResponseBody::UntilClose => {
            relay_until_close(upstream, sink, early).await?;
            Ok(false)
        }
    }
}

/// Relays the `rest` bytes of a body of known length.
async fn relay_exact<U, C>(
    upstream: &mut U,
    sink: &mut Sink<'_, C>,
    mut rest: u64,
) -> io::Result<()>
where
    U: AsyncRead + Unpin,
    C: AsyncWrite + Unpin,
{
    if rest == 0 {
        return Ok(());
    }
    let mut chunk = vec![0u8; IO_BUFFER_BYTES.min(usize::try_from(rest).unwrap_or(usize::MAX))];
    while rest > 0 {
        let want = chunk.len().min(usize::try_from(rest).unwrap_or(usize::MAX));
        let n = sink.read(upstream, &mut chunk[..want]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        sink.forward(&chunk[..n]).await?;
        rest -= n as u64;
    }
    Ok(())
}

/// Decodes the upstream's chunked body and relays its data (extensions and trailer fields
/// dropped, as hyper's server drops them).
async fn relay_chunked<U, C>(
    upstream: &mut U,
    sink: &mut Sink<'_, C>,
    early: &[u8],
) -> io::Result<bool>
where
    U: AsyncRead + Unpin,
    C: AsyncWrite + Unpin,
{
    let mut decoder = Chunked::new(IO_BUFFER_BYTES);
    if let Some(after) = decode(&mut decoder, sink, early)? {
        return Ok(after == 0);
    }
    sink.pass().await?;
    let mut chunk = vec![0u8; IO_BUFFER_BYTES];
    loop {
        let n = sink.read(upstream, &mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if let Some(after) = decode(&mut decoder, sink, &chunk[..n])? {
            return Ok(after == 0);
        }
        sink.pass().await?;
    }
}

/// Feeds `input` to the decoder and its data to `sink`; at the body's end, ends the sink's
/// body and returns how many bytes of `input` follow it.
fn decode<C>(
    decoder: &mut Chunked,
    sink: &mut Sink<'_, C>,
    input: &[u8],
) -> io::Result<Option<usize>>
where
    C: AsyncWrite + Unpin,
{
    let mut at = 0;
    while at < input.len() && !decoder.is_done() {
        let progress = decoder.feed(&input[at..]).map_err(io::Error::other)?;
        sink.data(&input[at..][progress.data]);
        at += progress.consumed;
    }
    if !decoder.is_done() {
        return Ok(None);
    }
    sink.end(!decoder.trailers().is_empty());
    Ok(Some(input.len() - at))
}

/// Relays everything until the upstream closes: chunked to an HTTP/1.1 client, as it comes to
/// an HTTP/1.0 one (whose end is the client connection's). Streamed, the head goes out at
/// once, as hyper's server sends it for a body of unknown length.
async fn relay_until_close<U, C>(
    upstream: &mut U,
    sink: &mut Sink<'_, C>,
    early: &[u8],
) -> io::Result<()>
where
    U: AsyncRead + Unpin,
    C: AsyncWrite + Unpin,
{
    sink.data(early);
    if sink.ahead == 0 {
        // Streamed: the head goes out now, with or without data.
        sink.send().await?;
    } else {
        sink.pass().await?;
    }
    let mut chunk = vec![0u8; IO_BUFFER_BYTES];
    loop {
        let n = sink.read(upstream, &mut chunk).await?;
        if n == 0 {
            sink.end(false);
            return Ok(());
        }
        sink.data(&chunk[..n]);
        sink.pass().await?;
    }
}
