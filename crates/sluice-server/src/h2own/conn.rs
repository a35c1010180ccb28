//! One HTTP/2 connection's state and the loop that drives it: read and act on frames, collect
//! answers, pull bodies under flow control, write.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use sluice_h2::frame::{self, Head, DEFAULT_MAX_FRAME, DEFAULT_WINDOW, HEAD_LEN, PREFACE};
use sluice_h2::hpack::Decoder;
use sluice_h2::{Error, Reason};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::calm::Calm;
use super::inbound::{Feed, CREDIT_STEP};
use super::out::{Out, Tagged};
use super::wakes::Wakes;
use super::{Given, Pipeline};
use crate::active::{ActiveGuard, ActiveRequests};
use crate::service::BoxError;

/// The most streams a client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS), as
/// hyper's server allows.
pub(super) const MAX_STREAMS: u32 = 200;

/// The connection's receive window, raised at the start from the default: each stream's is the
/// default (64 KiB), so a stream whose reader is slow holds that much and the others go on.
pub(super) const CONN_WINDOW: u32 = 1 << 20;

/// Bytes waiting to be written above which the connection stops taking more work (reading
/// frames, pulling bodies) until the client reads: a client that sends and does not read
/// (PINGs, SETTINGS, requests) is held, not buffered for.
pub(super) const WRITE_HIGH: usize = 64 * 1024;

/// One read's room, on the stack: a partial frame left over is kept, nothing else.
const READ_CHUNK: usize = 16 * 1024;

/// What the client's SETTINGS said.
#[derive(Debug, Clone, Copy)]
pub(super) struct PeerSettings {
    pub(super) initial_window: u32,
    pub(super) max_frame: u32,
}

/// One open stream.
pub(super) struct Stream {
    /// The request body's feed, until the client ends it.
    pub(super) feed: Option<Feed>,
    /// The client ended its side (END_STREAM).
    pub(super) recv_closed: bool,
    /// What the client may still send on it, and its declared and received body lengths.
    pub(super) recv_window: i64,
    pub(super) declared: Option<u64>,
    pub(super) received: u64,
    /// What the server may still send on it.
    pub(super) send_window: i64,
    pub(super) out: Out,
    /// The answer's future, to drop it when the stream is reset.
    pub(super) abort: Option<futures_util::future::AbortHandle>,
    /// Counts the request among the connection's in flight.
    pub(super) _active: ActiveGuard,
}

/// A header block being received (HEADERS, then CONTINUATION until END_HEADERS).
pub(super) struct Block {
    pub(super) stream: u32,
    pub(super) end_stream: bool,
    pub(super) bytes: Vec<u8>,
}

/// One connection.
pub(super) struct Conn<'a, I> {
    io: I,
    pub(super) pipeline: &'a Arc<dyn Pipeline>,
    pub(super) given_info: sluice_core::ClientInfo,
    pub(super) http: &'a sluice_net::http::HttpOptions,
    pub(super) active: &'a Arc<ActiveRequests>,
    pub(super) fields: &'a [(http::HeaderName, http::HeaderValue)],
    /// A partial frame (or preface) left from the last read.
    rbuf: Vec<u8>,
    /// Bytes to write, and how many of them are written.
    pub(super) wbuf: Vec<u8>,
    wpos: usize,
    preface_seen: bool,
    settings_seen: bool,
    pub(super) decoder: Decoder,
    pub(super) peer: PeerSettings,
    /// What the server may still send on the connection; what the client may.
    pub(super) send_window: i64,
    pub(super) recv_window: i64,
    /// Received data credited back (read, dropped, padding) and not yet told the client.
    pub(super) conn_credit: u32,
    pub(super) streams: HashMap<u32, Stream>,
    /// The highest stream the client opened.
    pub(super) last_stream: u32,
    /// Streams this server reset lately: frames the client sent before it knew are ignored.
    pub(super) reset_by_us: Vec<u32>,
    pub(super) block: Option<Block>,
    pub(super) answers: FuturesUnordered<Tagged>,
    /// The streams the connection's task was woken for.
    pub(super) wakes: Arc<Wakes>,
    /// Bodies were left marked because the write buffer was full: taken up in this poll once
    /// it has room (a body that woke itself waits for the task's next poll instead, so that a
    /// budget-exhausted body cannot spin the loop).
    pub(super) deferred: bool,
    /// GOAWAY sent: no new stream is taken, the connection ends when its streams have.
    going_away: bool,
    /// The connection failed: GOAWAY written, it ends once that is out.
    failed: bool,
    read_closed: bool,
    pub(super) calm: Calm,
}

