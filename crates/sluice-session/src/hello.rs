//! What a service sends to the acceptor: a registration or a drain request.

use std::fmt::Write as _;

use crate::protocol::{
    Parsed, CONTROL_PATH, CONTROL_TOKEN, DEFAULT_SLICE, DRAIN_PATH, HEADER_CAPACITY,
    HEADER_INSTANCE, HEADER_PROTOCOL, HEADER_SERVICE, HEADER_SLICE, HEADER_SPLIT, HEADER_STREAMS,
    MAX_HEADERS, MAX_STREAMS, PROTOCOL_H2, PROTOCOL_HTTP1, SESSION_PATH, SPLIT_BY_SERVICE,
    UPGRADE_TOKEN,
};
use crate::reply::Rejection;

/// Who is speaking: the cluster, slice and instance, and the credential.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// The cluster the instance serves.
    pub service: String,
    /// The slice its sessions join; [`DEFAULT_SLICE`] when not given.
    pub slice: String,
    /// The instance id; `None` means "use the peer's IP address".
    pub instance: Option<String>,
    /// The bearer token, when one was sent.
    pub token: Option<String>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("service", &self.service)
            .field("slice", &self.slice)
            .field("instance", &self.instance)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Identity {
    /// An identity for `service` in the default slice, with no instance id and no token.
    pub fn new(service: impl Into<String>) -> Self {
        Self {
            service: service.into(),
            slice: DEFAULT_SLICE.to_owned(),
            instance: None,
            token: None,
        }
    }
}

/// `GET /.sluice/v1/session` with `Upgrade: sluice-session/1`: make this connection a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Who registers.
    pub identity: Identity,
    /// The instance's intended number of sessions (informational).
    pub capacity: Option<u32>,
    /// `Some(n)`: the session speaks HTTP/2 after its `101` and takes `n` (1 to
    /// [`MAX_STREAMS`]) requests at once; `None`: HTTP/1.1, one at a time. Control links
    /// carry none.
    pub streams: Option<u32>,
}

/// `POST /.sluice/v1/drain`: stop leasing the instance's sessions and close them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    /// Whose sessions to drain (the slice is ignored: an instance drains as a whole).
    pub identity: Identity,
}

/// A message a service sends to the acceptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Register this connection as a session.
    Register(Registration),
    /// Drain an instance.
    Drain(Drain),
    /// Open a control link (many nodes): the instance's demand reports and retirements, and
    /// how its SDK splits (`Sluice-Split`).
    Control(Registration, SplitBy),
}

/// How a control link's SDK keeps its floor of one session per node (`Sluice-Split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitBy {
    /// On every live node (no header: an SDK that knows no `FLOOR`).
    Instance,
    /// On the nodes that ask it with `FLOOR 1` (`Sluice-Split: service`).
    Service,
}

impl Registration {
    /// The request bytes, ready to write.
    pub fn encode(&self) -> Vec<u8> {
        self.upgrade_request(SESSION_PATH, UPGRADE_TOKEN, self.streams)
    }

    /// The same identity's control link request (`GET /.sluice/v1/control`), which carries no
    /// requests and so names no protocol.
    pub fn encode_control(&self) -> Vec<u8> {
        self.upgrade_request(CONTROL_PATH, CONTROL_TOKEN, None)
    }

    /// [`encode_control`](Self::encode_control), saying how the SDK splits: with
    /// [`SplitBy::Service`] the node sends it `FLOOR` lines.
    pub fn encode_control_split(&self, split: SplitBy) -> Vec<u8> {
        let mut out = self.encode_control();
        if split == SplitBy::Service {
            let header = format!("Sluice-Split: {SPLIT_BY_SERVICE}\r\n\r\n");
            out.truncate(out.len() - 2);
            out.extend_from_slice(header.as_bytes());
        }
        out
    }

