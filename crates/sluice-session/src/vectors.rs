//! The shared protocol test vectors (`protocol/vectors/session.json`, described in
//! `protocol/README.md`), typed for Rust test suites. The Go and Python SDKs read the same file,
//! so every implementation is held to one set of bytes and verdicts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::hello::Identity;

/// Every vector, by section.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vectors {
    /// The format version; 1.
    pub version: u32,
    /// The acceptor configuration the wire `status` fields assume.
    pub acceptor: Fixture,
    /// Registrations: identity ⇄ bytes.
    pub registrations: Vec<Request>,
    /// Drain requests: identity ⇄ bytes.
    pub drains: Vec<Request>,
    /// What services may send, and the acceptor's verdicts.
    pub hellos: Vec<HelloCase>,
    /// What acceptors may answer, and what an SDK makes of it.
    pub replies: Vec<ReplyCase>,
    /// `Sluice-Client-Addr` fields and the client address an SDK reports for them.
    pub client_addresses: Vec<ClientAddrCase>,
    /// Requests on a session and the field values the app behind an SDK must see in them.
    pub app_fields: Vec<AppFieldsCase>,
    /// Identities an SDK must accept or refuse before dialing.
    pub options: Vec<OptionsCase>,
    /// Control link requests: identity ⇄ bytes.
    pub controls: Vec<Request>,
    /// What acceptors may answer to a control request.
    pub control_replies: Vec<ControlReplyCase>,
    /// Control link lines and their readings.
    pub control_lines: Vec<ControlLineCase>,
    /// Capacity splits across nodes.
    pub splits: Vec<SplitCase>,
    /// Acceptor addresses and what they name.
    pub addresses: Vec<AddressCase>,
}

/// An acceptor's answer to a control request and what an SDK makes of it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlReplyCase {
    /// What the vector shows.
    pub name: String,
    /// The answer's bytes.
    pub bytes: Bytes,
    /// The SDK's verdict.
    pub expect: ControlReplyVerdict,
}

/// What an SDK concludes from an answer to a control request.
#[derive(Debug, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlReplyVerdict {
    /// The link is up; `rest` holds its first lines.
    Control {
        /// Bytes read past the head.
        rest: Bytes,
    },
    /// A `400`: the acceptor has no control links.
    Unsupported,
    /// A refusal.
    Refused {
        /// The HTTP status.
        status: u16,
        /// Whether to dial the link again.
        retryable: bool,
    },
    /// Not the protocol.
    Error {
        /// Whether to dial the link again.
        retryable: bool,
    },
}

/// A control line and its reading.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlLineCase {
    /// `"node"` or `"service"`: who sends it.
    pub from: String,
    /// The line without its `\n`.
    pub line: String,
    /// The reading: an object, or the string `"invalid"`.
    pub parse: serde_json::Value,
}

/// One split of capacity across nodes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitCase {
    /// What the vector shows.
    pub name: String,
    /// The declared capacity.
    pub capacity: usize,
    /// The nodes, in order.
    pub nodes: Vec<SplitNode>,
    /// The sessions each should hold.
    pub targets: Vec<usize>,
    /// The instance is quiet: no node's last sample was above 0.
    #[serde(default)]
    pub quiet: bool,
}

/// A node as a split sees it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitNode {
    /// Link up and not draining.
    pub live: bool,
    /// Smoothed demand.
    pub demand: f64,
    /// Sessions held, less those asked to retire.
    pub held: usize,
    /// Whether the node asks this instance for its floor (its last `FLOOR`; `true`, the
    /// default, for a node that sent none).
    #[serde(default = "asks_for_floor")]
    pub floor: bool,
}

fn asks_for_floor() -> bool {
    true
}

/// An acceptor address and what it names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressCase {
    /// What the vector shows.
    pub name: String,
    /// The address as written.
    pub address: String,
    /// `{"single"}`, `{"dns": {"name", "port"}}`, `{"list"}`, or `"invalid"`.
    pub expect: serde_json::Value,
}

/// The acceptor the wire statuses assume.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixture {
    /// The one reverse cluster.
    pub cluster: String,
    /// The tokens that open it.
    pub tokens: Vec<String>,
    /// The handshake size limit.
    pub max_handshake_size: usize,
}

/// An identity as the vectors write it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorIdentity {
    /// Cluster name.
    pub service: String,
    /// Slice name.
    pub slice: String,
    /// Instance id, if sent.
    pub instance: Option<String>,
    /// Bearer token, if sent.
    pub token: Option<String>,
}

impl From<VectorIdentity> for Identity {
    fn from(v: VectorIdentity) -> Self {
        Identity {
            service: v.service,
            slice: v.slice,
            instance: v.instance,
            token: v.token,
        }
    }
}

