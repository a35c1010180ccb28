//! A response body on its way to the client: relayed by its framing through a [`Sink`], which
//! decides when the client gets what.
//!
//! A static connection's response streams: each read goes out before the next. A session's is
//! read ahead by the rules of `sluice_core::read_ahead`, which the hyper path's reader follows too:
//! gathered until it ends, outgrows the cluster's `response_buffer`, or pauses, so the session
//! goes back before a slow client has read a byte of a body that fits. A chunked (or
//! until-close) body that ends while gathered goes out with `Content-Length`. Once the
//! read-ahead is over, the rest is read off the session as the service sends it while the
//! client takes what it can, within the same budget; a body that outgrew a budget of one read
//! (the default `response_buffer`) streams on as a static connection's does.

use std::io;
use std::time::Duration;

use sluice_wire::h1::{self, Chunked, ResponseBody};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::answer;
use sluice_core::read_ahead::IO_BUFFER_BYTES;
use sluice_core::read_ahead::{self, ReadAhead};

/// At most what a chunk's size line and CRLFs add to its data.
const CHUNK_FRAMING_BYTES: usize = 20;

/// The client's side of a response relay: the head and the body bytes not sent yet, in one
/// buffer, and when to send them. The head goes out with the body's first bytes, as hyper's
/// server sends it. With a budget (a session's, after its read-ahead, until its body outgrows
/// a budget of one read: `stream_on`), the upstream is read into a second buffer while the
/// client takes what waits in the first; without one (a static connection's), each read goes
/// out before the next.
pub(super) struct Sink<'c, C> {
    client: &'c mut C,
    /// The head (while unsent, its first `head` bytes), then body bytes; those before `sent`
    /// have been sent.
    out: Vec<u8>,
    head: usize,
    sent: usize,
    /// What the upstream's last read brought.
    spare: Vec<u8>,
    /// Whether body bytes (or the body's end) are in, not only the head.
    data: bool,
    /// How much body may wait in `out` before the client must take it first (0: none; each
    /// read goes out before the next). Reads stop at it, and `out` grows no further.
    budget: usize,
    /// While the read-ahead is on (nothing has been sent yet), its rules.
    gathering: Option<ReadAhead>,
    /// The body goes out chunked. While gathered its data is kept unframed, to go out with
    /// `Content-Length` if it ends in time, or as one chunk if not.
    chunks: bool,
    /// The body's length is not in its head (chunked, or until the upstream closes): read
    /// whole ahead, it goes out with `Content-Length`.
    length_unknown: bool,
    /// Whether anything reached the client.
    pub(super) wrote: bool,
    /// The body's data bytes (not its chunk framing) taken in to go out.
    payload: u64,
}

impl<'c, C: AsyncWrite + Unpin> Sink<'c, C> {
    /// A sink for the response whose head (written for `framing`) is all of `out`; `spare`
    /// takes the upstream's reads. With `read_ahead`, the response is gathered up to that
    /// many bytes before the client gets any; without, it streams.
    pub(super) fn new(
        client: &'c mut C,
        (out, spare): (Vec<u8>, Vec<u8>),
        framing: &h1::ResponseHead,
        head_request: bool,
        read_ahead: Option<ReadAhead>,
    ) -> Self {
        let unknown = matches!(
            framing.body,
            ResponseBody::Chunked | ResponseBody::UntilClose
        );
        Self {
            client,
            head: out.len(),
            out,
            sent: 0,
            spare,
            data: false,
            budget: read_ahead.map_or(0, |ahead| ahead.limit()),
            gathering: read_ahead,
            chunks: unknown && framing.http11 && !head_request,
            length_unknown: unknown && !head_request,
            wrote: false,
            payload: 0,
        }
    }

    /// The buffers, emptied, for the next response.
    pub(super) fn into_buffers(mut self) -> (Vec<u8>, Vec<u8>) {
        self.out.clear();
        self.spare.clear();
        (self.out, self.spare)
    }

