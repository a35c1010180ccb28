//! The lines of a control link (many nodes, `protocol/README.md`): what a node reports of its
//! demand, and what a service asks of it. One line each, ASCII, `\n`-terminated, at most
//! [`MAX_LINE`] bytes; numbers are decimal without sign or leading zeros.

use std::fmt;

/// The longest line either side may send, without its `\n`.
pub const MAX_LINE: usize = 128;

/// How often a node reports while its demand changes.
pub const REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// A node reports at least this often (a heartbeat).
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// A link silent this long is lost (three missed heartbeats).
pub const SILENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// One slice's demand at one node, all instances together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// Requests in flight on sessions.
    pub in_flight: u64,
    /// Requests waiting in the admission queue.
    pub queued: u64,
    /// Requests refused for want of capacity since the previous report.
    pub refused: u64,
    /// Sessions registered in the slice.
    pub sessions: u64,
}

impl Demand {
    /// The sample a service smooths: in flight, queued and refused together.
    pub fn sample(&self) -> f64 {
        // Counts far below 2^53: exact in a double.
        (self.in_flight as f64) + (self.queued as f64) + (self.refused as f64)
    }
}

/// A line from a node to a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeLine {
    /// `DEMAND <in_flight> <queued> <refused> <sessions>`.
    Demand(Demand),
    /// `DRAINING`: the node takes no new sessions and ends those it has.
    Draining,
    /// `FLOOR <0|1>`: whether the node counts on this instance for its floor of one session
    /// (to links that said `Sluice-Split: service` only).
    Floor(bool),
}

/// A line from a service to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceLine {
    /// `RETIRE <n>` (n ≥ 1): close n of this instance's sessions as they become idle.
    Retire(u64),
    /// `CAPACITY <n>`: the instance's declared capacity now.
    Capacity(u64),
}

/// A line that is not one of the protocol's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid control line {0:?}")]
pub struct InvalidLine(pub String);

impl fmt::Display for NodeLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Demand(d) => write!(
                f,
                "DEMAND {} {} {} {}",
                d.in_flight, d.queued, d.refused, d.sessions
            ),
            Self::Draining => f.write_str("DRAINING"),
            Self::Floor(on) => write!(f, "FLOOR {}", u8::from(*on)),
        }
    }
}

impl fmt::Display for ServiceLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retire(n) => write!(f, "RETIRE {n}"),
            Self::Capacity(n) => write!(f, "CAPACITY {n}"),
        }
    }
}

impl NodeLine {
    /// The line with its `\n`, ready to write.
    pub fn encode(&self) -> Vec<u8> {
        format!("{self}\n").into_bytes()
    }

    /// Reads one line (without its `\n`).
    pub fn parse(line: &str) -> Result<Self, InvalidLine> {
        let words = words(line)?;
        match words.as_slice() {
            ["DRAINING"] => Ok(Self::Draining),
            ["FLOOR", "0"] => Ok(Self::Floor(false)),
            ["FLOOR", "1"] => Ok(Self::Floor(true)),
            ["DEMAND", a, b, c, d] => Ok(Self::Demand(Demand {
                in_flight: number(a, line)?,
                queued: number(b, line)?,
                refused: number(c, line)?,
                sessions: number(d, line)?,
            })),
            _ => Err(invalid(line)),
        }
    }
}

impl ServiceLine {
    /// The line with its `\n`, ready to write.
    pub fn encode(&self) -> Vec<u8> {
        format!("{self}\n").into_bytes()
    }

    /// Reads one line (without its `\n`).
    pub fn parse(line: &str) -> Result<Self, InvalidLine> {
        let words = words(line)?;
        match words.as_slice() {
            ["RETIRE", n] => match number(n, line)? {
                0 => Err(invalid(line)),
                n => Ok(Self::Retire(n)),
            },
            ["CAPACITY", n] => Ok(Self::Capacity(number(n, line)?)),
            _ => Err(invalid(line)),
        }
    }
}

fn invalid(line: &str) -> InvalidLine {
    let shown: String = line.chars().take(MAX_LINE).collect();
    InvalidLine(shown)
}

