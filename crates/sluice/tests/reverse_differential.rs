//! Reverse sessions on the two HTTP/1 paths side by side: one proxy, one reverse cluster, two
//! listeners, one with the fast path (the session's socket driven by the client connection's
//! task) and one without (hyper's client on the session). Over the corpora in
//! `crates/sluice-wire/corpus/`:
//! * every request case, with a final `Connection: close` request behind it, gets the same
//!   statuses on both listeners, and the service receives the same requests (method, target,
//!   fields, body; `Sluice-Client-Addr` once, with the client's address);
//! * every response case, answered by a service on a fresh session, reaches the client the
//!   same (status line, fields but `Date`'s value, body, cut short or not).
//!
//! `h1_differential.rs` and `h1_responses.rs` hold the parsers and writers to hyper's over
//! static upstreams; this holds what is proper to sessions (the stamped client address, the
//! read-ahead and the framing it chooses) to the hyper path's. Under `SLUICE_FAST_PATH=0` both
//! listeners are hyper's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;
use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reverse_support::service::dial;
use reverse_support::ServiceSpec;
use serde::Deserialize;
use sluice::ReverseCluster;
use support::wire::{assert_none_differ, read_response, Got, Seen};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const REQUESTS: &str = include_str!("../../sluice-wire/corpus/h1-requests.json");
const RESPONSES: &str = include_str!("../../sluice-wire/corpus/h1-responses.json");

/// Sent behind every request case: its answer closes the connection, so the exchange has an
/// end.
const SENTINEL: &[u8] = b"GET /sentinel HTTP/1.1\r\nHost: end.test\r\nConnection: close\r\n\r\n";

const CONFIG: &str = r#"
[acceptor]
listen = "127.0.0.1:0"
handshakes_per_second = 0

[[listener]]
name = "fast"
listen = "127.0.0.1:0"
max_header_size = "4KiB"

[[listener]]
name = "hyper"
listen = "127.0.0.1:0"
max_header_size = "4KiB"
fast_path = false

[[route]]
cluster = "api"
request_headers = { set = { "x-edited" = "proxy" }, remove = ["x-remove-me"] }

[cluster.api]
kind = "reverse"
"#;

/// A case of either corpus: its name, its bytes (one char per byte), and for a response case
/// the method it answers.
#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    bytes: String,
    #[serde(default)]
    method: Option<String>,
}

impl Case {
    fn bytes(&self) -> Vec<u8> {
        let byte = |c: char| u8::try_from(u32::from(c)).expect("corpus chars are bytes");
        self.bytes.chars().map(byte).collect()
    }
}

/// The proxy: its two listeners, its acceptor and its cluster.
struct Both {
    fast: SocketAddr,
    hyper: SocketAddr,
    acceptor: SocketAddr,
    cluster: ReverseCluster,
}

async fn start() -> Both {
    let config = sluice::config::parse_str(CONFIG, "both.toml", Path::new(".")).unwrap();
    let proxy = sluice::Proxy::bind(&config).await.unwrap();
    let addr = |name: &str| {
        let addrs = proxy.local_addrs();
        addrs.iter().find(|(n, _)| n == name).unwrap().1
    };
    let both = Both {
        fast: addr("fast"),
        hyper: addr("hyper"),
        acceptor: proxy.acceptor_addr().unwrap(),
        cluster: proxy.reverse_cluster("api").unwrap().clone(),
    };
    tokio::spawn(proxy.run_until(std::future::pending()));
    both
}

impl Both {
    /// Waits (at most a few seconds) until the cluster's state satisfies `done`.
    async fn until(&self, what: &str, done: impl Fn(&ReverseCluster) -> bool) {
        let wait = self.cluster.wait_until(done);
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }
}

/// Sends `bytes` on a new connection and reads until the proxy closes it (or 5 s pass).
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut received = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            received.extend_from_slice(&buf[..n]);
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    received
}

