//! Reading a body ahead of its reader, so that a slow client never holds a session while it
//! trickles: the rules of both data paths (the hyper path's `upstream::reverse::buffer`, the
//! fast path's `proxy::fast::body::Sink`), without I/O.
//!
//! A request body is read ahead into the cluster's `request_buffer` before a session is
//! leased; a response body is read off its session at the service's speed into
//! `response_buffer`. A body that ends within its buffer goes out from memory (with its length
//! unless it had trailers) and the session goes back before the client has read a byte of it.
//! A body that outgrows its buffer goes out as what was read followed by the rest, which is
//! read within what is left of the buffer; its session goes back when the rest has been read.
//!
//! A response is read ahead in time as well as in size: once some of its body has come, a gap
//! of [`STREAM_GAP`] without more sends what was read, so a stream (chunked JSON lines, a
//! generator, a long poll's late answer) reaches the client as the service sends it instead of
//! in one burst at its end. Events (`text/event-stream`) are never read ahead. A gRPC call's
//! request is a stream too, whose messages may wait for the answer's (a bidirectional call,
//! one whose server speaks first): a gap of [`STREAM_GAP`] sends it on, also before its first
//! message.
//!
//! An answer whose client left is read off, discarded, up to [`read_off_limit`], so that its
//! connection or session goes back (HTTP/1.1 cannot cancel a request); past it, or for an
//! event stream, the connection or session closes.

use std::time::Duration;

/// How much body data hyper may hold per connection and direction: the read buffer of an
/// upstream connection or session, and the write queue towards a client.
///
/// hyper's default (about 400 KiB each, which also pins the read buffers its chunks were cut
/// from) let 500 slow readers of large responses grow the proxy to 700 MB and spend seconds
/// copying. At 64 KiB a stream that cannot move on waits in the kernel's socket buffers
/// instead, as it does behind HAProxy (16 KiB) and NGINX (`proxy_buffers`, 32-64 KiB).
pub const IO_BUFFER_BYTES: usize = 64 * 1024;

/// How long the read-ahead of a response waits for more of its body before it forwards what it
/// has: shorter than any pause a client would notice, longer than the gaps between the
/// segments of a body a service writes at once.
pub const STREAM_GAP: Duration = Duration::from_millis(10);

/// The read-ahead of one body into a buffer of `limit` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAhead {
    limit: usize,
    pauses: Pauses,
}

/// When a pause in a body ends its read-ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pauses {
    /// Never: it waits as long as the body takes to come (a request's, bounded by the
    /// client's body timeout).
    Never,
    /// Once some of it has come (a response's).
    AfterSome,
    /// From its start (a gRPC call's request).
    Always,
}

impl ReadAhead {
    /// A request body's read-ahead into `limit` bytes.
    pub fn request(limit: usize) -> Self {
        Self {
            limit,
            pauses: Pauses::Never,
        }
    }

    /// A gRPC call's request body's read-ahead into `limit` bytes.
    pub fn call(limit: usize) -> Self {
        Self {
            limit,
            pauses: Pauses::Always,
        }
    }

    /// A response body's read-ahead into `limit` bytes.
    pub fn response(limit: usize) -> Self {
        Self {
            limit,
            pauses: Pauses::AfterSome,
        }
    }

    /// The buffer's size.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether `len` bytes in hand have outgrown the buffer. A body of exactly `limit` bytes is
    /// read whole: only its end says that it fits.
    pub fn outgrown(&self, len: usize) -> bool {
        len > self.limit
    }

    /// How many more bytes the next read may bring with `len` in hand: up to one past the
    /// limit, which tells a body that outgrows it.
    pub fn room(&self, len: usize) -> usize {
        self.limit.saturating_add(1).saturating_sub(len)
    }

