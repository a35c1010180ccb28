//! The messages of the handoff protocol: one ASCII text line per datagram.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The protocol version this crate speaks in `HELLO`.
pub const PROTOCOL_VERSION: u32 = 1;
/// The longest message line, in bytes (a trailing `\n` not counted).
pub const MAX_MESSAGE: usize = 512;
/// The longest name (cluster, slice, instance, listener name or address), in bytes.
pub const MAX_WORD: usize = 128;

/// What a peer says it is in its `HELLO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A process that leases sessions (a `sluice` proxy, the NGINX module).
    Consumer,
    /// The acceptor daemon that owns the registered sessions.
    Acceptor,
    /// Either side of a hot restart (old and new `sluice` process).
    Upgrade,
}

impl Role {
    /// The role's word on the wire: `consumer`, `acceptor` or `upgrade`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Consumer => "consumer",
            Role::Acceptor => "acceptor",
            Role::Upgrade => "upgrade",
        }
    }

    fn parse(word: &str) -> Result<Self, ParseError> {
        match word {
            "consumer" => Ok(Role::Consumer),
            "acceptor" => Ok(Role::Acceptor),
            "upgrade" => Ok(Role::Upgrade),
            _ => Err(ParseError::BadRole(word.to_owned())),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a slice has sessions at the acceptor, as `SLICE` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SliceState {
    /// No session of the slice is registered: none idle at the acceptor, none lent out.
    Empty,
    /// At least one session of the slice is registered again.
    Registered,
}

impl SliceState {
    /// The state's word on the wire: `empty` or `registered`.
    pub fn as_str(self) -> &'static str {
        match self {
            SliceState::Empty => "empty",
            SliceState::Registered => "registered",
        }
    }

    fn parse(word: &str) -> Result<Self, ParseError> {
        match word {
            "empty" => Ok(SliceState::Empty),
            "registered" => Ok(SliceState::Registered),
            _ => Err(ParseError::BadState(word.to_owned())),
        }
    }
}

impl fmt::Display for SliceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a handed-over listening socket listens: `ip:port` or `unix:/path` on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ListenAddr {
    /// A TCP listener (`127.0.0.1:8080`, `[::1]:8080`).
    Inet(SocketAddr),
    /// A UNIX stream listener at an absolute path (`unix:/run/sluice.sock`).
    Unix(PathBuf),
}

impl ListenAddr {
    fn parse(word: &str) -> Result<Self, ParseError> {
        let bad = || ParseError::BadAddr(word.to_owned());
        match word.strip_prefix("unix:") {
            Some(path) if path.starts_with('/') => Ok(ListenAddr::Unix(PathBuf::from(path))),
            Some(_) => Err(bad()),
            None => word.parse().map(ListenAddr::Inet).map_err(|_| bad()),
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Inet(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// One message of the handoff protocol (docs/design.md §4).
///
/// Names (`cluster`, `slice`, `instance`, listener `name`) are 1 to [`MAX_WORD`] bytes of
/// visible ASCII without spaces; [`Message::encode`] refuses anything else, so what is sent
/// always parses back to the same message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Message {
    /// `HELLO <version> <role>`: the first message in both directions.
    Hello {
        /// The protocol version the sender speaks ([`crate::PROTOCOL_VERSION`]).
        version: u32,
        /// What the sender is.
        role: Role,
    },
    /// `CREDIT <cluster> <slice> <n>`: the consumer may receive up to `n` more sessions.
    Credit {
        /// The cluster the credit is for.
        cluster: String,
        /// The slice within the cluster.
        slice: String,
        /// How many more sessions; never zero.
        n: u32,
    },
    /// `SESSION <id> <cluster> <slice> <instance>` + fd: a session changes owner.
    Session {
        /// The session's id, unique within the acceptor.
        id: u64,
        /// The cluster the session serves.
        cluster: String,
        /// The slice it belongs to.
        slice: String,
        /// The instance that registered it (may be an IP address, IPv6 included).
        instance: String,
    },
    /// `RETURN <id>` + fd: an idle, reusable session comes back to the acceptor.
    Return {
        /// The session's id.
        id: u64,
    },
    /// `GONE <id>`: the consumer closed or consumed that session.
    Gone {
        /// The session's id.
        id: u64,
    },
    /// `RECALL <cluster> <slice> <n>`: give `n` sessions of that slice back as they become
    /// idle (another consumer of the same pool is short), even with requests waiting here.
    Recall {
        /// The cluster.
        cluster: String,
        /// The slice within the cluster.
        slice: String,
        /// How many sessions to return; never zero.
        n: u32,
    },
    /// `DRAIN <instance>`: stop leasing that instance; return or close its sessions.
    Drain {
        /// The instance to drain.
        instance: String,
    },
    /// `SLICE <cluster> <slice> <state>`: that slice has no session registered at the
    /// acceptor (`empty`), or has some again (`registered`); sent to the consumers that asked
    /// for credit of it, when it first asks while the slice is empty and at every change.
    Slice {
        /// The cluster.
        cluster: String,
        /// The slice within the cluster.
        slice: String,
        /// Whether it has sessions.
        state: SliceState,
    },
    /// `LISTENER <name> <addr>` + fd: a listening socket, on hot restart.
    Listener {
        /// The listener's name in the config.
        name: String,
        /// Where it listens.
        addr: ListenAddr,
    },
    /// `READY`: the new process loaded its config; send the listeners.
    Ready,
    /// `DONE`: the old process will send nothing more.
    Done,
}

/// Why a datagram is not a handoff message (or a message cannot be encoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The datagram held no text.
    #[error("empty message")]
    Empty,
    /// The line is longer than [`MAX_MESSAGE`] bytes.
    #[error("message of {0} bytes exceeds the limit of {MAX_MESSAGE}")]
    TooLong(usize),
    /// A byte that is neither visible ASCII nor a single separating space.
    #[error("byte 0x{byte:02x} at offset {offset} is not visible ASCII")]
    BadByte {
        /// The offending byte.
        byte: u8,
        /// Where it is in the line.
        offset: usize,
    },
    /// Two spaces in a row, or a leading or trailing space.
    #[error("empty word (words are separated by exactly one space)")]
    EmptyWord,
    /// The first word is not one of the protocol's verbs.
    #[error("unknown verb {0:?}")]
    UnknownVerb(String),
    /// The verb is known but takes a different number of arguments.
    #[error("{verb} takes {expected} argument(s), got {got}")]
    WordCount {
        /// The verb.
        verb: &'static str,
        /// How many arguments it takes.
        expected: usize,
        /// How many the line had.
        got: usize,
    },
    /// A number that is not canonical unsigned decimal, or out of range.
    #[error("{field} {value:?} is not a valid number")]
    BadNumber {
        /// Which argument.
        field: &'static str,
        /// The word as given.
        value: String,
    },
    /// `CREDIT` with `n = 0`.
    #[error("CREDIT of zero sessions")]
    ZeroCredit,
    /// A name that is empty, longer than [`MAX_WORD`], or holds a space or invisible byte.
    #[error("{field} must be 1 to {MAX_WORD} bytes of visible ASCII without spaces")]
    BadWord {
        /// Which argument.
        field: &'static str,
    },
    /// A `HELLO` role other than `consumer`, `acceptor` or `upgrade`.
    #[error("unknown role {0:?}")]
    BadRole(String),
    /// A `SLICE` state other than `empty` or `registered`.
    #[error("unknown slice state {0:?}")]
    BadState(String),
    /// A `LISTENER` address that is neither `ip:port` nor `unix:/absolute/path`.
    #[error("listener address {0:?} is neither ip:port nor unix:/path")]
    BadAddr(String),
}

impl Message {
    /// The message's verb, as on the wire (`"SESSION"`).
    pub fn verb(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "HELLO",
            Message::Credit { .. } => "CREDIT",
            Message::Recall { .. } => "RECALL",
            Message::Session { .. } => "SESSION",
            Message::Return { .. } => "RETURN",
            Message::Gone { .. } => "GONE",
            Message::Drain { .. } => "DRAIN",
            Message::Slice { .. } => "SLICE",
            Message::Listener { .. } => "LISTENER",
            Message::Ready => "READY",
            Message::Done => "DONE",
        }
    }

    /// Whether the message travels with exactly one fd (`SESSION`, `RETURN`, `LISTENER`);
    /// every other message travels with none.
    pub fn carries_fd(&self) -> bool {
        matches!(
            self,
            Message::Session { .. } | Message::Return { .. } | Message::Listener { .. }
        )
    }

    /// Parses one datagram. One trailing `\n` is allowed and ignored; anything else that is
    /// not exactly a protocol line is an error. Never panics.
    pub fn parse(datagram: &[u8]) -> Result<Self, ParseError> {
        let line = datagram.strip_suffix(b"\n").unwrap_or(datagram);
        if line.is_empty() {
            return Err(ParseError::Empty);
        }
        if line.len() > MAX_MESSAGE {
            return Err(ParseError::TooLong(line.len()));
        }
        if let Some((offset, &byte)) = line
            .iter()
            .enumerate()
            .find(|(_, b)| !(b.is_ascii_graphic() || **b == b' '))
        {
            return Err(ParseError::BadByte { byte, offset });
        }
        // Only visible ASCII and spaces remain, so the line is valid UTF-8.
        let line = std::str::from_utf8(line).map_err(|_| ParseError::Empty)?;
        let words: Vec<&str> = line.split(' ').collect();
        if words.iter().any(|w| w.is_empty()) {
            return Err(ParseError::EmptyWord);
        }
        Self::from_words(words[0], &words[1..])
    }

    fn from_words(verb: &str, args: &[&str]) -> Result<Self, ParseError> {
        let (verb, expected): (&'static str, usize) = match verb {
            "HELLO" => ("HELLO", 2),
            "CREDIT" => ("CREDIT", 3),
            "RECALL" => ("RECALL", 3),
            "SESSION" => ("SESSION", 4),
            "RETURN" => ("RETURN", 1),
            "GONE" => ("GONE", 1),
            "DRAIN" => ("DRAIN", 1),
            "SLICE" => ("SLICE", 3),
            "LISTENER" => ("LISTENER", 2),
            "READY" => ("READY", 0),
            "DONE" => ("DONE", 0),
            other => return Err(ParseError::UnknownVerb(other.to_owned())),
        };
        if args.len() != expected {
            return Err(ParseError::WordCount {
                verb,
                expected,
                got: args.len(),
            });
        }
        Ok(match verb {
            "HELLO" => Message::Hello {
                version: number("version", args[0])?,
                role: Role::parse(args[1])?,
            },
            "CREDIT" => Message::Credit {
                cluster: name("cluster", args[0])?,
                slice: name("slice", args[1])?,
                n: credit(args[2])?,
            },
            "RECALL" => Message::Recall {
                cluster: name("cluster", args[0])?,
                slice: name("slice", args[1])?,
                n: credit(args[2])?,
            },
            "SESSION" => Message::Session {
                id: number("id", args[0])?,
                cluster: name("cluster", args[1])?,
                slice: name("slice", args[2])?,
                instance: name("instance", args[3])?,
            },
            "RETURN" => Message::Return {
                id: number("id", args[0])?,
            },
            "GONE" => Message::Gone {
                id: number("id", args[0])?,
            },
            "DRAIN" => Message::Drain {
                instance: name("instance", args[0])?,
            },
            "SLICE" => Message::Slice {
                cluster: name("cluster", args[0])?,
                slice: name("slice", args[1])?,
                state: SliceState::parse(args[2])?,
            },
            "LISTENER" => Message::Listener {
                name: name("name", args[0])?,
                addr: ListenAddr::parse(args[1])?,
            },
            "READY" => Message::Ready,
            _ => Message::Done,
        })
    }

    /// The datagram to send (no trailing newline). Fails, sending nothing, when a name is not
    /// a valid word, `n` is zero, or a listener address would not read back the same.
    pub fn encode(&self) -> Result<Vec<u8>, ParseError> {
        self.validate()?;
        let verb = self.verb();
        let line = match self {
            Message::Hello { version, role } => format!("{verb} {version} {role}"),
            Message::Credit { cluster, slice, n } | Message::Recall { cluster, slice, n } => {
                format!("{verb} {cluster} {slice} {n}")
            }
            Message::Session {
                id,
                cluster,
                slice,
                instance,
            } => format!("{verb} {id} {cluster} {slice} {instance}"),
            Message::Return { id } | Message::Gone { id } => format!("{verb} {id}"),
            Message::Drain { instance } => format!("{verb} {instance}"),
            Message::Slice {
                cluster,
                slice,
                state,
            } => format!("{verb} {cluster} {slice} {state}"),
            Message::Listener { name, addr } => format!("{verb} {name} {addr}"),
            Message::Ready | Message::Done => verb.to_owned(),
        };
        Ok(line.into_bytes())
    }

    /// Checks every field against the rules [`Message::parse`] enforces.
    fn validate(&self) -> Result<(), ParseError> {
        match self {
            Message::Credit { cluster, slice, n } | Message::Recall { cluster, slice, n } => {
                name("cluster", cluster)?;
                name("slice", slice)?;
                if *n == 0 {
                    return Err(ParseError::ZeroCredit);
                }
            }
            Message::Session {
                cluster,
                slice,
                instance,
                ..
            } => {
                name("cluster", cluster)?;
                name("slice", slice)?;
                name("instance", instance)?;
            }
            Message::Drain { instance } => {
                name("instance", instance)?;
            }
            Message::Slice { cluster, slice, .. } => {
                name("cluster", cluster)?;
                name("slice", slice)?;
            }
            Message::Listener { name: n, addr } => {
                name("name", n)?;
                let word = addr.to_string();
                let ok = word.len() <= MAX_WORD && word.bytes().all(|b| b.is_ascii_graphic());
                if !ok || ListenAddr::parse(&word).as_ref() != Ok(addr) {
                    return Err(ParseError::BadAddr(word));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.encode() {
            Ok(line) => f.write_str(&String::from_utf8_lossy(&line)),
            Err(_) => write!(f, "{} (invalid)", self.verb()),
        }
    }
}

/// A name: 1..=[`MAX_WORD`] bytes of visible ASCII, no spaces.
fn name(field: &'static str, word: &str) -> Result<String, ParseError> {
    let ok =
        !word.is_empty() && word.len() <= MAX_WORD && word.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(word.to_owned())
    } else {
        Err(ParseError::BadWord { field })
    }
}

/// A canonical unsigned decimal: digits only, no sign, no leading zero (except "0").
fn number<T: std::str::FromStr>(field: &'static str, word: &str) -> Result<T, ParseError> {
    let canonical =
        word.bytes().all(|b| b.is_ascii_digit()) && !(word.len() > 1 && word.starts_with('0'));
    let bad = || ParseError::BadNumber {
        field,
        value: word.to_owned(),
    };
    if !canonical {
        return Err(bad());
    }
    word.parse().map_err(|_| bad())
}

fn credit(word: &str) -> Result<u32, ParseError> {
    match number("n", word)? {
        0 => Err(ParseError::ZeroCredit),
        n => Ok(n),
    }
}