/// A registration or drain request and its encoding.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// What the vector shows.
    pub name: String,
    /// Who sends it.
    pub identity: VectorIdentity,
    /// `Sluice-Capacity` (registrations only; `None`: the header is absent).
    #[serde(default)]
    pub capacity: Option<u32>,
    /// `Sluice-Streams` of an HTTP/2 session (registrations only; `None`: HTTP/1.1).
    #[serde(default)]
    pub streams: Option<u32>,
    /// `Sluice-Split` of a control link (`"service"`; `None`: the header is absent).
    #[serde(default)]
    pub split: Option<String>,
    /// The exact bytes.
    pub bytes: Bytes,
    /// The fixture acceptor's answer.
    pub status: u16,
}

/// Raw bytes a service sends, and what the acceptor must make of them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelloCase {
    /// What the vector shows.
    pub name: String,
    /// The bytes on the wire.
    pub bytes: Bytes,
    /// The codec's verdict.
    pub parse: ParseVerdict,
    /// The fixture acceptor's answer on a socket; `None` when it waits for more bytes.
    pub status: Option<u16>,
}

/// The codec's verdict on a hello.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParseVerdict {
    /// `"partial"`: a valid prefix.
    Partial,
    /// A registration.
    #[serde(untagged)]
    Register {
        /// The parsed registration.
        register: RegisterVerdict,
        /// The head's length, when bytes follow it.
        #[serde(default)]
        consumed: Option<usize>,
    },
    /// A drain request.
    #[serde(untagged)]
    Drain {
        /// The parsed drain request.
        drain: DrainVerdict,
    },
    /// A refusal.
    #[serde(untagged)]
    Reject {
        /// Its status and reason.
        reject: RejectVerdict,
    },
}

/// A parsed registration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterVerdict {
    /// Who registers.
    pub identity: VectorIdentity,
    /// `Sluice-Capacity`, if sent.
    pub capacity: Option<u32>,
    /// `Sluice-Streams` of an HTTP/2 session; `None`: HTTP/1.1.
    #[serde(default)]
    pub streams: Option<u32>,
}

/// A parsed drain request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainVerdict {
    /// Whose sessions to drain.
    pub identity: VectorIdentity,
}

/// A refusal the codec must give.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectVerdict {
    /// The HTTP status.
    pub status: u16,
    /// A substring of the reason.
    pub reason: String,
}

/// An acceptor's answer and what an SDK makes of it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyCase {
    /// What the vector shows.
    pub name: String,
    /// `"register"`, `"register-h2"` (with `Sluice-Protocol: h2`) or `"drain"`: what the SDK
    /// sent.
    pub request: String,
    /// The answer's bytes, up to the end of the connection.
    pub bytes: Bytes,
    /// The SDK's verdict.
    pub expect: ReplyVerdict,
}

/// What an SDK must conclude from an answer.
#[derive(Debug, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReplyVerdict {
    /// The connection is a session; `rest` reaches the HTTP server first.
    Session {
        /// Bytes read past the head.
        rest: Bytes,
    },
    /// The drain was accepted.
    Drained,
    /// A refusal with its status.
    Refused {
        /// The HTTP status.
        status: u16,
        /// Whether to re-dial.
        retryable: bool,
        /// The acceptor's reason (its body), which the SDK's error must show.
        #[serde(default)]
        reason: Option<String>,
    },
    /// Not the protocol, or the connection ended early.
    Error {
        /// Whether to re-dial.
        retryable: bool,
    },
}

/// The `Sluice-Client-Addr` fields of a request and what an SDK reports as its client.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAddrCase {
    /// What the vector shows.
    pub name: String,
    /// The field values, in order (empty: no such header).
    pub values: Vec<String>,
    /// The client address, written as the proxy writes it; `None`: the values say nothing
    /// an SDK may trust, so it reports the session's peer, as without the header.
    pub client: Option<String>,
}

/// A request as the proxy forwards it on a session, and field values the app must see in it:
/// the SDK hands them on as they were sent (W3C trace context, `baggage`), never validated,
/// re-cased, re-ordered or dropped.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppFieldsCase {
    /// What the vector shows.
    pub name: String,
    /// The request's bytes, head and all, as they arrive on the session.
    pub request: Bytes,
    /// By lower-case field name, the values of its field lines in the order sent, each
    /// without the whitespace around it (empty: the app sees no such field). Names not listed
    /// are not checked.
    pub fields: BTreeMap<String, Vec<Bytes>>,
}

/// An identity an SDK must accept or refuse.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionsCase {
    /// What the vector shows.
    pub name: String,
    /// The identity.
    pub identity: VectorIdentity,
    /// Whether it is accepted.
    pub valid: bool,
}

/// A byte string written as a JSON string of characters below U+0100, one byte each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.chars()
            .map(|c| u8::try_from(u32::from(c)))
            .collect::<Result<Vec<u8>, _>>()
            .map(Bytes)
            .map_err(|_| serde::de::Error::custom("a byte string holds only U+0000..=U+00FF"))
    }
}

/// Where the vectors live in the repository.
pub fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../protocol/vectors/session.json")
}

/// Reads and parses the vectors.
pub fn load() -> Result<Vectors, String> {
    let path = path();
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}