/// The words of a line: ASCII, within the length limit, separated by single spaces.
fn words(line: &str) -> Result<Vec<&str>, InvalidLine> {
    if line.is_empty()
        || line.len() > MAX_LINE
        || !line.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
    {
        return Err(invalid(line));
    }
    let words: Vec<&str> = line.split(' ').collect();
    if words.iter().any(|w| w.is_empty()) {
        return Err(invalid(line));
    }
    Ok(words)
}

/// A decimal count: digits only, no leading zero (but `0` itself), fits a `u64`.
fn number(word: &str, line: &str) -> Result<u64, InvalidLine> {
    let digits = word.bytes().all(|b| b.is_ascii_digit());
    if !digits || (word.len() > 1 && word.starts_with('0')) {
        return Err(invalid(line));
    }
    word.parse().map_err(|_| invalid(line))
}

/// Why no line could be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadLineError {
    /// The peer closed the link.
    #[error("the link closed")]
    Closed,
    /// The socket failed.
    #[error("link I/O: {0}")]
    Io(#[from] std::io::Error),
    /// More than [`MAX_LINE`] bytes without a `\n`, or bytes that are not ASCII.
    #[error("{0}")]
    Invalid(#[from] InvalidLine),
}

/// Reads a link's lines. Cancel-safe: what a read that lost a `select!` got stays buffered.
#[derive(Debug)]
pub struct LineReader<R> {
    io: R,
    buf: Vec<u8>,
}

impl<R: tokio::io::AsyncRead + Unpin> LineReader<R> {
    /// Reads lines from `io`, after the bytes in `rest` (read past the `101`).
    pub fn new(io: R, rest: &[u8]) -> Self {
        Self {
            io,
            buf: rest.to_vec(),
        }
    }

    /// The next line, without its `\n`.
    pub async fn next_line(&mut self) -> Result<String, ReadLineError> {
        use tokio::io::AsyncReadExt;
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).take(end).collect();
                return String::from_utf8(line)
                    .map_err(|e| invalid(&String::from_utf8_lossy(e.as_bytes())).into());
            }
            if self.buf.len() > MAX_LINE {
                return Err(invalid(&String::from_utf8_lossy(&self.buf)).into());
            }
            self.buf.reserve(256);
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return Err(ReadLineError::Closed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn lines_round_trip() {
        let demand = NodeLine::Demand(Demand {
            in_flight: 3,
            queued: 5,
            refused: 0,
            sessions: 8,
        });
        assert_eq!(demand.encode(), b"DEMAND 3 5 0 8\n");
        assert_eq!(NodeLine::parse("DEMAND 3 5 0 8").unwrap(), demand);
        for line in [ServiceLine::Retire(2), ServiceLine::Capacity(0)] {
            let text = line.to_string();
            assert_eq!(ServiceLine::parse(&text).unwrap(), line);
        }
    }

    #[tokio::test]
    async fn lines_are_read_whole_across_reads_and_bounded() {
        let io = tokio_test_reader(&[b"RET", b"IRE 2\nCAPA", b"CITY 3\n"]);
        let mut lines = LineReader::new(io, b"DEMAND 0 0 0 1\n");
        assert_eq!(lines.next_line().await.unwrap(), "DEMAND 0 0 0 1");
        assert_eq!(lines.next_line().await.unwrap(), "RETIRE 2");
        assert_eq!(lines.next_line().await.unwrap(), "CAPACITY 3");
        assert!(matches!(
            lines.next_line().await,
            Err(ReadLineError::Closed)
        ));
        let long = vec![b'x'; MAX_LINE + 2];
        let mut lines = LineReader::new(tokio_test_reader(&[&long]), b"");
        assert!(matches!(
            lines.next_line().await,
            Err(ReadLineError::Invalid(_))
        ));
    }

    /// A reader that yields `chunks` one read each, then EOF.
    fn tokio_test_reader(chunks: &[&[u8]]) -> impl tokio::io::AsyncRead + Unpin {
        let (mut tx, rx) = tokio::io::duplex(4096);
        let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for c in chunks {
                tx.write_all(&c).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        rx
    }
}
