//! What each frame a client sends does to its connection (RFC 9113 §5.1's stream states, §6's
//! frames, §6.9's flow control).

use http_body_util::{BodyExt, Empty};
use sluice_core::body::RequestBody;
use sluice_h2::frame::{self, Frame, MAX_WINDOW};
use sluice_h2::head::{Fields, Refused};
use sluice_h2::{Error, Reason};
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::{Block, Conn, Stream, MAX_STREAMS};
use super::inbound::Feed;
use super::out::{Out, Tagged};

/// The most a header block may take in HEADERS and CONTINUATION frames: past it the client is
/// flooding (CONTINUATION flood), whatever its fields decode to.
fn block_limit(max_header_bytes: usize) -> usize {
    max_header_bytes.saturating_mul(2).saturating_add(16 * 1024)
}

fn protocol() -> Error {
    Error::Connection(Reason::PROTOCOL_ERROR)
}

impl<I: AsyncRead + AsyncWrite + Unpin + Send> Conn<'_, I> {
    /// Acts on one frame.
    pub(super) fn on_frame(&mut self, frame: Frame<'_>) -> Result<(), Error> {
        if self.block.is_some() && !matches!(frame, Frame::Continuation { .. }) {
            // A header block is not interleaved with anything (RFC 9113 §6.10).
            return Err(protocol());
        }
        match frame {
            Frame::Headers {
                stream,
                end_stream,
                end_headers,
                fragment,
                ..
            } => {
                let block = Block {
                    stream,
                    end_stream,
                    bytes: fragment.to_vec(),
                };
                self.block_part(block, end_headers)
            }
            Frame::Continuation {
                stream,
                end_headers,
                fragment,
            } => {
                let mut block = self.block.take().ok_or_else(protocol)?;
                if block.stream != stream {
                    return Err(protocol());
                }
                block.bytes.extend_from_slice(fragment);
                if block.bytes.len() > block_limit(self.http.max_header_bytes) {
                    return Err(Error::Connection(Reason::ENHANCE_YOUR_CALM));
                }
                self.block_part(block, end_headers)
            }
            Frame::Data {
                stream,
                end,
                data,
                flow,
            } => self.on_data(stream, end, data, flow),
            Frame::Reset { stream, .. } => self.on_reset(stream),
            Frame::Settings { ack, params } => self.on_settings(ack, &params),
            Frame::Ping { ack, data } => {
                if !ack {
                    self.calm.spend(1).map_err(Error::Connection)?;
                    frame::write_ping_ack(&mut self.wbuf, data);
                }
                Ok(())
            }
            Frame::GoAway { .. } => {
                // The client opens nothing more; what it has is finished.
                self.stop();
                Ok(())
            }
            Frame::WindowUpdate { stream, increment } => self.on_window_update(stream, increment),
            Frame::Priority { .. } | Frame::Unknown { .. } => {
                self.calm.spend(1).map_err(Error::Connection)
            }
        }
    }

    /// A header block's fragment came: kept until END_HEADERS, then decoded and acted on.
    fn block_part(&mut self, block: Block, end_headers: bool) -> Result<(), Error> {
        if !end_headers {
            self.block = Some(block);
            return Ok(());
        }
        let mut fields = Fields::new(self.http.max_header_bytes);
        self.decoder
            .decode(&block.bytes, |name, value| fields.field(name, value))?;
        self.on_headers(block.stream, block.end_stream, fields)
    }

    /// A whole header block: a new stream's request, or trailers of an open one.
    fn on_headers(&mut self, id: u32, end_stream: bool, fields: Fields) -> Result<(), Error> {
        if let Some(stream) = self.streams.get_mut(&id) {
            if stream.recv_closed {
                return Err(Error::Stream(id, Reason::STREAM_CLOSED));
            }
            if !end_stream {
                return Err(Error::Stream(id, Reason::PROTOCOL_ERROR));
            }
            let trailers = fields
                .trailers()
                .map_err(|_| Error::Stream(id, Reason::PROTOCOL_ERROR))?;
            if stream.declared.is_some_and(|n| n != stream.received) {
                return Err(Error::Stream(id, Reason::PROTOCOL_ERROR));
            }
            stream.recv_closed = true;
            if let Some(feed) = &stream.feed {
                self.conn_credit = self.conn_credit.saturating_add(feed.end(Some(trailers)));
            }
            self.settle(id);
            return Ok(());
        }
        if id.is_multiple_of(2) {
            return Err(protocol());
        }
        if id <= self.last_stream {
            if self.reset_by_us.contains(&id) {
                return Ok(());
            }
            return Err(Error::Connection(Reason::STREAM_CLOSED));
        }
        self.last_stream = id;
        if self.stopping() {
            // After GOAWAY: decoded (the table is shared), not served.
            return Ok(());
        }
        if self.streams.len() >= MAX_STREAMS as usize {
            return Err(Error::Stream(id, Reason::REFUSED_STREAM));
        }
        match fields.request() {
            Ok((req, length)) => self.open(id, req, length, end_stream),
            Err(Refused::Malformed(_)) => Err(Error::Stream(id, Reason::PROTOCOL_ERROR)),
            Err(Refused::TooLarge) => {
                self.refuse_too_large(id, end_stream);
                Ok(())
            }
        }
    }

    /// A request whose fields are over the limit: answered 431 at once, and the rest of it
    /// refused (RST_STREAM NO_ERROR) if the client had more to send.
    fn refuse_too_large(&mut self, id: u32, end_stream: bool) {
        super::answer::write_short(&mut self.wbuf, id, 431, self.peer.max_frame);
        if !end_stream {
            frame::write_reset(&mut self.wbuf, id, Reason::NO_ERROR);
            self.remember_reset(id);
        }
    }

    /// Opens stream `id` for `req` and hands it to the pipeline.
    fn open(
        &mut self,
        id: u32,
        req: http::Request<()>,
        length: Option<u64>,
        end_stream: bool,
    ) -> Result<(), Error> {
        if end_stream && length.is_some_and(|n| n != 0) {
            return Err(Error::Stream(id, Reason::PROTOCOL_ERROR));
        }
        let (feed, body) = match end_stream {
            true => (
                None,
                RequestBody::Boxed(Empty::new().map_err(|e| match e {}).boxed()),
            ),
            false => {
                let (feed, body) = Feed::new(length, id, &self.wakes);
                (Some(feed), RequestBody::Boxed(body.boxed()))
            }
        };
        let mut req = req.map(|()| body);
        req.extensions_mut().insert(self.given_info);
        let (answer, abort) = Tagged::new(id, self.pipeline.call(req));
        self.answers.push(answer);
        let stream = Stream {
            feed,
            recv_closed: end_stream,
            recv_window: i64::from(frame::DEFAULT_WINDOW),
            declared: length,
            received: 0,
            send_window: i64::from(self.peer.initial_window),
            out: Out::Waiting,
            abort: Some(abort),
            _active: self.active.begin(),
        };
        self.streams.insert(id, stream);
        Ok(())
    }

    fn on_data(&mut self, id: u32, end: bool, data: &[u8], flow: u32) -> Result<(), Error> {
        if i64::from(flow) > self.recv_window {
            return Err(Error::Connection(Reason::FLOW_CONTROL_ERROR));
        }
        self.recv_window -= i64::from(flow);
        // Padding never reaches a reader: credited at once.
        let padding = flow - u32::try_from(data.len()).unwrap_or(flow);
        self.conn_credit = self.conn_credit.saturating_add(padding);
        let Some(stream) = self.streams.get_mut(&id) else {
            self.conn_credit = self.conn_credit.saturating_add(flow - padding);
            if id > self.last_stream {
                return Err(protocol());
            }
            if self.reset_by_us.contains(&id) {
                return Ok(());
            }
            return Err(Error::Stream(id, Reason::STREAM_CLOSED));
        };
        if stream.recv_closed {
            self.conn_credit = self.conn_credit.saturating_add(flow - padding);
            return Err(Error::Stream(id, Reason::STREAM_CLOSED));
        }
        if i64::from(flow) > stream.recv_window {
            return Err(Error::Stream(id, Reason::FLOW_CONTROL_ERROR));
        }
        stream.recv_window -= i64::from(flow);
        stream.received += data.len() as u64;
        let over = stream.declared.is_some_and(|n| stream.received > n);
        let short = end && stream.declared.is_some_and(|n| stream.received != n);
        if over || short {
            return Err(Error::Stream(id, Reason::PROTOCOL_ERROR));
        }
        let taken = stream.feed.as_ref().is_some_and(|f| f.data(data));
        if !taken {
            self.conn_credit = self.conn_credit.saturating_add(flow - padding);
        }
        if end {
            // What is read after this is credited to the connection only.
            stream.recv_closed = true;
            if let Some(feed) = &stream.feed {
                self.conn_credit = self.conn_credit.saturating_add(feed.end(None));
            }
            self.settle(id);
        } else if data.is_empty() {
            // An empty DATA frame that does not end the stream brings nothing.
            self.calm.spend(1).map_err(Error::Connection)?;
        }
        Ok(())
    }

    fn on_reset(&mut self, id: u32) -> Result<(), Error> {
        if id > self.last_stream {
            return Err(protocol());
        }
        if let Some(stream) = self.streams.get(&id) {
            // A stream reset before its answer went out is work thrown away (rapid reset).
            if matches!(stream.out, Out::Waiting) {
                self.calm.spend(1).map_err(Error::Connection)?;
            }
            self.forget(id, "the client reset the stream");
        }
        Ok(())
    }

    fn on_settings(&mut self, ack: bool, params: &[(u16, u32)]) -> Result<(), Error> {
        if ack {
            return Ok(());
        }
        self.calm.spend(1).map_err(Error::Connection)?;
        for &(id, value) in params {
            match id {
                frame::setting::INITIAL_WINDOW_SIZE => {
                    let delta = i64::from(value) - i64::from(self.peer.initial_window);
                    self.peer.initial_window = value;
                    for stream in self.streams.values_mut() {
                        stream.send_window += delta;
                        if stream.send_window > i64::from(MAX_WINDOW) {
                            return Err(Error::Connection(Reason::FLOW_CONTROL_ERROR));
                        }
                    }
                    if delta > 0 {
                        self.mark_blocked();
                    }
                }
                frame::setting::MAX_FRAME_SIZE => self.peer.max_frame = value,
                _ => {}
            }
        }
        frame::write_settings(&mut self.wbuf, true, &[]);
        Ok(())
    }

    fn on_window_update(&mut self, id: u32, increment: u32) -> Result<(), Error> {
        if id == 0 {
            self.send_window += i64::from(increment);
            if self.send_window > i64::from(MAX_WINDOW) {
                return Err(Error::Connection(Reason::FLOW_CONTROL_ERROR));
            }
            self.mark_blocked();
            return Ok(());
        }
        if id > self.last_stream {
            return Err(protocol());
        }
        let Some(stream) = self.streams.get_mut(&id) else {
            // A closed stream's: allowed for a while after it closed.
            return self.calm.spend(1).map_err(Error::Connection);
        };
        stream.send_window += i64::from(increment);
        if stream.send_window > i64::from(MAX_WINDOW) {
            return Err(Error::Stream(id, Reason::FLOW_CONTROL_ERROR));
        }
        if matches!(stream.out, Out::Body { chunk: Some(_), .. }) {
            self.wakes.mark(id);
        }
        Ok(())
    }

    /// Marks the streams that hold a chunk a window kept back: a window opened.
    fn mark_blocked(&mut self) {
        for (&id, stream) in &self.streams {
            if matches!(stream.out, Out::Body { chunk: Some(_), .. }) {
                self.wakes.mark(id);
            }
        }
    }

    /// Removes stream `id` once both sides are done with it.
    pub(super) fn settle(&mut self, id: u32) {
        let done = self
            .streams
            .get(&id)
            .is_some_and(|s| s.recv_closed && matches!(s.out, Out::Done));
        if done {
            if let Some(feed) = self.streams.remove(&id).and_then(|s| s.feed) {
                // Whatever of the body is left unread is credited back with the stream.
                feed.fail("the stream is done");
                self.conn_credit = self.conn_credit.saturating_add(feed.take_read(1));
            }
            self.calm.answered();
        }
    }
}
