//! [`Scanner`]: follows HTTP/1 request heads and bodies in the bytes a client sends, to find
//! the request that carried both `Content-Length` and `Transfer-Encoding`.
//!
//! hyper takes RFC 9112 §6.3's lenient option for such a request: it drops Content-Length,
//! decodes the chunked body and closes the connection after the response, leaving no trace a
//! proxy could see; yet such a message is the classic request-smuggling vector and a proxy
//! should refuse it. Sluice's server runs the bytes hyper reads through this scanner and marks
//! the request it flags. The fuzz target `framing` checks it against hyper itself.

/// How much of a chunk-size, chunk-end or trailer line is kept: enough for any valid size.
const BODY_LINE_PREFIX: usize = 64;

/// Where the scanner is in the request stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a request line; empty lines are skipped, as httparse does.
    Idle,
    /// Inside a head, after the request line.
    Head,
    /// A Content-Length body: bytes left.
    Fixed(u64),
    /// A chunk-size line.
    ChunkSize,
    /// Chunk data: bytes left.
    ChunkData(u64),
    /// The line ending after chunk data.
    ChunkEnd,
    /// Trailer lines after the last chunk, up to an empty line.
    Trailers,
    /// Lost track (input hyper refuses): stop looking.
    Off,
}

/// Follows request heads and bodies line by line; only the current line is buffered.
///
/// The scan is lenient on purpose: it must find the same message boundaries as hyper only on
/// input hyper accepts. On anything it cannot follow (input hyper refuses and closes on, or an
/// oversize head) it stops looking ([`is_off`](Self::is_off)).
#[derive(Debug)]
pub struct Scanner {
    state: State,
    line: Vec<u8>,
    /// Whether the current line's last byte so far is CR (kept apart from `line`, which may
    /// hold only a prefix).
    ends_cr: bool,
    head_len: usize,
    max_head: usize,
    heads: u64,
    content_length: Option<u64>,
    transfer_encoding: bool,
    first_ambiguous: Option<u64>,
}

impl Scanner {
    /// A scanner at the start of a connection; heads longer than `max_head` (which hyper
    /// refuses with 431) end the scan.
    pub fn new(max_head: usize) -> Self {
        Self {
            state: State::Idle,
            line: Vec::new(),
            ends_cr: false,
            head_len: 0,
            max_head,
            heads: 0,
            content_length: None,
            transfer_encoding: false,
            first_ambiguous: None,
        }
    }

    /// Request heads completed so far.
    pub fn heads(&self) -> u64 {
        self.heads
    }

    /// The position (0-based, in heads) of the first request that carried both
    /// `Content-Length` and `Transfer-Encoding`.
    pub fn first_ambiguous(&self) -> Option<u64> {
        self.first_ambiguous
    }

    /// Whether the scan lost track (input hyper refuses) and stopped looking.
    pub fn is_off(&self) -> bool {
        self.state == State::Off
    }

    /// Whether part of a request head has arrived (blank lines before one do not count).
    pub fn mid_head(&self) -> bool {
        match self.state {
            State::Head => true,
            State::Idle => self.line.iter().any(|b| !b.is_ascii_whitespace()),
            _ => false,
        }
    }

    /// Follows `bytes`, the next bytes the client sent, in any split.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match self.state {
                State::Off => return,
                State::Fixed(left) | State::ChunkData(left) => {
                    let n = left.min(bytes.len() as u64);
                    bytes = &bytes[usize::try_from(n).unwrap_or(bytes.len())..];
                    self.state = match (self.state, left - n) {
                        (State::Fixed(_), 0) => State::Idle,
                        (State::ChunkData(_), 0) => State::ChunkEnd,
                        (State::Fixed(_), rest) => State::Fixed(rest),
                        (_, rest) => State::ChunkData(rest),
                    };
                }
                _ => bytes = self.take_line(bytes),
            }
        }
    }

    /// Buffers bytes up to a line feed, handles a completed line, returns the rest.
    fn take_line<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        let (part, rest, complete) = match bytes.iter().position(|b| *b == b'\n') {
            Some(i) => (&bytes[..i], &bytes[i + 1..], true),
            None => (bytes, &bytes[bytes.len()..], false),
        };
        let room = if matches!(self.state, State::Idle | State::Head) {
            self.head_len += part.len() + usize::from(complete);
            if self.head_len > self.max_head {
                self.state = State::Off;
                return rest;
            }
            part.len()
        } else {
            // Body lines matter only for their first bytes (a chunk size) or for being empty.
            BODY_LINE_PREFIX.saturating_sub(self.line.len())
        };
        self.line.extend_from_slice(&part[..part.len().min(room)]);
        if let Some(&last) = part.last() {
            self.ends_cr = last == b'\r';
        }
        if complete {
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let crlf = std::mem::take(&mut self.ends_cr);
            // httparse takes a bare LF in a head; hyper's chunked decoder takes only CRLF.
            if !crlf && !matches!(self.state, State::Idle | State::Head) {
                self.state = State::Off;
                line.clear();
                self.line = line;
                return rest;
            }
            self.end_line(&line);
            line.clear();
            self.line = line;
        }
        rest
    }

    fn end_line(&mut self, line: &[u8]) {
        self.state = match self.state {
            State::Idle if line.is_empty() => {
                self.head_len = 0;
                State::Idle
            }
            State::Idle => State::Head,
            State::Head if line.is_empty() => self.end_head(),
            State::Head => self.header(line),
            State::ChunkSize => chunk_size(line),
            State::ChunkEnd if line.is_empty() => State::ChunkSize,
            // hyper wants CRLF right after the chunk's data.
            State::ChunkEnd => State::Off,
            State::Trailers if line.is_empty() => State::Idle,
            // hyper reads trailers as header lines and fails the body on anything else.
            State::Trailers if !is_header_line(line) => State::Off,
            other => other,
        };
    }

    /// Notes the framing headers; anything hyper refuses turns the scan off.
    fn header(&mut self, line: &[u8]) -> State {
        if !is_header_line(line) {
            return State::Off;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            return State::Off;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.transfer_encoding = true;
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let parsed = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok());
            match (parsed, self.content_length) {
                (Some(len), None) => self.content_length = Some(len),
                (Some(len), Some(prev)) if len == prev => {}
                _ => return State::Off,
            }
        }
        State::Head
    }

    /// Records an ambiguous head and picks the body framing hyper will use.
    fn end_head(&mut self) -> State {
        let index = self.heads;
        self.heads += 1;
        self.head_len = 0;
        let (length, chunked) = (self.content_length.take(), self.transfer_encoding);
        self.transfer_encoding = false;
        if chunked && length.is_some() && self.first_ambiguous.is_none() {
            self.first_ambiguous = Some(index);
        }
        match (chunked, length) {
            (true, _) => State::ChunkSize,
            (false, Some(n)) if n > 0 => State::Fixed(n),
            _ => State::Idle,
        }
    }
}

