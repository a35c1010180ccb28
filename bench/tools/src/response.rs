//! [`ResponseParser`]: finds where one HTTP/1.1 response ends in a byte stream, discarding the
//! body, so the clients can reuse a connection without buffering what they read.

/// The most header bytes one response may have before it counts as a protocol error.
const MAX_HEAD: usize = 64 * 1024;

/// A response whose end was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// The final (non-1xx) status code.
    pub status: u16,
    /// The server will close the connection after this response (`Connection: close`, an
    /// HTTP/1.0 answer without keep-alive, or a body delimited by the end of the connection).
    pub close: bool,
}

/// Why a byte stream is not a valid HTTP/1.1 response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid HTTP response: {}", self.0)
    }
}

impl std::error::Error for ParseError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    /// Body bytes still to come, `Content-Length` framing.
    Length(u64),
    /// Reading a chunk-size line; the value so far.
    ChunkSize(u64),
    /// Skipping a chunk extension up to the end of the size line.
    ChunkExt(u64),
    /// Chunk data bytes still to come.
    ChunkData(u64),
    /// The CRLF after chunk data.
    ChunkEnd,
    /// Trailer lines after the last chunk; how many bytes the current line has.
    Trailer(usize),
    /// The body ends when the server closes the connection.
    UntilClose,
    Finished,
}

/// Incremental parser of one response: feed it what the socket returns until it reports
/// [`Done`]. Only the head is buffered; body bytes are counted and dropped.
#[derive(Debug)]
pub struct ResponseParser {
    state: State,
    head: Vec<u8>,
    status: u16,
    close: bool,
}

impl Default for ResponseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ResponseParser {
    /// A parser waiting for the status line of a response to a non-`HEAD` request.
    pub fn new() -> Self {
        Self {
            state: State::Head,
            head: Vec::new(),
            status: 0,
            close: false,
        }
    }

    /// Consumes bytes from the start of `buf`. Returns how many it used and, once the response
    /// is complete, its outcome; the bytes after that belong to whatever the server sends next.
    pub fn feed(&mut self, buf: &[u8]) -> Result<(usize, Option<Done>), ParseError> {
        let mut used = 0;
        while used < buf.len() && self.state != State::Finished {
            used += match self.state {
                State::Head => self.feed_head(&buf[used..])?,
                _ => self.feed_body(&buf[used..])?,
            };
        }
        Ok((used, self.done()))
    }

    /// The server closed the connection: completes a close-delimited body, else fails.
    pub fn eof(&mut self) -> Result<Done, ParseError> {
        match self.state {
            State::UntilClose | State::Finished => {
                self.state = State::Finished;
                Ok(Done {
                    status: self.status,
                    close: true,
                })
            }
            _ => Err(ParseError(
                "connection closed before the response ended".into(),
            )),
        }
    }

    fn done(&self) -> Option<Done> {
        (self.state == State::Finished).then_some(Done {
            status: self.status,
            close: self.close,
        })
    }

    fn feed_head(&mut self, buf: &[u8]) -> Result<usize, ParseError> {
        let before = self.head.len();
        self.head.extend_from_slice(buf);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut res = httparse::Response::new(&mut headers);
        let len = match res.parse(&self.head) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if self.head.len() > MAX_HEAD => {
                return Err(ParseError("response head too large".into()))
            }
            Ok(httparse::Status::Partial) => return Ok(buf.len()),
            Err(e) => return Err(ParseError(e.to_string())),
        };
        let status = res.code.unwrap_or(0);
        let (state, close) = framing(status, res.version == Some(0), res.headers)?;
        self.head.clear();
        // 1xx answers (100 Continue) precede the real response: wait for the next head.
        if !(100..200).contains(&status) || status == 101 {
            self.status = status;
            self.close = close;
            self.state = state;
        }
        Ok(len - before)
    }

    fn feed_body(&mut self, buf: &[u8]) -> Result<usize, ParseError> {
        let (used, next) = match self.state {
            State::Length(left) => {
                let n = left.min(buf.len() as u64);
                (n as usize, end_if_zero(left - n, State::Length))
            }
            State::UntilClose => (buf.len(), State::UntilClose),
            State::ChunkData(left) => {
                let n = left.min(buf.len() as u64);
                let next = if left == n {
                    State::ChunkEnd
                } else {
                    State::ChunkData(left - n)
                };
                (n as usize, next)
            }
            state => (1, chunk_byte(state, buf[0])?),
        };
        self.state = next;
        Ok(used)
    }
}

fn end_if_zero(left: u64, state: fn(u64) -> State) -> State {
    if left == 0 {
        State::Finished
    } else {
        state(left)
    }
}

