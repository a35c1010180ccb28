//! [`parse_request`]: an HTTP/1.1 request head read into offsets over the client's buffer, and
//! the fast path's verdict on it: take it (with how its body is framed) or leave it to hyper.
//!
//! The head is parsed by `httparse`, as hyper parses it, with hyper's limits (100 fields, the
//! listener's head size). Everything the fast path does not handle itself is *deferred*, not
//! refused: hyper then serves the connection from that request on and gives the answer it
//! always gave. So the fast path never has to agree with hyper on an error, only on the
//! requests it takes, and those are the plain ones: HTTP/1.1, origin-form target already
//! normal, one valid Host, framed by one `Content-Length` or one `Transfer-Encoding: chunked`
//! (or neither), no `Expect`, no `Upgrade`.

use std::ops::Range;

use crate::fields::{self, Kind};
use crate::normalize::{normal_authority, normalize_path, RequestRules, Underscores};

/// How many fields a head may have: hyper's default, so both paths draw the line alike.
pub const MAX_HEADERS: usize = 100;

/// The longest `Content-Length` taken: 19 digits always fit in a `u64`.
const MAX_LENGTH_DIGITS: usize = 19;

/// What [`parse_request`] made of the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// The head is not complete yet (and within the size limit).
    Partial,
    /// A request the fast path serves.
    Take(RequestHead),
    /// A request the fast path leaves to hyper, and why.
    Defer(Defer),
}

/// Why the fast path leaves a request to hyper. None of these is an error of the fast path's
/// own: hyper refuses what is malformed and serves what is merely unusual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defer {
    /// `httparse` refused the head (hyper answers 400 or 431).
    Malformed,
    /// The head is longer than the listener's limit (hyper answers 431).
    TooLarge,
    /// HTTP/1.0.
    Version,
    /// `CONNECT`, or a target that is not in origin form (absolute, asterisk).
    TargetForm,
    /// A target `http::Uri` would change or refuse, or a path normalisation would rewrite or
    /// refuse.
    Target,
    /// No `Host`, several, or one normalisation would rewrite or refuse.
    Host,
    /// Framing other than one `Content-Length` or one `Transfer-Encoding: chunked`.
    Framing,
    /// `Upgrade`, `Expect`, or a `Connection` value that is not visible ASCII.
    Negotiation,
    /// A field name with `_` under `underscores_in_headers = "reject"`.
    Underscore,
}

impl Defer {
    /// A short name for metrics and logs (`too_large`, `framing`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::TooLarge => "too_large",
            Self::Version => "version",
            Self::TargetForm => "target_form",
            Self::Target => "target",
            Self::Host => "host",
            Self::Framing => "framing",
            Self::Negotiation => "negotiation",
            Self::Underscore => "underscore",
        }
    }
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body.
    None,
    /// `Content-Length` bytes (more than zero).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// What a field is to the proxy; decides whether and how it is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Forwarded as it is (unless a route edit names it).
    Plain,
    /// `Host`.
    Host,
    /// `Content-Length`.
    ContentLength,
    /// Hop-by-hop (RFC 9110 §7.6.1): `Connection`, what it lists, `Keep-Alive`,
    /// `Proxy-Connection`, `TE`, `Transfer-Encoding`, `Upgrade`. Never forwarded.
    HopByHop,
    /// `X-Forwarded-For`.
    ForwardedFor,
    /// `Forwarded`.
    Forwarded,
    /// `X-Forwarded-Proto`.
    ForwardedProto,
    /// `X-Forwarded-Host`.
    ForwardedHost,
    /// A name with `_`, dropped (`underscores_in_headers = "drop"`).
    Dropped,
    /// `Sluice-Client-Addr`: Sluice's alone to set (on requests over a session), so a client's
    /// copy is never forwarded.
    ClientAddr,
}

impl Role {
    /// What the field is by its name (`fields`); `None` for one dropped for its underscore.
    pub fn kind(self) -> Option<Kind> {
        Some(match self {
            Role::Plain => Kind::Other,
            Role::Host => Kind::Host,
            Role::ContentLength => Kind::ContentLength,
            Role::HopByHop => Kind::HopByHop,
            Role::ForwardedFor => Kind::ForwardedFor,
            Role::Forwarded => Kind::Forwarded,
            Role::ForwardedProto => Kind::ForwardedProto,
            Role::ForwardedHost => Kind::ForwardedHost,
            Role::ClientAddr => Kind::ClientAddr,
            Role::Dropped => return None,
        })
    }
}

