//! HTTP/2 frames (RFC 9113 §4, §6): a frame's head, each type's payload checked as the RFC
//! says, and the frames a server writes.

use crate::error::{Error, Reason};

/// What a client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The length of a frame's head.
pub const HEAD_LEN: usize = 9;

/// The largest frame payload a peer may send before it is told otherwise, and the one this
/// server keeps (it never asks for larger).
pub const DEFAULT_MAX_FRAME: u32 = 16_384;

/// The largest flow-control window (RFC 9113 §6.9.1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// The window every stream and the connection begin with (RFC 9113 §6.9.2).
pub const DEFAULT_WINDOW: u32 = 65_535;

/// Frame types (RFC 9113 §6).
pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS parameters (RFC 9113 §6.5.2).
pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// A frame's head: its payload's length, type, flags and stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The payload's length.
    pub len: u32,
    /// The frame's type ([`kind`]).
    pub kind: u8,
    /// Its flags ([`flag`]).
    pub flags: u8,
    /// Its stream (0: the connection).
    pub stream: u32,
}

impl Head {
    /// The head at the start of `bytes`, if it holds one.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let b: &[u8; HEAD_LEN] = bytes.get(..HEAD_LEN)?.try_into().ok()?;
        Some(Self {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & MAX_WINDOW,
        })
    }

    /// Whether it has `flag`.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// A stream's dependency (RFC 9113 §5.3.2, deprecated, still parsed: its only rule left is
/// that a stream does not depend on itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priority {
    /// The stream depended on.
    pub dependency: u32,
}

/// A frame a client sent, its payload checked: what borrows from the payload is the frame's
/// bytes without padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// DATA: `flow` counts toward flow control (the whole payload, padding too).
    Data {
        stream: u32,
        end: bool,
        data: &'a [u8],
        flow: u32,
    },
    /// HEADERS: the first fragment of a header block.
    Headers {
        stream: u32,
        end_stream: bool,
        end_headers: bool,
        priority: Option<Priority>,
        fragment: &'a [u8],
    },
    /// PRIORITY.
    Priority { stream: u32, priority: Priority },
    /// RST_STREAM.
    Reset { stream: u32, reason: Reason },
    /// SETTINGS: each parameter as it came (checked).
    Settings { ack: bool, params: Vec<(u16, u32)> },
    /// PING.
    Ping { ack: bool, data: [u8; 8] },
    /// GOAWAY.
    GoAway { last: u32, reason: Reason },
    /// WINDOW_UPDATE (the increment is never 0: that is an error).
    WindowUpdate { stream: u32, increment: u32 },
    /// CONTINUATION: a further fragment of a header block.
    Continuation {
        stream: u32,
        end_headers: bool,
        fragment: &'a [u8],
    },
    /// A type this server does not know (ignored, RFC 9113 §5.5).
    Unknown { stream: u32 },
}

fn protocol() -> Error {
    Error::Connection(Reason::PROTOCOL_ERROR)
}

fn frame_size() -> Error {
    Error::Connection(Reason::FRAME_SIZE_ERROR)
}

/// The frame `head` heads, from its whole `payload`. A client's PUSH_PROMISE is an error (a
/// server never enables push).
pub fn parse(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let stream = head.stream;
    match head.kind {
        kind::DATA => data(head, payload),
        kind::HEADERS => headers(head, payload),
        kind::PRIORITY => {
            if stream == 0 {
                return Err(protocol());
            }
            if payload.len() != 5 {
                return Err(Error::Stream(stream, Reason::FRAME_SIZE_ERROR));
            }
            let priority = dependency(stream, payload)?;
            Ok(Frame::Priority { stream, priority })
        }
        kind::RST_STREAM => {
            if stream == 0 {
                return Err(protocol());
            }
            let code: [u8; 4] = payload.try_into().map_err(|_| frame_size())?;
            let reason = Reason(u32::from_be_bytes(code));
            Ok(Frame::Reset { stream, reason })
        }
        kind::SETTINGS => settings(head, payload),
        kind::PUSH_PROMISE => Err(protocol()),
        kind::PING => {
            if stream != 0 {
                return Err(protocol());
            }
            let data: [u8; 8] = payload.try_into().map_err(|_| frame_size())?;
            Ok(Frame::Ping {
                ack: head.has(flag::ACK),
                data,
            })
        }
        kind::GOAWAY => go_away(stream, payload),
        kind::WINDOW_UPDATE => window_update(stream, payload),
        kind::CONTINUATION => {
            if stream == 0 {
                return Err(protocol());
            }
            let end_headers = head.has(flag::END_HEADERS);
            Ok(Frame::Continuation {
                stream,
                end_headers,
                fragment: payload,
            })
        }
        _ => Ok(Frame::Unknown { stream }),
    }
}