impl<'a, I: AsyncRead + AsyncWrite + Unpin + Send> Conn<'a, I> {
    pub(super) fn new(io: I, given: Given<'a>, first: Vec<u8>) -> Self {
        let mut wbuf = Vec::new();
        let max_list = u32::try_from(given.http.max_header_bytes).unwrap_or(u32::MAX);
        frame::write_settings(
            &mut wbuf,
            false,
            &[
                (frame::setting::MAX_CONCURRENT_STREAMS, MAX_STREAMS),
                (frame::setting::MAX_HEADER_LIST_SIZE, max_list),
            ],
        );
        frame::write_window_update(&mut wbuf, 0, CONN_WINDOW - DEFAULT_WINDOW);
        Self {
            io,
            pipeline: given.pipeline,
            given_info: given.info,
            http: given.http,
            active: given.active,
            fields: given.fields,
            rbuf: first,
            wbuf,
            wpos: 0,
            preface_seen: false,
            settings_seen: false,
            decoder: Decoder::default(),
            peer: PeerSettings {
                initial_window: DEFAULT_WINDOW,
                max_frame: DEFAULT_MAX_FRAME,
            },
            send_window: i64::from(DEFAULT_WINDOW),
            recv_window: i64::from(CONN_WINDOW),
            conn_credit: 0,
            streams: HashMap::new(),
            last_stream: 0,
            reset_by_us: Vec::new(),
            block: None,
            answers: FuturesUnordered::new(),
            wakes: Arc::default(),
            deferred: false,
            going_away: false,
            failed: false,
            read_closed: false,
            calm: Calm::default(),
        }
    }

    pub(super) fn stopping(&self) -> bool {
        self.going_away
    }

    /// Sends GOAWAY (NO_ERROR): the streams it has are finished, no new one is taken.
    pub(super) fn stop(&mut self) {
        if !self.going_away {
            self.going_away = true;
            frame::write_go_away(&mut self.wbuf, self.last_stream, Reason::NO_ERROR);
        }
    }

    /// Ends the connection with `reason`: GOAWAY, then close once it is written.
    pub(super) fn fail(&mut self, reason: Reason) {
        if !self.failed {
            self.failed = true;
            self.going_away = true;
            frame::write_go_away(&mut self.wbuf, self.last_stream, reason);
            for (_, stream) in self.streams.drain() {
                if let Some(feed) = &stream.feed {
                    feed.fail("the connection failed");
                }
                if let Some(abort) = &stream.abort {
                    abort.abort();
                }
            }
        }
    }

    /// Drives the connection; ready when it has ended.
    pub(super) fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.wakes.register(cx.waker());
        loop {
            let mut progress = false;
            if !self.failed && !self.read_closed && self.pending_write() < WRITE_HIGH {
                match self.poll_read(cx) {
                    Poll::Ready(Ok(())) => progress = true,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            }
            if !self.failed {
                progress |= self.poll_answers(cx);
                progress |= self.poll_bodies();
                self.credit();
            }
            match self.poll_write(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => {}
            }
            if self.pending_write() == 0 && self.done() {
                return Poll::Ready(self.close(cx));
            }
            // Bodies left for later because the write buffer was full are taken up once
            // it has room again.
            let later = !self.failed && self.deferred && self.pending_write() < WRITE_HIGH;
            self.deferred = false;
            if !progress && !later {
                return Poll::Pending;
            }
        }
    }

    fn done(&self) -> bool {
        self.failed || ((self.going_away || self.read_closed) && self.streams.is_empty())
    }

    fn close(&mut self, cx: &mut Context<'_>) -> Result<(), BoxError> {
        // As hyper's connections end: the FIN (and TLS's close_notify) goes out if it can.
        let _ = Pin::new(&mut self.io).poll_shutdown(cx);
        Ok(())
    }