/// One header field: where its name and value are in the buffer, and its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The name's bytes.
    pub name: Range<usize>,
    /// The value's bytes (without surrounding whitespace).
    pub value: Range<usize>,
    /// What it is to the proxy.
    pub role: Role,
}

/// A request head the fast path takes, as offsets into the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Bytes of the head, up to and including the empty line.
    pub len: usize,
    /// The method.
    pub method: Range<usize>,
    /// The target (origin form, already normal).
    pub target: Range<usize>,
    /// The target as `http::Uri` parsed it (the parser checks it so; the router reads it).
    pub uri: http::Uri,
    /// The fields, in order.
    pub fields: Vec<Field>,
    /// The one `Host` value.
    pub host: Range<usize>,
    /// How the body is framed.
    pub body: BodyFraming,
    /// False when the client asked to close after this request (`Connection: close`).
    pub keep_alive: bool,
}

impl RequestHead {
    /// The method's bytes in `buf`.
    pub fn method<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.method.clone()]
    }

    /// The target's bytes in `buf`.
    pub fn target<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.target.clone()]
    }

    /// Whether the method is `HEAD` (its response has no body whatever its head says).
    pub fn is_head(&self, buf: &[u8]) -> bool {
        self.method(buf) == b"HEAD"
    }
}

/// Parses the request head at the start of `buf`, with heads longer than `max_head` deferred
/// (hyper refuses them with 431) and `rules` applied as the listener applies them.
pub fn parse_request(buf: &[u8], max_head: usize, rules: RequestRules) -> Parsed {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut storage);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= max_head => len,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Parsed::Partial,
        Ok(_) => return Parsed::Defer(Defer::TooLarge),
        Err(_) => return Parsed::Defer(Defer::Malformed),
    };
    match head(buf, &req, len, rules) {
        Ok(head) => Parsed::Take(head),
        Err(why) => Parsed::Defer(why),
    }
}

/// The verdict on a complete head `httparse` accepted.
fn head(
    buf: &[u8],
    req: &httparse::Request<'_, '_>,
    len: usize,
    rules: RequestRules,
) -> Result<RequestHead, Defer> {
    if req.version != Some(1) {
        return Err(Defer::Version);
    }
    let (method, target) = (req.method.unwrap_or(""), req.path.unwrap_or(""));
    if method == "CONNECT" || !target.starts_with('/') {
        return Err(Defer::TargetForm);
    }
    let uri = check_target(target, rules)?;
    let mut fields = Vec::with_capacity(req.headers.len());
    let mut seen = Seen::default();
    for h in req.headers.iter() {
        let role = role(h.name, rules.underscores_in_headers)?;
        let value = offset(buf, h.value);
        seen.note(role, h, fields.len(), value.start)?;
        fields.push(Field {
            name: offset(buf, h.name.as_bytes()),
            value,
            role,
        });
    }
    let (host, body) = seen.finish()?;
    mark_listed(buf, &mut fields, &seen.listed);
    Ok(RequestHead {
        len,
        method: offset(buf, method.as_bytes()),
        target: offset(buf, target.as_bytes()),
        uri,
        host: fields[host].value.clone(),
        fields,
        body,
        keep_alive: !seen.close,
    })
}

/// The target must be one `http::Uri` takes whole (hyper parses it so; it would drop a
/// fragment, for one) with a path normalisation leaves alone; it is returned as parsed.
fn check_target(target: &str, rules: RequestRules) -> Result<http::Uri, Defer> {
    let uri = http::Uri::try_from(target).map_err(|_| Defer::Target)?;
    let whole = uri
        .path_and_query()
        .is_some_and(|p| p.as_str().len() == target.len());
    match normalize_path(uri.path(), rules.escaped_slashes) {
        Ok(None) if whole => Ok(uri),
        _ => Err(Defer::Target),
    }
}

/// A field's role by its name.
fn role(name: &str, underscores: Underscores) -> Result<Role, Defer> {
    let role = match fields::kind(name.as_bytes()) {
        Kind::Upgrade | Kind::Expect => return Err(Defer::Negotiation),
        Kind::Host => Role::Host,
        Kind::ContentLength => Role::ContentLength,
        Kind::HopByHop => Role::HopByHop,
        Kind::ForwardedFor => Role::ForwardedFor,
        Kind::Forwarded => Role::Forwarded,
        Kind::ForwardedProto => Role::ForwardedProto,
        Kind::ForwardedHost => Role::ForwardedHost,
        Kind::ClientAddr => Role::ClientAddr,
        Kind::Other if name.contains('_') => match underscores {
            Underscores::Allow => Role::Plain,
            Underscores::Drop => Role::Dropped,
            Underscores::Reject => return Err(Defer::Underscore),
        },
        Kind::Other => Role::Plain,
    };
    Ok(role)
}