/// The payload without its padding, when the frame is PADDED (RFC 9113 §6.1): a padding as long
/// as the payload or longer is a connection error.
fn unpadded(head: Head, payload: &[u8]) -> Result<&[u8], Error> {
    if !head.has(flag::PADDED) {
        return Ok(payload);
    }
    let (&pad, rest) = payload.split_first().ok_or_else(protocol)?;
    let keep = rest
        .len()
        .checked_sub(usize::from(pad))
        .ok_or_else(protocol)?;
    Ok(&rest[..keep])
}

fn data(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    if head.stream == 0 {
        return Err(protocol());
    }
    Ok(Frame::Data {
        stream: head.stream,
        end: head.has(flag::END_STREAM),
        data: unpadded(head, payload)?,
        flow: head.len,
    })
}

fn headers(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let stream = head.stream;
    if stream == 0 {
        return Err(protocol());
    }
    let mut fragment = unpadded(head, payload)?;
    let mut priority = None;
    if head.has(flag::PRIORITY) {
        let (dep, rest) = fragment.split_at_checked(5).ok_or_else(protocol)?;
        priority = Some(dependency(stream, dep)?);
        fragment = rest;
    }
    Ok(Frame::Headers {
        stream,
        end_stream: head.has(flag::END_STREAM),
        end_headers: head.has(flag::END_HEADERS),
        priority,
        fragment,
    })
}

/// A priority's dependency (5 bytes): a stream that depends on itself is a stream error.
fn dependency(stream: u32, bytes: &[u8]) -> Result<Priority, Error> {
    let dep: [u8; 4] = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(protocol)?;
    let dependency = u32::from_be_bytes(dep) & MAX_WINDOW;
    if dependency == stream {
        return Err(Error::Stream(stream, Reason::PROTOCOL_ERROR));
    }
    Ok(Priority { dependency })
}

fn settings(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    if head.stream != 0 {
        return Err(protocol());
    }
    let ack = head.has(flag::ACK);
    if (ack && !payload.is_empty()) || !payload.len().is_multiple_of(6) {
        return Err(frame_size());
    }
    let mut params = Vec::with_capacity(payload.len() / 6);
    for p in payload.chunks_exact(6) {
        let id = u16::from_be_bytes([p[0], p[1]]);
        let value = u32::from_be_bytes([p[2], p[3], p[4], p[5]]);
        match id {
            setting::ENABLE_PUSH if value > 1 => return Err(protocol()),
            setting::INITIAL_WINDOW_SIZE if value > MAX_WINDOW => {
                return Err(Error::Connection(Reason::FLOW_CONTROL_ERROR))
            }
            setting::MAX_FRAME_SIZE if !(DEFAULT_MAX_FRAME..=0xff_ffff).contains(&value) => {
                return Err(protocol())
            }
            _ => params.push((id, value)),
        }
    }
    Ok(Frame::Settings { ack, params })
}

fn go_away(stream: u32, payload: &[u8]) -> Result<Frame<'_>, Error> {
    if stream != 0 {
        return Err(protocol());
    }
    let fixed: [u8; 8] = payload
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(frame_size)?;
    Ok(Frame::GoAway {
        last: u32::from_be_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]) & MAX_WINDOW,
        reason: Reason(u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]])),
    })
}

fn window_update(stream: u32, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let inc: [u8; 4] = payload.try_into().map_err(|_| frame_size())?;
    let increment = u32::from_be_bytes(inc) & MAX_WINDOW;
    if increment == 0 {
        return Err(match stream {
            0 => protocol(),
            s => Error::Stream(s, Reason::PROTOCOL_ERROR),
        });
    }
    Ok(Frame::WindowUpdate { stream, increment })
}

/// Writes a frame's head to `out`.
pub fn write_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & MAX_WINDOW).to_be_bytes());
}

/// Writes a SETTINGS frame with `params` (an empty one with `ack`).
pub fn write_settings(out: &mut Vec<u8>, ack: bool, params: &[(u16, u32)]) {
    let flags = if ack { flag::ACK } else { 0 };
    write_head(out, params.len() * 6, kind::SETTINGS, flags, 0);
    for (id, value) in params {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Writes a PING acknowledging `data`.
pub fn write_ping_ack(out: &mut Vec<u8>, data: [u8; 8]) {
    write_head(out, 8, kind::PING, flag::ACK, 0);
    out.extend_from_slice(&data);
}

/// Writes a WINDOW_UPDATE of `increment` (not 0) for `stream` (0: the connection).
pub fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    write_head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&(increment & MAX_WINDOW).to_be_bytes());
}

/// Writes an RST_STREAM.
pub fn write_reset(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    write_head(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&reason.0.to_be_bytes());
}

/// Writes a GOAWAY naming `last` as the last stream that may have been processed.
pub fn write_go_away(out: &mut Vec<u8>, last: u32, reason: Reason) {
    write_head(out, 8, kind::GOAWAY, 0, 0);
    out.extend_from_slice(&(last & MAX_WINDOW).to_be_bytes());
    out.extend_from_slice(&reason.0.to_be_bytes());
}