    /// How long to wait for more with `len` in hand before what was read goes out: a
    /// response's [`STREAM_GAP`] once some of it has come, a call's always; otherwise (`None`)
    /// until it comes.
    pub fn wait(&self, len: usize) -> Option<Duration> {
        let pauses = match self.pauses {
            Pauses::Never => false,
            Pauses::AfterSome => len > 0,
            Pauses::Always => true,
        };
        pauses.then_some(STREAM_GAP)
    }

    /// What the rest of a body may hold in memory once the read-ahead stopped at a pause with
    /// `len` read: the buffer, less what was read.
    pub fn rest(&self, len: usize) -> usize {
        self.limit.saturating_sub(len)
    }

    /// Whether a body that ended within the read-ahead goes out with its length: unless it had
    /// trailers, which keep it chunked.
    pub fn ends_with_length(trailers: bool) -> bool {
        !trailers
    }
}

/// The least of an answer nobody will read (its client left) that is read off, discarded, so
/// that its connection or session can carry another request.
const READ_OFF_MIN: usize = 1 << 20;

/// How many bytes of an abandoned answer are read off before its connection or session is
/// closed instead: the read-ahead's buffer (`read_ahead`), or 1 MiB if that is more. Reading
/// more would cost more than a new connection, or a service's re-dial; an event stream, which
/// may never end, is not read off at all.
pub fn read_off_limit(read_ahead: Option<usize>) -> usize {
    read_ahead.map_or(READ_OFF_MIN, |limit| limit.max(READ_OFF_MIN))
}

/// Whether a response with this `Content-Type` is an event stream, whose events must reach the
/// client as the service sends them: never read ahead.
pub fn is_event_stream(content_type: &[u8]) -> bool {
    let media = content_type
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default();
    media
        .trim_ascii()
        .eq_ignore_ascii_case(b"text/event-stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_of_exactly_the_limit_is_read_whole() {
        let ahead = ReadAhead::response(4);
        assert!(!ahead.outgrown(4));
        assert!(ahead.outgrown(5));
        // The read that would fill it may bring the one byte more that tells.
        assert_eq!(ahead.room(0), 5);
        assert_eq!(ahead.room(4), 1);
        assert_eq!(ahead.room(5), 0);
    }

    #[test]
    fn a_response_pauses_only_once_some_of_it_has_come() {
        let ahead = ReadAhead::response(64);
        assert_eq!(ahead.wait(0), None);
        assert_eq!(ahead.wait(1), Some(STREAM_GAP));
    }

    #[test]
    fn a_request_body_waits_for_the_client() {
        assert_eq!(ReadAhead::request(64).wait(10), None);
    }

    #[test]
    fn a_calls_request_pauses_before_its_first_message_too() {
        assert_eq!(ReadAhead::call(64).wait(0), Some(STREAM_GAP));
        assert_eq!(ReadAhead::call(64).wait(10), Some(STREAM_GAP));
    }

    #[test]
    fn the_rest_after_a_pause_gets_what_is_left_of_the_buffer() {
        let ahead = ReadAhead::response(64);
        assert_eq!(ahead.rest(24), 40);
        assert_eq!(ahead.rest(64), 0);
    }

    #[test]
    fn only_a_body_without_trailers_goes_out_with_its_length() {
        assert!(ReadAhead::ends_with_length(false));
        assert!(!ReadAhead::ends_with_length(true));
    }

    #[test]
    fn an_abandoned_answer_is_read_off_up_to_a_mebibyte_or_the_read_ahead() {
        assert_eq!(read_off_limit(None), 1 << 20);
        assert_eq!(read_off_limit(Some(64 << 10)), 1 << 20);
        assert_eq!(read_off_limit(Some(4 << 20)), 4 << 20);
    }

    #[test]
    fn event_streams_are_known_by_their_media_type() {
        assert!(is_event_stream(b"text/event-stream"));
        assert!(is_event_stream(b" Text/Event-Stream ; charset=utf-8"));
        assert!(!is_event_stream(b"text/event-streams"));
        assert!(!is_event_stream(b"application/json"));
        assert!(!is_event_stream(b""));
    }
}
