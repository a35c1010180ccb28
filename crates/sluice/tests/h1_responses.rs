//! The fast path's HTTP/1 response parser and writer (`sluice_wire::h1`) against the path every
//! response takes today (hyper's client, the proxy's header rules, hyper's server), over the
//! corpus in `crates/sluice-wire/corpus/h1-responses.json`.
//!
//! Each case is the whole answer of an upstream, sent to a request through a real proxy on a
//! fresh upstream connection that closes after it. On the same bytes the fast path parses the
//! head, writes the head it would send the client and decodes the body. Then:
//! * the fast path forwards, refuses (502) or refuses the body of the case as the corpus says,
//!   and the proxy answers the status the corpus lists;
//! * what the client got and what the fast path would send have the same status line, the
//!   same fields (names compared case-insensitively, order kept within a name; only the
//!   `Date` value may differ) and the same body;
//! * a body the fast path's decoder refuses reaches the client cut short.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use serde::Deserialize;
use sluice_wire::h1::{self, Answer, Chunked, ParsedResponse, ResponseBody};
use support::wire::{assert_none_differ, read_response, Got};
use support::TestProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CORPUS: &str = include_str!("../../sluice-wire/corpus/h1-responses.json");

/// hyper's client buffer limit, which bounds a response head.
const MAX_HEAD: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    /// `GET` or `HEAD`.
    method: String,
    /// `forward`, `invalid` (502) or `body-refused`.
    fast: String,
    /// The status the client gets.
    status: u16,
    /// The upstream's bytes, one char per byte (U+0000 to U+00FF).
    bytes: String,
}

impl Case {
    fn bytes(&self) -> Vec<u8> {
        let byte = |c: char| u8::try_from(u32::from(c)).expect("corpus chars are bytes");
        self.bytes.chars().map(byte).collect()
    }
}

/// What the fast path sends the client for `upstream`'s answer, or why it refuses it.
fn fast_path(upstream: &[u8], head_request: bool, edits: &Edits) -> Result<Got, &'static str> {
    let head = match h1::parse_response(upstream, head_request, MAX_HEAD) {
        ParsedResponse::Head(head) => head,
        ParsedResponse::Invalid(_) => return Err("invalid"),
        ParsedResponse::Partial => return Err("partial"),
    };
    let answer = Answer {
        head_request,
        close: true,
        date: b"Tue, 24 Nov 2026 00:00:00 GMT",
        remove: &edits.remove,
        set: &edits.set,
        append: b"",
        listener: &[],
    };
    let mut out = Vec::new();
    h1::write_response_head(upstream, &head, &answer, &mut out);
    let rest = &upstream[head.len..];
    let body = match head.body {
        ResponseBody::None => Vec::new(),
        ResponseBody::Length(n) => rest[..usize::try_from(n).unwrap()].to_vec(),
        ResponseBody::UntilClose => rest.to_vec(),
        ResponseBody::Chunked => decode(rest).ok_or("body-refused")?,
    };
    // Re-framed as the written head says: by length, or chunked (one chunk suffices here).
    if !head.ends_with_close()
        && (head.body == ResponseBody::Chunked || head.body == ResponseBody::UntilClose)
    {
        if !head_request && !matches!(head.status, 204 | 304) {
            if !body.is_empty() {
                out.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
                out.extend_from_slice(&body);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
        }
    } else {
        out.extend_from_slice(&body);
    }
    Ok(read_response(&out, head_request))
}

/// The body by the fast path's chunked decoder: `None` when it refuses it.
fn decode(bytes: &[u8]) -> Option<Vec<u8>> {
    let (mut chunked, mut body, mut at) = (Chunked::new(MAX_HEAD), Vec::new(), 0);
    while !chunked.is_done() {
        let progress = chunked.feed(&bytes[at..]).ok()?;
        if progress.consumed == 0 {
            return None;
        }
        body.extend_from_slice(&bytes[at..][progress.data]);
        at += progress.consumed;
    }
    Some(body)
}

struct Edits {
    remove: Vec<HeaderName>,
    set: Vec<(HeaderName, HeaderValue)>,
}

/// An upstream that answers `GET /r/<i>` with case `i`'s bytes, then closes.
async fn upstream(cases: Arc<Vec<Vec<u8>>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer(stream, Arc::clone(&cases)));
        }
    });
    addr
}

async fn answer(mut stream: TcpStream, cases: Arc<Vec<Vec<u8>>>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head);
    let index: usize = text
        .split_whitespace()
        .nth(1)
        .and_then(|t| t.strip_prefix("/r/"))
        .and_then(|i| i.parse().ok())
        .expect("a case's request");
    let _ = stream.write_all(&cases[index]).await;
    let _ = stream.shutdown().await;
    // Until the proxy closes too, so that nothing it sends is met with a reset.
    let _ = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut Vec::new())).await;
}

/// Reads until the proxy closes (bounded, so a connection left open fails the test).
async fn read_all(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "connection still open; got {:?}",
        String::from_utf8_lossy(&out)
    );
    out
}

const CONFIG: &str = r#"
[[listener]]
name = "plain"
listen = "127.0.0.1:0"

[[route]]
cluster = "backend"
response_headers = { set = { "x-served-by" = "sluice" }, remove = ["server"] }

[cluster.backend]
kind = "static"
endpoints = ["UPSTREAM"]
"#;

#[tokio::test]
async fn the_fast_path_answers_what_the_proxy_answers() {
    let cases: Vec<Case> = serde_json::from_str(CORPUS).expect("the corpus parses");
    let bytes = Arc::new(cases.iter().map(Case::bytes).collect::<Vec<_>>());
    let addr = upstream(Arc::clone(&bytes)).await;
    let proxy = TestProxy::start(&CONFIG.replace("UPSTREAM", &addr.to_string())).await;
    let edits = Edits {
        remove: vec![HeaderName::from_static("server")],
        set: vec![(
            HeaderName::from_static("x-served-by"),
            HeaderValue::from_static("sluice"),
        )],
    };
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        if let Err(why) = run(i, case, &bytes[i], proxy.addr(), &edits).await {
            failures.push(format!("{}: {why}", case.name));
        }
    }
    assert_none_differ(&failures, cases.len());
}

/// Runs case `i` through the proxy and the fast path; says how they differ.
async fn run(
    i: usize,
    case: &Case,
    upstream: &[u8],
    proxy: SocketAddr,
    edits: &Edits,
) -> Result<(), String> {
    let head_request = case.method == "HEAD";
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!(
        "{} /r/{i} HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        case.method
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let raw = read_all(&mut stream).await;
    let got = read_response(&raw, head_request);
    let fast = fast_path(upstream, head_request, edits);
    let verdict = match &fast {
        Ok(_) => "forward",
        Err(why) => why,
    };
    let mut why = Vec::new();
    if verdict != case.fast {
        why.push(format!("fast path: {verdict}, corpus: {}", case.fast));
    }
    if got.status != case.status {
        why.push(format!(
            "proxy answered {}, corpus: {}",
            got.status, case.status
        ));
    }
    match fast {
        Ok(sent) if sent != got => {
            why.push(format!("client got {got:?}\nfast path sends {sent:?}"));
        }
        Err("invalid") if got.status != 502 => why.push("the proxy forwarded it".into()),
        Err("body-refused") if got.body.is_some() => {
            why.push(format!("the proxy forwarded the whole body: {got:?}"));
        }
        _ => {}
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}
