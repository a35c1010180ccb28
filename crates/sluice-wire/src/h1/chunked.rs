//! [`Chunked`]: decodes a chunked body (RFC 9112 §7.1) as bytes arrive, accepting exactly
//! what hyper's decoder accepts, so that a body is cut at the same byte by either path: the
//! same size digits and linear white space after them, extensions ignored (up to 16 KiB per
//! body, none containing a bare LF), `CRLF` after sizes and data, trailer fields kept whole
//! (up to 100 lines and `max_trailer` bytes).

use std::ops::Range;

/// Extension bytes a body may carry in all, as hyper counts them.
const EXTENSIONS_LIMIT: u64 = 16 * 1024;

/// Trailer lines a body may carry, as hyper counts them.
const TRAILERS_LIMIT: usize = 100;

/// Why a chunked body is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// A byte that does not belong where it came (size, CRLF, white space).
    #[error("invalid chunked framing")]
    Invalid,
    /// A chunk size past `u64`.
    #[error("chunk size overflows")]
    Overflow,
    /// Extensions, trailer bytes or trailer lines over their limits.
    #[error("chunk extensions or trailers over their limit")]
    TooLarge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    Trailer,
    TrailerLf,
    EndCr,
    EndLf,
    End,
}

/// What one [`Chunked::feed`] found in its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the input used (framing and data).
    pub consumed: usize,
    /// Where in the input the body data found is (possibly empty).
    pub data: Range<usize>,
}

/// The state of one chunked body being decoded.
#[derive(Debug, Clone)]
pub struct Chunked {
    state: State,
    size: u64,
    extensions: u64,
    trailers: Vec<u8>,
    trailer_lines: usize,
    max_trailer: usize,
}

impl Chunked {
    /// A body about to start; trailers longer than `max_trailer` bytes are refused (hyper
    /// uses the listener's head limit).
    pub fn new(max_trailer: usize) -> Self {
        Self {
            state: State::Start,
            size: 0,
            extensions: 0,
            trailers: Vec::new(),
            trailer_lines: 0,
            max_trailer,
        }
    }

    /// Whether the last chunk and the trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::End
    }

    /// The trailer section read (fields with their CRLFs, then the final CRLF), empty when
    /// there was none.
    pub fn trailers(&self) -> &[u8] {
        &self.trailers
    }

    /// Reads framing from `input` until data, the end of the body or the end of the input;
    /// returns what it used and where the data it found is. Call again with the rest.
    pub fn feed(&mut self, input: &[u8]) -> Result<Progress, ChunkError> {
        let mut at = 0;
        while at < input.len() && self.state != State::End {
            if self.state == State::Data {
                let n = usize::try_from(self.size)
                    .map_or(input.len() - at, |s| s.min(input.len() - at));
                self.size -= n as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                return Ok(Progress {
                    consumed: at + n,
                    data: at..at + n,
                });
            }
            self.state = self.step(input[at])?;
            at += 1;
        }
        Ok(Progress {
            consumed: at,
            data: at..at,
        })
    }

    /// One framing byte.
    fn step(&mut self, b: u8) -> Result<State, ChunkError> {
        use State::*;
        Ok(match (self.state, b) {
            (Start | Size, _) if b.is_ascii_hexdigit() => {
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|s| s.checked_add(u64::from(hex(b))))
                    .ok_or(ChunkError::Overflow)?;
                Size
            }
            (Size | SizeLws, b'\t' | b' ') => SizeLws,
            (Size | SizeLws, b';') => Extension,
            (Size | SizeLws | Extension, b'\r') => SizeLf,
            (Extension, b'\n') => return Err(ChunkError::Invalid),
            (Extension, _) => {
                self.extensions += 1;
                if self.extensions >= EXTENSIONS_LIMIT {
                    return Err(ChunkError::TooLarge);
                }
                Extension
            }
            (SizeLf, b'\n') if self.size == 0 => EndCr,
            (SizeLf, b'\n') => Data,
            (DataCr, b'\r') => DataLf,
            (DataLf, b'\n') => Start,
            (EndCr, b'\r') => self.trailer(b, EndLf)?,
            (EndCr | Trailer, _) => {
                self.trailer(b, if b == b'\r' { TrailerLf } else { Trailer })?
            }
            (TrailerLf, b'\n') => {
                if self.trailer_lines >= TRAILERS_LIMIT {
                    return Err(ChunkError::TooLarge);
                }
                self.trailer_lines += 1;
                self.trailer(b, EndCr)?
            }
            (EndLf, b'\n') => {
                self.trailer(b, End)?;
                check_trailers(&self.trailers, self.trailer_lines)?;
                End
            }
            _ => return Err(ChunkError::Invalid),
        })
    }

    /// Keeps a trailer byte (the final CRLF only when there were trailer fields, as hyper
    /// keeps them) and moves to `next`.
    fn trailer(&mut self, b: u8, next: State) -> Result<State, ChunkError> {
        let fields = !self.trailers.is_empty();
        if fields
            || !matches!(
                (self.state, b),
                (State::EndCr, b'\r') | (State::EndLf, b'\n')
            )
        {
            self.trailers.push(b);
            if self.trailers.len() >= self.max_trailer {
                return Err(ChunkError::TooLarge);
            }
        }
        Ok(next)
    }
}

