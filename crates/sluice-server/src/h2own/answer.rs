//! A response written as frames: its head encoded at once into the connection's buffer, its
//! body pulled a chunk at a time, only while the client's windows have room for it.

use std::task::{Context, Poll};

use bytes::Buf;
use http::{HeaderMap, Response};
use http_body::Body;
use sluice_core::body::ProxyBody;
use sluice_h2::frame;
use sluice_h2::head::CONNECTION_SPECIFIC;
use sluice_h2::hpack;
use sluice_h2::Reason;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::{Conn, WRITE_HIGH};
use super::out::Out;

/// Encodes a response head: `:status`, then the fields (the listener's `extra` over any of the
/// same name), connection-specific ones left out.
fn encode_head(
    status: u16,
    headers: &HeaderMap,
    extra: &[(http::HeaderName, http::HeaderValue)],
) -> Vec<u8> {
    let mut block = Vec::with_capacity(64 + headers.len() * 32);
    hpack::encode_status(&mut block, status);
    for (name, value) in headers {
        let name = name.as_str();
        if CONNECTION_SPECIFIC.contains(&name) || extra.iter().any(|(n, _)| n == name) {
            continue;
        }
        hpack::encode_field(&mut block, name, value.as_bytes(), value.is_sensitive());
    }
    for (name, value) in extra {
        hpack::encode_field(&mut block, name.as_str(), value.as_bytes(), false);
    }
    block
}

/// Writes a whole answer with no body but its status (a 431 to a head over the limit).
pub(super) fn write_short(wbuf: &mut Vec<u8>, id: u32, status: u16, max_frame: u32) {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from_static("0"),
    );
    let block = encode_head(status, &headers, &[]);
    frame::write_headers(wbuf, id, &block, true, max_frame);
}

impl<I: AsyncRead + AsyncWrite + Unpin + Send> Conn<'_, I> {
    /// The pipeline answered stream `id`: its head goes out, its body follows as the windows
    /// allow.
    pub(super) fn answer(&mut self, id: u32, res: Response<ProxyBody>) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.abort = None;
        let (parts, body) = res.into_parts();
        let block = encode_head(parts.status.as_u16(), &parts.headers, self.fields);
        let end = body.is_end_stream();
        frame::write_headers(&mut self.wbuf, id, &block, end, self.peer.max_frame);
        if end {
            stream.out = Out::Done;
            self.finish(id);
        } else {
            stream.out = Out::Body {
                body: Box::pin(body),
                chunk: None,
                waker: self.wakes.body_waker(id),
            };
            self.wakes.mark(id);
        }
    }

    /// The answer of stream `id` is out whole: the stream ends, or, if the client has more of
    /// its request to send, is reset with NO_ERROR (RFC 9113 §8.1) so it stops.
    fn finish(&mut self, id: u32) {
        let Some(stream) = self.streams.get(&id) else {
            return;
        };
        if !stream.recv_closed {
            frame::write_reset(&mut self.wbuf, id, Reason::NO_ERROR);
            self.remember_reset(id);
            self.forget(id, "the answer was complete");
            self.calm.answered();
            return;
        }
        self.settle(id);
    }

    /// Pulls the bodies whose streams were woken (a frame came, or a window opened); whether
    /// any frame was written. A stream left for later (the write buffer is full) stays marked.
    pub(super) fn poll_bodies(&mut self) -> bool {
        let ids = self.wakes.take_bodies();
        let mut progress = false;
        for (i, &id) in ids.iter().enumerate() {
            if self.pending_write() >= WRITE_HIGH {
                for &later in &ids[i..] {
                    self.wakes.mark(later);
                }
                self.deferred = true;
                break;
            }
            progress |= self.poll_body(id);
        }
        progress
    }

    /// Sends what stream `id`'s body has and its windows allow; whether a frame was written.
    fn poll_body(&mut self, id: u32) -> bool {
        let mut progress = false;
        loop {
            let max_frame = self.peer.max_frame;
            let conn_window = self.send_window;
            let Some(stream) = self.streams.get_mut(&id) else {
                return progress;
            };
            let Out::Body { body, chunk, waker } = &mut stream.out else {
                return progress;
            };
            if let Some(data) = chunk {
                let room = stream
                    .send_window
                    .min(conn_window)
                    .min(i64::from(max_frame));
                let n = usize::try_from(room.max(0)).unwrap_or(0).min(data.len());
                if n == 0 {
                    // Marked again when a window opens.
                    return progress;
                }
                let part = data.split_to(n);
                let last = data.is_empty() && body.is_end_stream();
                if data.is_empty() {
                    *chunk = None;
                }
                stream.send_window -= n as i64;
                self.send_window -= n as i64;
                frame::write_data(&mut self.wbuf, id, &part, last);
                progress = true;
                if last {
                    stream.out = Out::Done;
                    self.finish(id);
                    return progress;
                }
                if self.pending_write() >= WRITE_HIGH {
                    self.wakes.mark(id);
                    self.deferred = true;
                    return progress;
                }
                continue;
            }
            let mut cx = Context::from_waker(waker);
            match body.as_mut().poll_frame(&mut cx) {
                Poll::Pending => return progress,
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(mut data) if data.has_remaining() => {
                        *chunk = Some(data.copy_to_bytes(data.remaining()));
                    }
                    Ok(_) => {}
                    Err(f) => {
                        let trailers = f.into_trailers().unwrap_or_default();
                        let block = encode_head_trailers(&trailers);
                        stream.out = Out::Done;
                        frame::write_headers(&mut self.wbuf, id, &block, true, max_frame);
                        self.finish(id);
                        return true;
                    }
                },
                Poll::Ready(None) => {
                    stream.out = Out::Done;
                    frame::write_data(&mut self.wbuf, id, &[], true);
                    self.finish(id);
                    return true;
                }
                Poll::Ready(Some(Err(error))) => {
                    tracing::debug!(%error, stream = id, "HTTP/2 answer body failed");
                    stream.out = Out::Done;
                    frame::write_reset(&mut self.wbuf, id, Reason::INTERNAL_ERROR);
                    self.remember_reset(id);
                    self.forget(id, "the answer failed");
                    return true;
                }
            }
        }
    }
}

/// Encodes trailers: regular fields only.
fn encode_head_trailers(trailers: &HeaderMap) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in trailers {
        if !CONNECTION_SPECIFIC.contains(&name.as_str()) {
            hpack::encode_field(
                &mut block,
                name.as_str(),
                value.as_bytes(),
                value.is_sensitive(),
            );
        }
    }
    block
}