/// A service whose sessions record every request and answer `200 ok`.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    /// Keeps `sessions` sessions registered: one that closes (an upgrade that was declined,
    /// an answer that retires it) is dialed again.
    async fn start(acceptor: SocketAddr, sessions: usize) -> Self {
        let recorder = Self::default();
        for _ in 0..sessions {
            let recorder = recorder.clone();
            tokio::spawn(async move {
                loop {
                    let reg = ServiceSpec::new("a", 1).registration();
                    let (stream, status) = dial(acceptor, &reg).await;
                    assert_eq!(status, 101);
                    recorder.clone().serve(stream).await;
                }
            });
        }
        recorder
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }

    async fn serve(self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            while let Some((seen, used)) = read_request(&buf) {
                buf.drain(..used);
                self.seen.lock().unwrap().push(seen);
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if stream.write_all(ok).await.is_err() {
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

/// One whole request at the start of `bytes` (well-formed: written by one of the paths), and
/// how many bytes it took.
/// `Sluice-Client-Addr` is checked to be the client's and replaced by a placeholder (each
/// connection has its own port).
fn read_request(bytes: &[u8]) -> Option<(Seen, usize)> {
    let mut storage = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut storage);
    let httparse::Status::Complete(len) = req.parse(bytes).ok()? else {
        return None;
    };
    let mut fields: Vec<(String, Vec<u8>)> = Vec::new();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = if name == sluice_session::HEADER_CLIENT_ADDR {
            let addr = sluice_session::parse_client_addr(h.value);
            assert!(
                addr.is_some_and(|a| a.ip().is_loopback()),
                "not the client's address: {:?}",
                String::from_utf8_lossy(h.value)
            );
            b"<client>".to_vec()
        } else {
            h.value.to_vec()
        };
        fields.push((name, value));
    }
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let value = |name: &str| fields.iter().find(|f| f.0 == name).map(|f| f.1.clone());
    let rest = &bytes[len..];
    let (body, used) = if value("transfer-encoding").is_some() {
        read_chunked(rest)?
    } else if let Some(n) = value("content-length") {
        let n: usize = std::str::from_utf8(&n).ok()?.parse().ok()?;
        (rest.get(..n)?.to_vec(), n)
    } else {
        (Vec::new(), 0)
    };
    let seen = Seen {
        method: req.method?.to_owned(),
        target: req.path?.to_owned(),
        fields,
        body,
    };
    Some((seen, len + used))
}

/// A well-formed chunked body at the start of `bytes`: its data (trailer lines appended after
/// a `|`, so that they are compared too) and where it ends; `None` while incomplete.
fn read_chunked(bytes: &[u8]) -> Option<(Vec<u8>, usize)> {
    let line = |at: usize| {
        let end = at + bytes.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        Some((&bytes[at..end], end + 2))
    };
    let (mut body, mut at) = (Vec::new(), 0);
    loop {
        let (size, next) = line(at)?;
        let size = std::str::from_utf8(size).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        at = next;
        if size == 0 {
            break;
        }
        body.extend_from_slice(bytes.get(at..at + size)?);
        at += size + 2;
    }
    loop {
        let (trailer, next) = line(at)?;
        at = next;
        if trailer.is_empty() {
            return Some((body, at));
        }
        body.push(b'|');
        body.extend_from_slice(trailer);
    }
}

/// The statuses of the answers in `bytes`, in order (bodies by `Content-Length` or chunked).
fn statuses(mut bytes: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    loop {
        let mut storage = [httparse::EMPTY_HEADER; 128];
        let mut res = httparse::Response::new(&mut storage);
        let Ok(httparse::Status::Complete(len)) = res.parse(bytes) else {
            return out;
        };
        out.push(res.code.unwrap());
        let header = |name: &str| {
            res.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value)
        };
        let rest = &bytes[len..];
        let used = if header("transfer-encoding").is_some() {
            read_chunked(rest).map_or(rest.len(), |(_, used)| used)
        } else {
            let n =
                header("content-length").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
            n.unwrap_or(0usize).min(rest.len())
        };
        bytes = &rest[used..];
    }
}

/// What the two listeners got for a case, when it differs.
fn differ<T: std::fmt::Debug + PartialEq>(case: &str, got: &[T]) -> Option<String> {
    (got[0] != got[1]).then(|| format!("{case}:\n  fast  {:?}\n  hyper {:?}", got[0], got[1]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_a_service_alike_on_both_paths() {
    let cases: Vec<Case> = serde_json::from_str(REQUESTS).expect("the corpus parses");
    let proxy = start().await;
    let recorder = Recorder::start(proxy.acceptor, 2).await;
    proxy
        .until("two idle sessions", |c| c.idle_sessions("default") == 2)
        .await;
    let mut failures = Vec::new();
    for case in &cases {
        let mut bytes = case.bytes();
        bytes.extend_from_slice(SENTINEL);
        let mut got = Vec::new();
        for addr in [proxy.fast, proxy.hyper] {
            let answers = exchange(addr, &bytes).await;
            // The service has recorded a request before it answered it.
            got.push((statuses(&answers), recorder.take()));
            let back = format!("the sessions back after {}", case.name);
            proxy
                .until(&back, |c| c.idle_sessions("default") == 2)
                .await;
        }
        failures.extend(differ(&case.name, &got));
    }
    assert_none_differ(&failures, cases.len());
}

/// Registers a session that answers one request with `answer`, then closes.
async fn answer_once(proxy: &Both, answer: Vec<u8>) {
    proxy.until("no sessions", |c| c.sessions() == 0).await;
    let (mut session, status) =
        dial(proxy.acceptor, &ServiceSpec::new("a", 1).registration()).await;
    assert_eq!(status, 101);
    tokio::spawn(async move {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match session.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let _ = session.write_all(&answer).await;
        let _ = session.shutdown().await;
        // Until the proxy lets go, so that nothing it still reads is cut off by a reset.
        let _ = session.read_to_end(&mut buf).await;
    });
    proxy
        .until("the session idle", |c| c.idle_sessions("default") == 1)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_reach_the_client_alike_on_both_paths() {
    let cases: Vec<Case> = serde_json::from_str(RESPONSES).expect("the corpus parses");
    let proxy = start().await;
    let mut failures = Vec::new();
    for case in &cases {
        let method = case.method.as_deref().unwrap_or("GET");
        let request = format!("{method} /r HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut got: Vec<Got> = Vec::new();
        for addr in [proxy.fast, proxy.hyper] {
            answer_once(&proxy, case.bytes()).await;
            let answer = exchange(addr, request.as_bytes()).await;
            got.push(read_response(&answer, method == "HEAD"));
        }
        failures.extend(differ(&case.name, &got));
    }
    assert_none_differ(&failures, cases.len());
}