/// A `name: value` line as httparse reads one: a non-empty name before the colon, and no
/// obs-fold (a continuation line starting with whitespace, which httparse refuses).
fn is_header_line(line: &[u8]) -> bool {
    let starts_folded = line.starts_with(b" ") || line.starts_with(b"\t");
    !starts_folded
        && line
            .iter()
            .position(|b| *b == b':')
            .is_some_and(|colon| colon > 0)
}

/// A chunk-size line: hex digits, then optional whitespace and extensions.
fn chunk_size(line: &[u8]) -> State {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let size = std::str::from_utf8(&line[..digits])
        .ok()
        .and_then(|d| u64::from_str_radix(d, 16).ok());
    match size {
        None => State::Off,
        Some(0) => State::Trailers,
        Some(n) => State::ChunkData(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(input: &[u8], step: usize) -> Scanner {
        let mut s = Scanner::new(1024);
        for piece in input.chunks(step) {
            s.feed(piece);
        }
        s
    }

    #[test]
    fn finds_the_ambiguous_request_after_fixed_and_chunked_bodies() {
        let input: &[u8] = b"\r\nPOST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
            POST / HTTP/1.1\nTransfer-Encoding: chunked\n\n5;ext\r\nhello\r\n0\r\nX-T: 1\r\n\r\n\
            POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n";
        // Byte by byte and all at once must agree: reads split anywhere.
        for step in [1, 7, input.len()] {
            let s = scan(input, step);
            assert_eq!((s.heads, s.first_ambiguous), (3, Some(2)), "step {step}");
            assert_eq!(s.state, State::ChunkSize);
        }
    }

    #[test]
    fn long_chunked_bodies_and_extensions_do_not_count_as_head() {
        let mut input = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..200 {
            input.extend_from_slice(
                b"3;a-long-chunk-extension-that-is-longer-than-the-prefix-we-keep\r\nabc\r\n",
            );
        }
        input.extend_from_slice(
            b"0\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        let s = scan(&input, 11);
        assert_eq!((s.heads, s.first_ambiguous), (2, Some(1)));
    }

    #[test]
    fn body_bytes_that_look_like_headers_are_not_a_head() {
        let body = "GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let input = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}GET / HTTP/1.1\r\n\r\n",
            body.len()
        );
        let s = scan(input.as_bytes(), 3);
        assert_eq!((s.heads, s.first_ambiguous), (2, None));
    }

    /// Found by the `framing` fuzz target: hyper's chunked decoder ends trailers only at CRLF
    /// and fails the body on a trailer that is not a header line, so a bare LF there or a
    /// junk trailer must not let the scan count a request hyper never sees.
    #[test]
    fn chunked_bodies_take_only_crlf_and_header_trailers() {
        for input in [
            &b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext\r\nhello\r\n0\r\n\nXx\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0;ext\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX\r\n0\r\n\r\n",
        ] {
            let s = scan(input, 3);
            assert!(s.is_off(), "{:?}", String::from_utf8_lossy(input));
            assert_eq!(s.heads(), 1);
        }
    }

    #[test]
    fn stops_on_input_hyper_refuses() {
        for input in [
            &b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            &[b'a'; 2000],
        ] {
            assert_eq!(scan(input, 5).state, State::Off);
        }
    }
}