/// Steps the chunked-encoding state machine over one byte outside chunk data.
fn chunk_byte(state: State, b: u8) -> Result<State, ParseError> {
    let bad = || ParseError(format!("bad chunked encoding at byte {b:#04x}"));
    Ok(match state {
        State::ChunkSize(size) => match b {
            b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                let digit = u64::from((b as char).to_digit(16).ok_or_else(bad)?);
                State::ChunkSize(size.checked_mul(16).ok_or_else(bad)? + digit)
            }
            b'\n' => after_size(size),
            b'\r' | b';' | b' ' | b'\t' => State::ChunkExt(size),
            _ => return Err(bad()),
        },
        State::ChunkExt(size) if b == b'\n' => after_size(size),
        State::ChunkExt(size) => State::ChunkExt(size),
        State::ChunkEnd if b == b'\n' => State::ChunkSize(0),
        State::ChunkEnd if b == b'\r' => State::ChunkEnd,
        State::Trailer(0) if b == b'\n' => State::Finished,
        State::Trailer(_) if b == b'\n' => State::Trailer(0),
        State::Trailer(len) if b == b'\r' => State::Trailer(len),
        State::Trailer(len) => State::Trailer(len + 1),
        _ => return Err(bad()),
    })
}

fn after_size(size: u64) -> State {
    if size == 0 {
        State::Trailer(0)
    } else {
        State::ChunkData(size)
    }
}

/// How the body of a response is delimited, and whether the connection closes after it.
fn framing(
    status: u16,
    http10: bool,
    headers: &[httparse::Header<'_>],
) -> Result<(State, bool), ParseError> {
    let mut close = http10;
    let mut length = None;
    let mut chunked = false;
    for h in headers {
        let value = String::from_utf8_lossy(h.value);
        if h.name.eq_ignore_ascii_case("connection") {
            let has = |token: &str| {
                value
                    .split(',')
                    .any(|v| v.trim().eq_ignore_ascii_case(token))
            };
            close = has("close") || (http10 && !has("keep-alive"));
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.trim().to_ascii_lowercase().ends_with("chunked");
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n = value.trim().parse::<u64>();
            length = Some(n.map_err(|_| ParseError(format!("bad content-length {value:?}")))?);
        }
    }
    let state = match (status, chunked, length) {
        (100..=199 | 204 | 304, _, _) => State::Finished,
        (_, true, _) => State::ChunkSize(0),
        (_, false, Some(0)) => State::Finished,
        (_, false, Some(n)) => State::Length(n),
        (_, false, None) => State::UntilClose,
    };
    let close = close || state == State::UntilClose;
    Ok((state, close))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `step` bytes; returns the outcome and the bytes left over.
    fn parse(input: &[u8], step: usize) -> (Option<Done>, usize) {
        let mut p = ResponseParser::new();
        let mut at = 0;
        while at < input.len() {
            let end = (at + step).min(input.len());
            let (used, done) = p.feed(&input[at..end]).expect("valid response");
            at += used;
            if done.is_some() {
                return (done, input.len() - at);
            }
        }
        (None, 0)
    }

    #[test]
    fn content_length_bodies_end_exactly_in_any_split() {
        let input = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1";
        for step in 1..input.len() {
            let done = Done {
                status: 200,
                close: false,
            };
            assert_eq!(parse(input, step), (Some(done), 8), "step {step}");
        }
    }

    #[test]
    fn chunked_bodies_with_extensions_and_trailers_end_exactly() {
        let input = b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
            5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nx-t: 1\r\n\r\nX";
        for step in 1..input.len() {
            let done = Done {
                status: 503,
                close: true,
            };
            assert_eq!(parse(input, step), (Some(done), 1), "step {step}");
        }
    }

    #[test]
    fn interim_responses_and_bodyless_statuses_are_skipped() {
        let input = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        let done = Done {
            status: 204,
            close: false,
        };
        assert_eq!(parse(input, 7), (Some(done), 0));
    }

    #[test]
    fn bodies_without_length_end_at_eof_and_close() {
        let mut p = ResponseParser::new();
        let (_, done) = p
            .feed(b"HTTP/1.0 200 OK\r\n\r\nabc")
            .expect("valid response");
        assert_eq!(done, None);
        assert_eq!(p.eof().map(|d| (d.status, d.close)), Ok((200, true)));
        let mut p = ResponseParser::new();
        let (_, done) = p
            .feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc")
            .expect("valid response");
        assert_eq!(done, None);
        assert!(p.eof().is_err(), "a truncated body is an error");
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(ResponseParser::new()
            .feed(b"SSH-2.0-OpenSSH\r\n\r\n")
            .is_err());
        let mut p = ResponseParser::new();
        let bad = p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        assert!(bad.is_err());
    }
}
