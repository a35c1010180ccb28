//! The fast path's HTTP/1 parser (`sluice_wire::h1`) against the path every request takes
//! today (hyper, the framing guard, the request checks and normalisation, the header rules),
//! over the corpus in `crates/sluice-wire/corpus/h1-requests.json`.
//!
//! Each case is sent, with a final `Connection: close` request behind it, to a real proxy in
//! front of a recording upstream, once on a listener with the default rules and once on one
//! that trusts the client's forwarding fields and allows `_` in names. On the same bytes the
//! fast path parses, frames and rewrites request after request until it defers one. Then:
//! * the case's first request is taken or deferred as the corpus says, and the proxy answers
//!   the statuses the corpus lists (so the corpus also pins down today's answers);
//! * every request the fast path took reached the upstream, in order, with the same method,
//!   target, fields (names compared case-insensitively, order kept within a name) and body;
//! * a body the fast path's chunked decoder refuses is one the proxy refuses too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use http::{HeaderName, HeaderValue};
use serde::Deserialize;
use sluice_wire::h1::{self, BodyFraming, Chunked, ClientIp, Forward, Parsed};
use sluice_wire::{EscapedSlashes, RequestRules, Underscores};
use support::wire::{assert_none_differ, Seen};
use support::{read_to_close, TestProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CORPUS: &str = include_str!("../../sluice-wire/corpus/h1-requests.json");

/// Sent behind every case: its answer closes the connection, so the exchange has an end.
const SENTINEL: &[u8] = b"GET /sentinel HTTP/1.1\r\nHost: end.test\r\nConnection: close\r\n\r\n";

/// The listeners' head limit (small, so the oversize case stays small).
const MAX_HEAD: usize = 4096;

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    /// `take` or `defer`: the fast path's verdict on the first request.
    fast: String,
    /// The statuses the proxy answers the case's requests with (the sentinel's not included).
    status: Vec<u16>,
    /// The bytes, one char per byte (U+0000 to U+00FF).
    bytes: String,
    /// What differs on the trusting listener, if anything.
    #[serde(default)]
    trusting: Option<Expected>,
}

#[derive(Debug, Deserialize)]
struct Expected {
    fast: String,
    status: Vec<u16>,
}

impl Case {
    /// The expected verdict and statuses on `listener`.
    fn expected(&self, listener: &str) -> (&str, &[u16]) {
        match (&self.trusting, listener) {
            (Some(e), "trusting") => (&e.fast, &e.status),
            _ => (&self.fast, &self.status),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let byte = |c: char| u8::try_from(u32::from(c)).expect("corpus chars are bytes");
        self.bytes.chars().map(byte).collect()
    }
}

/// Reads one request head from `bytes` (well-formed: written by hyper's client or by
/// `h1::write_head`) into comparable form, with the body framing it announces.
fn read_head(bytes: &[u8]) -> Option<(Seen, usize, BodyFraming)> {
    let mut storage = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut storage);
    let httparse::Status::Complete(len) = req.parse(bytes).ok()? else {
        return None;
    };
    let mut fields: Vec<(String, Vec<u8>)> = req
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
        .collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let value = |name: &str| fields.iter().find(|f| f.0 == name).map(|f| f.1.clone());
    let framing = match (value("transfer-encoding"), value("content-length")) {
        (Some(_), _) => BodyFraming::Chunked,
        (None, Some(n)) => BodyFraming::Length(std::str::from_utf8(&n).ok()?.parse().ok()?),
        (None, None) => BodyFraming::None,
    };
    let seen = Seen {
        method: req.method?.to_owned(),
        target: req.path?.to_owned(),
        fields,
        body: Vec::new(),
    };
    Some((seen, len, framing))
}

/// Decodes the body at the start of `bytes`: (body, bytes used), `None` if incomplete.
/// Independent of `h1::Chunked` on purpose: it reads only hyper's own well-formed output.
fn read_body(bytes: &[u8], framing: BodyFraming) -> Option<(Vec<u8>, usize)> {
    match framing {
        BodyFraming::None => Some((Vec::new(), 0)),
        BodyFraming::Length(n) => {
            let n = usize::try_from(n).ok()?;
            (bytes.len() >= n).then(|| (bytes[..n].to_vec(), n))
        }
        BodyFraming::Chunked => {
            let (mut body, mut at) = (Vec::new(), 0);
            loop {
                let line_end = at + bytes[at..].windows(2).position(|w| w == b"\r\n")?;
                let size = std::str::from_utf8(&bytes[at..line_end]).ok()?;
                let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
                at = line_end + 2;
                if size == 0 {
                    let end = at + bytes[at..].windows(2).position(|w| w == b"\r\n")?;
                    // Trailer fields, if any, then the empty line.
                    let trailers_end = if end == at {
                        at + 2
                    } else {
                        at + bytes[at..].windows(4).position(|w| w == b"\r\n\r\n")? + 4
                    };
                    return Some((body, trailers_end));
                }
                body.extend_from_slice(bytes.get(at..at + size)?);
                at += size + 2;
            }
        }
    }
}