    fn upgrade_request(&self, path: &str, token: &str, streams: Option<u32>) -> Vec<u8> {
        let mut out = format!(
            "GET {path} HTTP/1.1\r\nHost: sluice\r\nConnection: Upgrade\r\nUpgrade: {token}\r\n"
        );
        identity_headers(&mut out, &self.identity);
        if let Some(n) = self.capacity {
            let _ = write!(out, "Sluice-Capacity: {n}\r\n");
        }
        if let Some(n) = streams {
            let _ = write!(
                out,
                "Sluice-Protocol: {PROTOCOL_H2}\r\nSluice-Streams: {n}\r\n"
            );
        }
        out.push_str("\r\n");
        out.into_bytes()
    }
}

impl Drain {
    /// The request bytes, ready to write.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            format!("POST {DRAIN_PATH} HTTP/1.1\r\nHost: sluice\r\nContent-Length: 0\r\n");
        identity_headers(&mut out, &self.identity);
        out.push_str("\r\n");
        out.into_bytes()
    }
}

fn identity_headers(out: &mut String, id: &Identity) {
    let _ = write!(
        out,
        "Sluice-Service: {}\r\nSluice-Slice: {}\r\n",
        id.service, id.slice
    );
    if let Some(instance) = &id.instance {
        let _ = write!(out, "Sluice-Instance: {instance}\r\n");
    }
    if let Some(token) = &id.token {
        let _ = write!(out, "Authorization: Bearer {token}\r\n");
    }
}

/// Parses a service's first request. Bytes beyond `max_head` without a complete head are a
/// 400; so is anything that is not exactly one of the two requests of the protocol.
pub fn parse_hello(buf: &[u8], max_head: usize) -> Result<Parsed<Hello>, Rejection> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= max_head => len,
        Ok(httparse::Status::Partial) if buf.len() <= max_head => return Ok(Parsed::Partial),
        Ok(_) => return Err(Rejection::bad_request("handshake head too large")),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Rejection::bad_request("too many headers"))
        }
        Err(_) => return Err(Rejection::bad_request("malformed HTTP/1.1 request")),
    };
    if req.version != Some(1) {
        return Err(Rejection::bad_request("the handshake must be HTTP/1.1"));
    }
    let head = Head::read(req.headers)?;
    let hello = match (req.method, req.path) {
        (Some("GET"), Some(SESSION_PATH)) => Hello::Register(registration(&head, UPGRADE_TOKEN)?),
        (Some("GET"), Some(CONTROL_PATH)) => Hello::Control(
            registration(&head, CONTROL_TOKEN)?,
            match head.split {
                Some(v) if v.eq_ignore_ascii_case(SPLIT_BY_SERVICE) => SplitBy::Service,
                _ => SplitBy::Instance,
            },
        ),
        (Some("POST"), Some(DRAIN_PATH)) => Hello::Drain(Drain {
            identity: head.identity()?,
        }),
        _ => {
            return Err(Rejection::bad_request(
                "expected GET /.sluice/v1/session or POST /.sluice/v1/drain",
            ))
        }
    };
    Ok(Parsed::Complete(hello, len))
}

fn registration(head: &Head<'_>, token: &str) -> Result<Registration, Rejection> {
    if !head.connection_upgrade {
        return Err(Rejection::bad_request("missing Connection: Upgrade"));
    }
    match head.upgrade {
        Some(t) if t.eq_ignore_ascii_case(token) => {}
        Some(_) => {
            let why = format!("unsupported Upgrade: expected {token}");
            return Err(Rejection::bad_request(&why));
        }
        None => {
            let why = format!("missing Upgrade: {token}");
            return Err(Rejection::bad_request(&why));
        }
    }
    let capacity = match head.capacity {
        None => None,
        Some(v) => Some(
            v.parse::<u32>()
                .map_err(|_| Rejection::bad_request("Sluice-Capacity must be a whole number"))?,
        ),
    };
    Ok(Registration {
        identity: head.identity()?,
        capacity,
        streams: head.streams()?,
    })
}