/// What the fields said about Host, framing and the connection, gathered in one pass.
#[derive(Debug, Default)]
struct Seen {
    host: Option<usize>,
    hosts: usize,
    length: Option<u64>,
    lengths: usize,
    chunked: usize,
    codings: usize,
    close: bool,
    /// Where the options `Connection` lists, other than `close` and `keep-alive`, are.
    listed: Vec<Range<usize>>,
}

impl Seen {
    /// Notes field `index`, `h`, whose value starts at `at` in the buffer.
    fn note(
        &mut self,
        role: Role,
        h: &httparse::Header<'_>,
        index: usize,
        at: usize,
    ) -> Result<(), Defer> {
        match role {
            Role::Host => {
                self.hosts += 1;
                self.host = Some(index);
                check_host(h.value)?;
            }
            Role::ContentLength => {
                self.lengths += 1;
                self.length = Some(content_length(h.value)?);
            }
            Role::HopByHop if h.name.eq_ignore_ascii_case("transfer-encoding") => {
                self.codings += 1;
                self.chunked += usize::from(h.value.eq_ignore_ascii_case(b"chunked"));
            }
            Role::HopByHop if h.name.eq_ignore_ascii_case("connection") => {
                self.connection(h.value, at)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Reads a `Connection` value found at `at`: `close`, and the options to strip.
    fn connection(&mut self, value: &[u8], at: usize) -> Result<(), Defer> {
        // hyper and the header rules read only visible-ASCII values; others are left to them.
        if !value
            .iter()
            .all(|b| matches!(b, b' ' | b'\t' | 0x21..=0x7e))
        {
            return Err(Defer::Negotiation);
        }
        let base = value.as_ptr() as usize;
        for option in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
            if option.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if option.eq_ignore_ascii_case(b"upgrade") {
                return Err(Defer::Negotiation);
            } else if !option.is_empty() && !option.eq_ignore_ascii_case(b"keep-alive") {
                let start = at + (option.as_ptr() as usize - base);
                self.listed.push(start..start + option.len());
            }
        }
        Ok(())
    }

    /// The Host field's index and the body's framing.
    fn finish(&self) -> Result<(usize, BodyFraming), Defer> {
        let host = match (self.hosts, self.host) {
            (1, Some(i)) => i,
            _ => return Err(Defer::Host),
        };
        let body = match (self.lengths, self.codings, self.chunked, self.length) {
            (0, 0, _, _) | (1, 0, _, Some(0)) => BodyFraming::None,
            (1, 0, _, Some(n)) => BodyFraming::Length(n),
            (0, 1, 1, _) => BodyFraming::Chunked,
            _ => return Err(Defer::Framing),
        };
        Ok((host, body))
    }
}

/// A Host value the normalisation leaves as it is.
fn check_host(value: &[u8]) -> Result<(), Defer> {
    let text = std::str::from_utf8(value).map_err(|_| Defer::Host)?;
    match normal_authority(text) {
        Ok(normal) if !text.is_empty() && normal == text => Ok(()),
        _ => Err(Defer::Host),
    }
}

/// A `Content-Length` of digits only (hyper also takes `5, 5`; the fast path leaves that).
fn content_length(value: &[u8]) -> Result<u64, Defer> {
    if value.is_empty() || value.len() > MAX_LENGTH_DIGITS || !value.iter().all(u8::is_ascii_digit)
    {
        return Err(Defer::Framing);
    }
    Ok(value.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Marks the fields `Connection` lists (at `listed`) as hop-by-hop, except `Host` and
/// `Content-Length`: a client may not make the upstream see another request than the one
/// routed.
fn mark_listed(buf: &[u8], fields: &mut [Field], listed: &[Range<usize>]) {
    if listed.is_empty() {
        return;
    }
    for field in fields.iter_mut() {
        let name = &buf[field.name.clone()];
        let named = listed
            .iter()
            .any(|o| buf[o.clone()].eq_ignore_ascii_case(name));
        if named && field.role.kind().is_none_or(Kind::connection_may_list) {
            field.role = Role::HopByHop;
        }
    }
}

/// Where `part`, a slice of `buf`, lies in it. An empty part may not point into `buf` at all
/// (`httparse` can return a static `""`), so it gets an empty range.
pub(super) fn offset(buf: &[u8], part: &[u8]) -> Range<usize> {
    if part.is_empty() {
        return 0..0;
    }
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}