    /// Bytes not sent yet, the head included.
    fn pending(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Body bytes waiting.
    fn body_pending(&self) -> usize {
        self.out.len() - self.sent.max(self.head)
    }

    /// The body's data bytes that reached the client, NGINX's `$body_bytes_sent` as the hyper
    /// path counts it (without chunk framing): all of them once the body went out whole;
    /// for a body cut short, less what still waited (its framing counted as data).
    pub(super) fn data_sent(&self, complete: bool) -> u64 {
        if complete {
            return self.payload;
        }
        let unsent = self.out.len() - self.sent.max(self.head.min(self.out.len()));
        self.payload.saturating_sub(unsent as u64)
    }

    /// Makes room in `out` for `n` more bytes: doubling, but not past the head, the budget
    /// and these bytes (a slow client's connection holds no more than that).
    fn grow(&mut self, n: usize) {
        let needed = self.out.len() + n;
        if needed <= self.out.capacity() {
            return;
        }
        let cap = (self.head + self.budget + n).max(needed);
        let target = (self.out.capacity() * 2).clamp(needed, cap);
        self.out.reserve_exact(target - self.out.len());
    }

    /// Adds body data, framed as the response goes out.
    fn data(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.grow(bytes.len() + CHUNK_FRAMING_BYTES);
        self.payload += bytes.len() as u64;
        if self.chunks && self.gathering.is_none() {
            answer::chunk(&mut self.out, bytes);
        } else {
            self.out.extend_from_slice(bytes);
        }
        self.data = true;
    }

    /// Adds what the last read brought as body data: when nothing waits and it goes out as it
    /// is, by taking the read's buffer for `out` instead of copying it.
    fn data_read(&mut self) {
        if self.pending() == 0 && !self.chunks && !self.spare.is_empty() {
            self.payload += self.spare.len() as u64;
            std::mem::swap(&mut self.out, &mut self.spare);
            self.spare.clear();
            self.head = 0;
            self.sent = 0;
            self.data = true;
        } else {
            let read = std::mem::take(&mut self.spare);
            self.data(&read);
            self.spare = read;
        }
    }

    /// The body has ended (`trailers`: with trailer fields, which the client does not get).
    fn end(&mut self, trailers: bool) {
        if self.gathering.is_some() && self.length_unknown && ReadAhead::ends_with_length(trailers)
        {
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
        if self.gathering.take().is_none() {
            return;
        }
        if self.chunks && self.out.len() > self.head {
            let gathered = self.out.split_off(self.head);
            answer::chunk(&mut self.out, &gathered);
        }
    }

    /// Sends what waits once it fills the budget; a read-ahead ends once it outgrows it.
    ///
    /// After a send with `more` of the body to come, the task yields to the worker's other
    /// connections, so that each moves a buffer's worth in turn, as hyper's two tasks per
    /// exchange do. A large body sent in one burst (read, send, read, send, ... on one pair of
    /// sockets) costs the proxy and its peers more kernel time per byte: 1 MiB bodies took
    /// 1.1–1.2× the CPU per MiB at 0.87× the MB/s that way.
    async fn pass(&mut self, more: bool) -> io::Result<()> {
        let pending = self.body_pending();
        let full = match self.gathering {
            Some(ahead) => ahead.outgrown(pending),
            None => pending >= self.budget.max(1),
        };
        if self.data && full {
            self.stop_gathering();
            self.send().await?;
            if (1..=IO_BUFFER_BYTES).contains(&self.budget) && self.payload > self.budget as u64 {
                self.stream_on();
            }
            if more {
                tokio::task::yield_now().await;
            }
        }
        Ok(())
    }

    /// The body has outgrown a budget no larger than a read: reading on within it would bring
    /// the body's end (when the session goes back) no nearer than reading read by read does,
    /// so the rest streams as a static connection's body does, into `out` alone (a chunked
    /// one's reads go through `spare`, which grows back), and buffers lent with the room an
    /// earlier response grew them to shrink to a read's; the next body past a budget grows
    /// them again (500 slow readers of 4 MiB bodies from sessions: 84–85 MiB of peak RSS
    /// before, 70–72 after). A larger budget is memory the operator gave for session time,
    /// and stays.
    fn stream_on(&mut self) {
        self.budget = 0;
        self.out.shrink_to(IO_BUFFER_BYTES + CHUNK_FRAMING_BYTES);
        self.spare = Vec::new();
    }

    /// Sends everything not sent yet (a head alone only for a bodiless response, or one whose
    /// body streams with no end in sight).
    pub(super) async fn send(&mut self) -> io::Result<()> {
        if self.pending() > 0 {
            self.wrote = true;
            self.client.write_all(&self.out[self.sent..]).await?;
            // A TLS stream may keep the last records: they go out now, not with the next write.
            self.client.flush().await?;
        }
        self.out.clear();
        self.head = 0;
        self.sent = 0;
        Ok(())
    }

    /// The body failed: when it was streaming, what was read of it still goes out (the client
    /// sees it cut short); a head without data, or a gathered body, does not.
    pub(super) async fn fail(&mut self) {
        if self.gathering.is_none() && self.data {
            let _ = self.send().await;
        }
    }

    /// Reads up to `want` more bytes of a body that goes out as it is (not chunked) and adds
    /// them; 0 at its end. When nothing has to go to the client meanwhile they are read
    /// straight into `out`, so a connection whose client is slow holds one buffer, not two.
    async fn read_raw<U>(&mut self, upstream: &mut U, want: usize) -> io::Result<usize>
    where
        U: AsyncRead + Unpin,
    {
        let drains = self.gathering.is_none() && self.data && self.pending() > 0;
        if self.chunks || drains {
            let read = self.read(upstream, want).await?;
            self.data_read();
            return Ok(read);
        }
        let want = self.room(want);
        self.grow(want);
        let mut limited = (&mut *upstream).take(want as u64);
        let read = if let Some(gap) = self.gap() {
            let read = limited.read_buf(&mut self.out);
            match tokio::time::timeout(gap, read).await {
                Ok(read) => read?,
                Err(_gap) => {
                    // The read-ahead ends: what was gathered goes out while the rest is read.
                    self.stop_gathering();
                    let read = self.read(upstream, want).await?;
                    self.data_read();
                    return Ok(read);
                }
            }
        } else {
            limited.read_buf(&mut self.out).await?
        };
        self.payload += read as u64;
        self.data |= read > 0;
        Ok(read)
    }

    /// At most `want` bytes, and no more than the budget has room for (`pass` has sent what
    /// filled it; gathering, as much as the read-ahead takes).
    fn room(&self, want: usize) -> usize {
        let pending = self.body_pending();
        let room = match (self.budget, self.gathering) {
            (0, _) => IO_BUFFER_BYTES,
            (_, Some(ahead)) => ahead.room(pending),
            (budget, None) => budget.saturating_sub(pending),
        };
        want.min(IO_BUFFER_BYTES).min(room.max(1))
    }

    /// How long a read may wait before the read-ahead ends and what was gathered goes out.
    fn gap(&self) -> Option<Duration> {
        self.gathering?.wait(self.body_pending())
    }

    /// Reads up to `want` more bytes of the body into `spare`; 0 at its end. While gathering,
    /// a pause ends the read-ahead. Streaming, what waits goes to the client while the upstream
    /// is read.
    async fn read<U>(&mut self, upstream: &mut U, want: usize) -> io::Result<usize>
    where
        U: AsyncRead + Unpin,
    {
        self.spare.clear();
        let want = self.room(want);
        if self.spare.capacity() < want {
            self.spare.reserve_exact(want);
        }
        let mut upstream = upstream.take(want as u64);
        if let Some(gap) = self.gap() {
            let read = upstream.read_buf(&mut self.spare);
            if let Ok(read) = tokio::time::timeout(gap, read).await {
                return read;
            }
            self.stop_gathering();
        }
        if self.gathering.is_some() || !self.data {
            return upstream.read_buf(&mut self.spare).await;
        }
        let sends = self.pending() > 0;
        if self.sent < self.head {
            // The head goes out with what waits, at once.
            self.send().await?;
        }
        while self.pending() > 0 {
            tokio::select! {
                // The client first: the upstream is read while the client cannot take more.
                biased;
                wrote = self.client.write(&self.out[self.sent..]) => {
                    let n = wrote?;
                    if n == 0 {
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                    self.wrote = true;
                    self.sent += n;
                }
                read = upstream.read_buf(&mut self.spare) => return read,
            }
        }
        self.out.clear();
        self.sent = 0;
        if sends {
            // What waited has gone out: the worker's other connections take their turn before
            // this one reads on, as after a send in `pass` (a budget above one buffer sends
            // most of a body from here).
            tokio::task::yield_now().await;
        }
        // What a TLS stream still holds goes out while the upstream is read (a TCP stream's
        // flush is done at once).
        let mut flushed = false;
        loop {
            tokio::select! {
                read = upstream.read_buf(&mut self.spare) => return read,
                done = self.client.flush(), if !flushed => {
                    done?;
                    flushed = true;
                }
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Whether a response is a `text/event-stream`, whose events must reach the client as sent.
pub(super) fn is_event_stream(buf: &[u8], head: &h1::ResponseHead) -> bool {
    head.fields
        .iter()
        .find(|f| buf[f.name.clone()].eq_ignore_ascii_case(b"content-type"))
        .is_some_and(|f| read_ahead::is_event_stream(&buf[f.value.clone()]))
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
            let mut rest = (n - now) as u64;
            sink.pass(rest > 0).await?;
            while rest > 0 {
                let want = usize::try_from(rest).unwrap_or(usize::MAX);
                let read = sink.read_raw(upstream, want).await?;
                if read == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                rest -= read as u64;
                sink.pass(rest > 0).await?;
            }
            Ok(early.len() <= n)
        }
        ResponseBody::Chunked => relay_chunked(upstream, sink, early).await,
        ResponseBody::UntilClose => {
            relay_until_close(upstream, sink, early).await?;
            Ok(false)
        }
    }
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
    sink.pass(true).await?;
    loop {
        if sink.read(upstream, IO_BUFFER_BYTES).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let read = std::mem::take(&mut sink.spare);
        let decoded = decode(&mut decoder, sink, &read);
        sink.spare = read;
        if let Some(after) = decoded? {
            return Ok(after == 0);
        }
        sink.pass(true).await?;
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
    if sink.gathering.is_some() {
        sink.pass(true).await?;
    } else {
        // Streamed: the head goes out now, with or without data.
        sink.send().await?;
    }
    loop {
        if sink.read_raw(upstream, IO_BUFFER_BYTES).await? == 0 {
            sink.end(false);
            return Ok(());
        }
        sink.pass(true).await?;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Cursor;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use sluice_wire::h1::ParsedResponse;

    use super::*;

    /// A client that always takes all it is given, and notes in a log shared by all clients
    /// which connection each write came from.
    struct Noted {
        conn: u8,
        log: Arc<Mutex<Vec<u8>>>,
    }

    impl AsyncWrite for Noted {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.log.lock().unwrap().push(self.conn);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A response head for a body of `len` bytes: its text, and parsed.
    fn head_for(len: usize) -> (String, h1::ResponseHead) {
        let text = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
        let ParsedResponse::Head(head) = h1::parse_response(text.as_bytes(), false, 1 << 16) else {
            panic!("the test's head does not parse");
        };
        (text, head)
    }

    /// Relays a body of `len` bytes from an upstream whose bytes are all there (read ahead
    /// that far first, if `read_ahead`).
    async fn relay_body(
        conn: u8,
        len: usize,
        read_ahead: Option<usize>,
        log: Arc<Mutex<Vec<u8>>>,
    ) -> bool {
        let (_, head) = head_for(len);
        let mut upstream = Cursor::new(vec![b'x'; len]);
        let mut client = Noted { conn, log };
        let bufs = (b"head".to_vec(), Vec::new());
        let read_ahead = read_ahead.map(ReadAhead::response);
        let mut sink = Sink::new(&mut client, bufs, &head, false, read_ahead);
        let clean = relay(&mut upstream, &mut sink, &head, &[]).await.unwrap();
        sink.send().await.unwrap();
        clean
    }

    /// Two connections' bodies relayed on one worker: the writes each made, in order.
    async fn two_bodies(len: usize, read_ahead: Option<usize>) -> Vec<u8> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let first = tokio::spawn(relay_body(1, len, read_ahead, Arc::clone(&log)));
        let second = tokio::spawn(relay_body(2, len, read_ahead, Arc::clone(&log)));
        assert!(first.await.unwrap() && second.await.unwrap());
        let log = log.lock().unwrap().clone();
        let last_of_first = log.iter().rposition(|c| *c == 1).unwrap();
        let first_of_second = log.iter().position(|c| *c == 2).unwrap();
        assert!(
            first_of_second < last_of_first,
            "the first body went out whole before the second began: {log:?}"
        );
        log
    }

    /// On one worker, two connections streaming large bodies whose bytes are all there take
    /// turns: neither body goes out whole while the other waits.
    #[tokio::test(flavor = "current_thread")]
    async fn streamed_bodies_of_two_connections_go_out_in_turn() {
        let log = two_bodies(4 * IO_BUFFER_BYTES, None).await;
        assert_eq!(
            log.len(),
            2 * 4,
            "four buffers each, the head with the first: {log:?}"
        );
    }

    /// So do two sessions' bodies once they outgrow their read-ahead.
    #[tokio::test(flavor = "current_thread")]
    async fn bodies_past_the_read_ahead_go_out_in_turn() {
        two_bodies(4 * IO_BUFFER_BYTES, Some(IO_BUFFER_BYTES)).await;
    }

    /// Past a read-ahead of several buffers, most of a long body goes out from the read loop
    /// rather than from `pass`: there too, each buffer sent gives the other connection its
    /// turn, while both are sending.
    #[tokio::test(flavor = "current_thread")]
    async fn a_long_body_past_a_large_read_ahead_goes_out_in_turn() {
        let log = two_bodies(12 * IO_BUFFER_BYTES, Some(4 * IO_BUFFER_BYTES)).await;
        let last = |conn| log.iter().rposition(|c| *c == conn).unwrap();
        let both_sending = &log[..=last(1).min(last(2))];
        let longest = both_sending.chunk_by(|a, b| a == b).map(<[u8]>::len).max();
        assert!(
            longest <= Some(2),
            "one connection sent {longest:?} buffers in a row: {log:?}"
        );
    }

    /// A client that takes its first `takes` writes whole and then nothing.
    struct Stalls {
        takes: usize,
    }

    impl AsyncWrite for Stalls {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.takes == 0 {
                return Poll::Pending;
            }
            self.takes -= 1;
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Relays a body of `len` bytes (all there upstream) into `sink` until its client stops
    /// taking them: a minute of (paused) time goes by without the relay ending.
    async fn relay_until_stalled(sink: &mut Sink<'_, Stalls>, head: &h1::ResponseHead, len: usize) {
        let mut upstream = Cursor::new(vec![b'x'; len]);
        let relayed = relay(&mut upstream, sink, head, &[]);
        let stalled = tokio::time::timeout(Duration::from_secs(60), relayed).await;
        assert!(
            stalled.is_err(),
            "a body went out to a client that stopped reading"
        );
    }

    /// A client that stops reading a body past its read-ahead holds one buffer of it, however
    /// much room the buffers it was lent had grown to for an earlier response (the pool keeps
    /// that room): a reverse cluster's slow readers held the budget, a read and that room.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_slow_reader_past_the_read_ahead_holds_one_buffer() {
        let len = 1 << 20;
        let (text, head) = head_for(len);
        let mut out = Vec::with_capacity(2 * IO_BUFFER_BYTES + text.len());
        out.extend_from_slice(text.as_bytes());
        let spare = Vec::with_capacity(IO_BUFFER_BYTES);
        let mut client = Stalls { takes: 3 };
        let ahead = Some(ReadAhead::response(IO_BUFFER_BYTES));
        let mut sink = Sink::new(&mut client, (out, spare), &head, false, ahead);
        relay_until_stalled(&mut sink, &head, len).await;
        assert!(sink.pending() > 0, "nothing waits for the client");
        let held = sink.out.capacity() + sink.spare.capacity();
        assert!(
            held <= IO_BUFFER_BYTES + CHUNK_FRAMING_BYTES,
            "{held} bytes held for a client that stopped reading"
        );
    }

    /// A budget larger than a read is still used past the read-ahead: the session's body is
    /// read on ahead of a client that stopped reading, so that its session goes back sooner.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_larger_budget_still_reads_ahead_of_a_slow_reader() {
        let (len, budget) = (1 << 20, 4 * IO_BUFFER_BYTES);
        let (text, head) = head_for(len);
        let mut client = Stalls { takes: 3 };
        let bufs = (text.as_bytes().to_vec(), Vec::new());
        let ahead = Some(ReadAhead::response(budget));
        let mut sink = Sink::new(&mut client, bufs, &head, false, ahead);
        relay_until_stalled(&mut sink, &head, len).await;
        assert!(
            sink.pending() >= budget,
            "{} bytes read ahead of the client, within a budget of {budget}",
            sink.pending()
        );
    }
}