/// Writes a DATA frame (no padding).
pub fn write_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end: bool) {
    let flags = if end { flag::END_STREAM } else { 0 };
    write_head(out, data.len(), kind::DATA, flags, stream);
    out.extend_from_slice(data);
}

/// Writes a header block as a HEADERS frame and as many CONTINUATION frames as `max_frame`
/// needs.
pub fn write_headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end: bool, max_frame: u32) {
    let max = usize::try_from(max_frame.max(DEFAULT_MAX_FRAME)).unwrap_or(usize::MAX);
    let mut chunks = block.chunks(max).peekable();
    let first = chunks.next().unwrap_or(&[]);
    let mut flags = if end { flag::END_STREAM } else { 0 };
    if chunks.peek().is_none() {
        flags |= flag::END_HEADERS;
    }
    write_head(out, first.len(), kind::HEADERS, flags, stream);
    out.extend_from_slice(first);
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            flag::END_HEADERS
        } else {
            0
        };
        write_head(out, chunk.len(), kind::CONTINUATION, flags, stream);
        out.extend_from_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn one(bytes: &[u8]) -> Result<Frame<'_>, Error> {
        let head = Head::parse(bytes).unwrap();
        parse(head, &bytes[HEAD_LEN..])
    }

    #[test]
    fn what_a_server_writes_parses_back() {
        let mut out = Vec::new();
        write_settings(&mut out, false, &[(setting::INITIAL_WINDOW_SIZE, 1)]);
        assert_eq!(
            one(&out).unwrap(),
            Frame::Settings {
                ack: false,
                params: vec![(setting::INITIAL_WINDOW_SIZE, 1)]
            }
        );
        let mut out = Vec::new();
        write_data(&mut out, 3, b"abc", true);
        assert_eq!(
            one(&out).unwrap(),
            Frame::Data {
                stream: 3,
                end: true,
                data: b"abc",
                flow: 3
            }
        );
        let mut out = Vec::new();
        write_headers(&mut out, 5, &[1u8; 40_000], false, DEFAULT_MAX_FRAME);
        let head = Head::parse(&out).unwrap();
        assert_eq!((head.kind, head.len), (kind::HEADERS, DEFAULT_MAX_FRAME));
        assert!(!head.has(flag::END_HEADERS), "continued");
    }

    #[test]
    fn frames_that_break_section_6_are_errors_of_the_right_kind() {
        let mut out = Vec::new();
        write_head(&mut out, 0, kind::DATA, 0, 0);
        assert_eq!(
            one(&out),
            Err(Error::Connection(Reason::PROTOCOL_ERROR)),
            "DATA on 0"
        );
        let mut out = Vec::new();
        write_head(&mut out, 3, kind::DATA, flag::PADDED, 1);
        out.extend_from_slice(&[3, 0, 0]);
        assert_eq!(
            one(&out),
            Err(Error::Connection(Reason::PROTOCOL_ERROR)),
            "padding"
        );
        let mut out = Vec::new();
        write_head(&mut out, 4, kind::PRIORITY, 0, 1);
        out.extend_from_slice(&[0; 4]);
        assert_eq!(
            one(&out),
            Err(Error::Stream(1, Reason::FRAME_SIZE_ERROR)),
            "PRIORITY 4"
        );
        let mut out = Vec::new();
        write_head(&mut out, 5, kind::PRIORITY, 0, 1);
        out.extend_from_slice(&[0, 0, 0, 1, 0]);
        assert_eq!(
            one(&out),
            Err(Error::Stream(1, Reason::PROTOCOL_ERROR)),
            "on itself"
        );
        let mut out = Vec::new();
        write_head(&mut out, 6, kind::SETTINGS, flag::ACK, 0);
        out.extend_from_slice(&[0; 6]);
        assert_eq!(
            one(&out),
            Err(Error::Connection(Reason::FRAME_SIZE_ERROR)),
            "ACK payload"
        );
        let mut out = Vec::new();
        write_settings(
            &mut out,
            false,
            &[(setting::INITIAL_WINDOW_SIZE, MAX_WINDOW + 1)],
        );
        assert_eq!(
            one(&out),
            Err(Error::Connection(Reason::FLOW_CONTROL_ERROR)),
            "window"
        );
        let mut out = Vec::new();
        write_window_update(&mut out, 7, 0);
        assert_eq!(
            one(&out),
            Err(Error::Stream(7, Reason::PROTOCOL_ERROR)),
            "increment 0"
        );
        let mut out = Vec::new();
        write_head(&mut out, 0, kind::PUSH_PROMISE, 0, 1);
        assert_eq!(
            one(&out),
            Err(Error::Connection(Reason::PROTOCOL_ERROR)),
            "push"
        );
    }
}