/// The headers the protocol cares about, each at most once.
#[derive(Default)]
struct Head<'a> {
    service: Option<&'a str>,
    slice: Option<&'a str>,
    instance: Option<&'a str>,
    capacity: Option<&'a str>,
    protocol: Option<&'a str>,
    streams: Option<&'a str>,
    split: Option<&'a str>,
    authorization: Option<&'a str>,
    upgrade: Option<&'a str>,
    connection_upgrade: bool,
}

impl<'a> Head<'a> {
    fn read(headers: &[httparse::Header<'a>]) -> Result<Self, Rejection> {
        let mut head = Head::default();
        for h in headers {
            let value = std::str::from_utf8(h.value)
                .map_err(|_| Rejection::bad_request("header values must be ASCII"))?
                .trim();
            let name = h.name.to_ascii_lowercase();
            let slot = match name.as_str() {
                HEADER_SERVICE => &mut head.service,
                HEADER_SLICE => &mut head.slice,
                HEADER_INSTANCE => &mut head.instance,
                HEADER_CAPACITY => &mut head.capacity,
                HEADER_PROTOCOL => &mut head.protocol,
                HEADER_STREAMS => &mut head.streams,
                HEADER_SPLIT => &mut head.split,
                "authorization" => &mut head.authorization,
                "upgrade" => &mut head.upgrade,
                "connection" => {
                    head.connection_upgrade |= value
                        .split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
                    continue;
                }
                "content-length" if value != "0" => {
                    return Err(Rejection::bad_request("the handshake has no body"))
                }
                "transfer-encoding" => {
                    return Err(Rejection::bad_request("the handshake has no body"))
                }
                _ => continue,
            };
            if slot.replace(value).is_some() {
                return Err(Rejection::bad_request("a Sluice header appears twice"));
            }
        }
        Ok(head)
    }

    /// `Sluice-Protocol` and `Sluice-Streams`: `Some(n)` for an HTTP/2 session.
    fn streams(&self) -> Result<Option<u32>, Rejection> {
        let h2 = match nonempty(self.protocol) {
            None => false,
            Some(p) if p.eq_ignore_ascii_case(PROTOCOL_HTTP1) => false,
            Some(p) if p.eq_ignore_ascii_case(PROTOCOL_H2) => true,
            Some(_) => return Err(Rejection::bad_request("unknown Sluice-Protocol")),
        };
        match (h2, self.streams) {
            (false, None) => Ok(None),
            (false, Some(_)) => Err(Rejection::bad_request(
                "Sluice-Streams applies to Sluice-Protocol: h2 only",
            )),
            (true, None) => Err(Rejection::bad_request(
                "Sluice-Streams is required with Sluice-Protocol: h2",
            )),
            (true, Some(v)) => {
                let n = (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| v.parse::<u32>().ok())
                    .flatten()
                    .filter(|n| (1..=MAX_STREAMS).contains(n));
                n.map(Some).ok_or_else(|| {
                    Rejection::bad_request("Sluice-Streams must be a whole number from 1 to 1000")
                })
            }
        }
    }

    fn identity(&self) -> Result<Identity, Rejection> {
        let service =
            nonempty(self.service).ok_or(Rejection::bad_request("missing Sluice-Service"))?;
        let token = match self.authorization {
            None => None,
            Some(auth) => Some(bearer(auth)?),
        };
        Ok(Identity {
            service: service.to_owned(),
            slice: nonempty(self.slice)
                .unwrap_or(crate::protocol::DEFAULT_SLICE)
                .to_owned(),
            instance: nonempty(self.instance).map(str::to_owned),
            token,
        })
    }
}

fn nonempty(v: Option<&str>) -> Option<&str> {
    v.filter(|v| !v.is_empty())
}

/// `Bearer <token>`; any other scheme cannot authenticate, so it is a 401.
fn bearer(auth: &str) -> Result<String, Rejection> {
    match auth.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim().to_owned())
        }
        _ => Err(Rejection::unauthorized()),
    }
}