/// Trailer fields hyper would take: `httparse` reads them into as many fields as there were
/// CRLF-ended lines (so a bare LF inside a line, which `httparse` ends a field at, makes one
/// field too many), and each name and value is valid.
fn check_trailers(trailers: &[u8], lines: usize) -> Result<(), ChunkError> {
    if trailers.is_empty() {
        return Ok(());
    }
    let mut fields = vec![httparse::EMPTY_HEADER; lines];
    match httparse::parse_headers(trailers, &mut fields) {
        Ok(httparse::Status::Complete((_, fields))) => {
            let valid = fields.iter().all(|f| {
                http::HeaderName::from_bytes(f.name.as_bytes()).is_ok()
                    && http::HeaderValue::from_bytes(f.value).is_ok()
            });
            valid.then_some(()).ok_or(ChunkError::Invalid)
        }
        _ => Err(ChunkError::Invalid),
    }
}

fn hex(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Decodes `body` fed in pieces of `step` bytes: the data, and the trailers.
    fn decode(body: &[u8], step: usize) -> Result<(Vec<u8>, Vec<u8>), ChunkError> {
        let (mut chunked, mut data, mut at) = (Chunked::new(1024), Vec::new(), 0);
        while !chunked.is_done() && at < body.len() {
            let piece = &body[at..(at + step).min(body.len())];
            let progress = chunked.feed(piece)?;
            data.extend_from_slice(&piece[progress.data]);
            at += progress.consumed;
        }
        assert!(chunked.is_done(), "incomplete at {at}");
        Ok((data, chunked.trailers().to_vec()))
    }

    #[test]
    fn any_split_of_the_input_decodes_alike() {
        let body = b"5;ext=1\r\nhello\r\nA \r\n0123456789\r\n0\r\nX-Sum: 15\r\n\r\n";
        let whole = decode(body, body.len()).unwrap();
        assert_eq!(whole.0, b"hello0123456789");
        assert_eq!(whole.1, b"X-Sum: 15\r\n\r\n");
        for step in 1..body.len() {
            assert_eq!(decode(body, step).unwrap(), whole, "pieces of {step}");
        }
    }

    #[test]
    fn framing_hyper_refuses_is_refused() {
        let refused = |body: &[u8]| decode(body, body.len()).unwrap_err();
        assert_eq!(refused(b"5\nhello\r\n0\r\n\r\n"), ChunkError::Invalid);
        assert_eq!(
            refused(b"5;a\nb\r\nhello\r\n0\r\n\r\n"),
            ChunkError::Invalid
        );
        assert_eq!(refused(b"1 1\r\nx\r\n0\r\n\r\n"), ChunkError::Invalid);
        assert_eq!(refused(b"10000000000000000\r\n"), ChunkError::Overflow);
        assert_eq!(refused(b"0\r\nA: 1\nB: 2\r\n\r\n"), ChunkError::Invalid);
        let long_extension = [b"1;".as_slice(), &[b'x'; 16 * 1024], b"\r\n"].concat();
        assert_eq!(refused(&long_extension), ChunkError::TooLarge);
    }
}