/// An upstream that records every request it reads whole and answers 200 with the target.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    async fn start() -> (Self, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let recorder = Self::default();
        let this = recorder.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(this.clone().serve(stream));
            }
        });
        (recorder, addr)
    }

    fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn since(&self, from: usize) -> Vec<Seen> {
        self.seen.lock().unwrap()[from..].to_vec()
    }

    async fn serve(self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            while let Some((seen, used)) = next_request(&buf) {
                buf.drain(..used);
                // The target as the body, so the client can tell the sentinel's answer; none
                // for HEAD, whose answer the client reads without one.
                let body = if seen.method == "HEAD" {
                    ""
                } else {
                    &seen.target
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                self.seen.lock().unwrap().push(seen);
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

/// A whole request at the start of `buf` and the bytes it used.
fn next_request(buf: &[u8]) -> Option<(Seen, usize)> {
    let (mut seen, head, framing) = read_head(buf)?;
    let (body, used) = read_body(&buf[head..], framing)?;
    seen.body = body;
    Some((seen, head + used))
}

/// What the fast path makes of a connection's bytes: the requests it forwards, then whether
/// it deferred (rather than stopping at the end, a close or a refused body).
#[derive(Debug, Default)]
struct Fast {
    forwarded: Vec<Seen>,
    first: Option<&'static str>,
    body_refused: bool,
}

fn fast_path(bytes: &[u8], rules: RequestRules, fwd: &Forward<'_>) -> Fast {
    let mut fast = Fast::default();
    let mut at = 0;
    while at < bytes.len() {
        let head = match h1::parse_request(&bytes[at..], MAX_HEAD, rules) {
            Parsed::Take(head) => head,
            Parsed::Defer(_) | Parsed::Partial => {
                fast.first.get_or_insert("defer");
                return fast;
            }
        };
        fast.first.get_or_insert("take");
        let mut out = Vec::new();
        h1::write_head(&bytes[at..], &head, fwd, &mut out);
        let (mut seen, _, _) = read_head(&out).expect("the fast path writes a valid head");
        at += head.len;
        let Some((body, used)) = decode_body(&bytes[at..], head.body) else {
            fast.body_refused = true;
            return fast;
        };
        seen.body = body;
        at += used;
        fast.forwarded.push(seen);
        if !head.keep_alive {
            break;
        }
    }
    fast
}

/// The body by the fast path's own framing: `None` when the chunked decoder refuses it.
fn decode_body(bytes: &[u8], framing: BodyFraming) -> Option<(Vec<u8>, usize)> {
    let BodyFraming::Chunked = framing else {
        return read_body(bytes, framing);
    };
    let (mut chunked, mut body, mut at) = (Chunked::new(MAX_HEAD), Vec::new(), 0);
    while !chunked.is_done() {
        let progress = chunked.feed(&bytes[at..]).ok()?;
        body.extend_from_slice(&bytes[at..][progress.data]);
        at += progress.consumed;
        if progress.consumed == 0 {
            return None;
        }
    }
    Some((body, at))
}

/// The statuses of the responses in `raw`, and whether the last answered the sentinel.
fn statuses(raw: &[u8]) -> (Vec<u16>, bool) {
    let (mut codes, mut at, mut sentinel) = (Vec::new(), 0, false);
    while at < raw.len() {
        let mut storage = [httparse::EMPTY_HEADER; 32];
        let mut res = httparse::Response::new(&mut storage);
        let Ok(httparse::Status::Complete(len)) = res.parse(&raw[at..]) else {
            panic!(
                "unreadable response at {at}: {:?}",
                String::from_utf8_lossy(raw)
            );
        };
        let code = res.code.unwrap();
        let length = res
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .map_or(0, |h| {
                std::str::from_utf8(h.value).unwrap().parse().unwrap()
            });
        let body = &raw[at + len..(at + len + length).min(raw.len())];
        at += len + length;
        if code == 100 {
            continue;
        }
        sentinel = body == b"/sentinel";
        codes.push(code);
    }
    if sentinel {
        codes.pop();
    }
    (codes, sentinel)
}

/// One listener's rules and how the fast path forwards for it.
struct Listener {
    name: &'static str,
    addr: SocketAddr,
    rules: RequestRules,
    trusted: bool,
}

const CONFIG: &str = r#"
[[listener]]
name = "plain"
listen = "127.0.0.1:0"
max_header_size = "4KiB"

[[listener]]
name = "trusting"
listen = "127.0.0.1:0"
max_header_size = "4KiB"
trusted_proxies = ["127.0.0.0/8"]
underscores_in_headers = "allow"
escaped_slashes = "keep"

[[route]]
cluster = "backend"
request_headers = { set = { "x-edited" = "proxy" }, remove = ["x-remove-me"] }

[cluster.backend]
kind = "static"
endpoints = ["UPSTREAM"]
"#;

#[tokio::test]
async fn the_fast_path_forwards_what_the_proxy_forwards() {
    let cases: Vec<Case> = serde_json::from_str(CORPUS).expect("the corpus parses");
    let (recorder, upstream) = Recorder::start().await;
    let proxy = TestProxy::start(&CONFIG.replace("UPSTREAM", &upstream.to_string())).await;
    let listeners = [
        Listener {
            name: "plain",
            addr: proxy.addrs[0].1,
            rules: RequestRules::default(),
            trusted: false,
        },
        Listener {
            name: "trusting",
            addr: proxy.addrs[1].1,
            rules: RequestRules {
                escaped_slashes: EscapedSlashes::Keep,
                underscores_in_headers: Underscores::Allow,
            },
            trusted: true,
        },
    ];
    let set = [(
        HeaderName::from_static("x-edited"),
        HeaderValue::from_static("proxy"),
    )];
    let remove = [HeaderName::from_static("x-remove-me")];
    let mut failures = Vec::new();
    let mut taken = 0;
    let client = ClientIp::new(IpAddr::from([127, 0, 0, 1]));
    for case in &cases {
        for listener in &listeners {
            let fwd = Forward {
                target: None,
                client: &client,
                tls: false,
                trusted: listener.trusted,
                remove: &remove,
                set: &set,
                stamps: &[],
            };
            let outcome = run(case, listener, &fwd, &recorder).await;
            taken += usize::from(outcome.is_ok() && case.expected(listener.name).0 == "take");
            if let Err(why) = outcome {
                failures.push(format!("{} on {}: {why}", case.name, listener.name));
            }
        }
    }
    assert_none_differ(&failures, 2 * cases.len());
    assert!(taken >= 2 * 40, "the fast path took only {taken} runs");
}

/// Runs one case through the proxy and the fast path; says how they differ.
async fn run(
    case: &Case,
    listener: &Listener,
    fwd: &Forward<'_>,
    recorder: &Recorder,
) -> Result<(), String> {
    let bytes = case.bytes();
    let before = recorder.len();
    let mut stream = TcpStream::connect(listener.addr).await.unwrap();
    stream.write_all(&bytes).await.unwrap();
    stream.write_all(SENTINEL).await.unwrap();
    let raw = read_to_close(&mut stream).await;
    let (codes, _) = statuses(raw.as_bytes());
    let upstream = recorder.since(before);

    let mut input = bytes.clone();
    input.extend_from_slice(SENTINEL);
    let fast = fast_path(&input, listener.rules, fwd);
    let (verdict, status) = case.expected(listener.name);
    let mut why = Vec::new();
    if fast.first != Some(verdict) {
        why.push(format!("fast path: {:?}, corpus: {verdict}", fast.first));
    }
    if codes != status {
        why.push(format!("proxy answered {codes:?}, corpus: {status:?}"));
    }
    let n = fast.forwarded.len();
    if upstream.get(..n) != Some(&fast.forwarded[..]) {
        why.push(format!(
            "upstream saw {upstream:#?}\nfast path sends {:#?}",
            fast.forwarded
        ));
    }
    if fast.body_refused && codes.iter().take(n + 1).all(|c| *c < 400) {
        why.push(format!(
            "the fast path refuses a body the proxy took: {codes:?}"
        ));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}
