//! What both directions of the session protocol share: the request paths, the header names,
//! the limits, and the outcome of incremental parsing ([`Parsed`]).

/// The path of the registration request.
pub const SESSION_PATH: &str = "/.sluice/v1/session";
/// The path of the drain request.
pub const DRAIN_PATH: &str = "/.sluice/v1/drain";
/// The `Upgrade` protocol token of a session.
pub const UPGRADE_TOKEN: &str = "sluice-session/1";
/// The path of a control link's request (many nodes: `protocol/README.md`).
pub const CONTROL_PATH: &str = "/.sluice/v1/control";
/// The `Upgrade` protocol token of a control link.
pub const CONTROL_TOKEN: &str = "sluice-control/1";
/// Header naming the cluster a session serves (required).
pub const HEADER_SERVICE: &str = "sluice-service";
/// Header naming the slice (optional, default [`DEFAULT_SLICE`]).
pub const HEADER_SLICE: &str = "sluice-slice";
/// Header naming the instance (optional, default: the peer's IP address).
pub const HEADER_INSTANCE: &str = "sluice-instance";
/// Header with the instance's intended session count (optional, informational).
pub const HEADER_CAPACITY: &str = "sluice-capacity";
/// Header naming what a session speaks after its `101` (optional: `http/1.1` or [`PROTOCOL_H2`]).
pub const HEADER_PROTOCOL: &str = "sluice-protocol";
/// Header with an HTTP/2 session's stream count (required with [`PROTOCOL_H2`], refused without).
pub const HEADER_STREAMS: &str = "sluice-streams";
/// Header of a control link whose SDK splits with `FLOOR` (value [`SPLIT_BY_SERVICE`]).
pub const HEADER_SPLIT: &str = "sluice-split";
/// `Sluice-Split`'s value: the floor of one session per node is per service.
pub const SPLIT_BY_SERVICE: &str = "service";
/// `Sluice-Protocol`'s value for an HTTP/2 session.
pub const PROTOCOL_H2: &str = "h2";
/// `Sluice-Protocol`'s value for an HTTP/1.1 session (the default).
pub const PROTOCOL_HTTP1: &str = "http/1.1";
/// The most streams one HTTP/2 session may declare.
pub const MAX_STREAMS: u32 = 1000;
/// The slice of a session that names none.
pub const DEFAULT_SLICE: &str = "default";
/// The default limit on a handshake's head, in bytes.
pub const DEFAULT_MAX_HEAD: usize = 8 * 1024;
/// The most headers a handshake may carry.
pub(crate) const MAX_HEADERS: usize = 32;

/// The outcome of feeding bytes to an incremental parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<T> {
    /// A whole message, and how many bytes of the input it used (the rest belongs to what
    /// follows it on the connection).
    Complete(T, usize),
    /// The input so far is a valid prefix; read more.
    Partial,
}