    pub(super) fn pending_write(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    /// Writes what is buffered; the buffer is freed once all of it is out.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.wpos < self.wbuf.len() {
            let n = match Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.wpos..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            self.wpos += n;
        }
        if !self.wbuf.is_empty() {
            // Kept for the next frames while streams are open; an idle connection keeps none.
            match self.streams.is_empty() {
                true => self.wbuf = Vec::new(),
                false => self.wbuf.clear(),
            }
            self.wpos = 0;
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Reads once (unless a whole frame is left from before: the sniff's bytes) and acts on
    /// every whole frame there is; ready when bytes came, or the end.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let mut room = [0u8; READ_CHUNK];
        let mut buf = ReadBuf::new(&mut room);
        if !self.rbuf_has_whole_frame() {
            ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf))?;
            if buf.filled().is_empty() {
                self.read_closed = true;
                self.end_streams("the client closed the connection");
                return Poll::Ready(Ok(()));
            }
        }
        if self.rbuf.is_empty() {
            // The usual case: frames acted on where they were read, a partial one kept.
            let read = buf.filled();
            let used = self.act(read);
            if used < read.len() {
                self.rbuf = read[used..].to_vec();
            }
            return Poll::Ready(Ok(()));
        }
        let mut bytes = std::mem::take(&mut self.rbuf);
        bytes.extend_from_slice(buf.filled());
        let used = self.act(&bytes);
        if used < bytes.len() {
            bytes.drain(..used);
            self.rbuf = bytes;
        }
        Poll::Ready(Ok(()))
    }

    /// Acts on what `bytes` holds whole; how much of it was used (all of it, once failed).
    fn act(&mut self, bytes: &[u8]) -> usize {
        match self.frames(bytes) {
            Ok(used) => used,
            Err(reason) => {
                self.fail(reason);
                bytes.len()
            }
        }
    }

    fn rbuf_has_whole_frame(&self) -> bool {
        if !self.preface_seen {
            return self.rbuf.len() >= PREFACE.len();
        }
        Head::parse(&self.rbuf).is_some_and(|h| self.rbuf.len() >= HEAD_LEN + h.len as usize)
    }

    /// Acts on the preface and every whole frame in `bytes`; how many bytes were used.
    fn frames(&mut self, bytes: &[u8]) -> Result<usize, Reason> {
        let mut at = 0;
        if !self.preface_seen {
            let Some(preface) = bytes.get(..PREFACE.len()) else {
                return match PREFACE.starts_with(bytes) {
                    true => Ok(0),
                    false => Err(Reason::PROTOCOL_ERROR),
                };
            };
            if preface != PREFACE {
                return Err(Reason::PROTOCOL_ERROR);
            }
            self.preface_seen = true;
            at = PREFACE.len();
        }
        while let Some(head) = Head::parse(&bytes[at..]) {
            if head.len > DEFAULT_MAX_FRAME {
                return Err(Reason::FRAME_SIZE_ERROR);
            }
            let end = at + HEAD_LEN + head.len as usize;
            let Some(payload) = bytes.get(at + HEAD_LEN..end) else {
                break;
            };
            at = end;
            if !self.settings_seen {
                // The client's preface ends with its SETTINGS (RFC 9113 §3.4).
                if head.kind != frame::kind::SETTINGS || head.has(frame::flag::ACK) {
                    return Err(Reason::PROTOCOL_ERROR);
                }
                self.settings_seen = true;
            }
            let outcome = frame::parse(head, payload).and_then(|f| self.on_frame(f));
            match outcome {
                Ok(()) => {}
                Err(Error::Connection(reason)) => return Err(reason),
                Err(Error::Stream(id, reason)) => self.reset(id, reason)?,
            }
            if self.failed {
                break;
            }
        }
        Ok(at)
    }

    /// Resets stream `id` with `reason` (a stream error of the client's making): counted
    /// against the client's calm (MadeYouReset makes the server reset streams for it).
    pub(super) fn reset(&mut self, id: u32, reason: Reason) -> Result<(), Reason> {
        frame::write_reset(&mut self.wbuf, id, reason);
        self.forget(id, "the stream was reset");
        self.remember_reset(id);
        self.calm.spend(1)
    }

    /// Notes that stream `id` was reset by this server (the last few are kept).
    pub(super) fn remember_reset(&mut self, id: u32) {
        if self.reset_by_us.len() >= 32 {
            self.reset_by_us.remove(0);
        }
        self.reset_by_us.push(id);
    }

    /// Drops stream `id`: its body fails, its answer is dropped (the upstream request with it).
    pub(super) fn forget(&mut self, id: u32, why: &'static str) {
        if let Some(stream) = self.streams.remove(&id) {
            if let Some(feed) = &stream.feed {
                feed.fail(why);
                self.conn_credit = self.conn_credit.saturating_add(feed.take_read(1));
            }
            if let Some(abort) = &stream.abort {
                abort.abort();
            }
        }
    }

    fn end_streams(&mut self, why: &'static str) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.forget(id, why);
        }
    }

    /// Collects the answers that are ready and writes their heads.
    fn poll_answers(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while self.pending_write() < WRITE_HIGH {
            match self.answers.poll_next_unpin(cx) {
                Poll::Ready(Some((id, Ok(res)))) => {
                    self.answer(id, res);
                    progress = true;
                }
                // Aborted: its stream is gone already.
                Poll::Ready(Some((_, Err(_)))) => progress = true,
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        progress
    }

    /// Sends the client the window the proxy's reads (and dropped bodies) gave back, in steps
    /// of half a stream's window (a client blocked on a window has sent at least that much),
    /// for the streams whose bodies said a credit is due.
    fn credit(&mut self) {
        for id in self.wakes.take_credits() {
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            let Some(feed) = &stream.feed else { continue };
            let step = if stream.recv_closed { 1 } else { CREDIT_STEP };
            let read = feed.take_read(step);
            self.conn_credit = self.conn_credit.saturating_add(read);
            if read > 0 && !stream.recv_closed {
                stream.recv_window += i64::from(read);
                frame::write_window_update(&mut self.wbuf, id, read);
            }
        }
        if self.conn_credit >= CREDIT_STEP {
            let total = std::mem::take(&mut self.conn_credit);
            self.recv_window += i64::from(total);
            frame::write_window_update(&mut self.wbuf, 0, total);
        }
    }
}
