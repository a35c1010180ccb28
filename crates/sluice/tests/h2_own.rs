//! The own HTTP/2 transport (`own_http2`) against hyper's (the `h2` crate), and its defences.
//!
//! * Differential: the same requests, sent by the `h2` crate's client to two listeners in
//!   front of one recording upstream (one listener on each transport), reach the upstream as
//!   the same bytes (the fields that differ by design normalised: the listener's port, the
//!   request's ID and trace) and get the same answers.
//! * Malformed requests (raw frames): each transport refuses them alike, none reaches the
//!   upstream; where the own transport is stricter than the `h2` crate, the case says so.
//! * Floods (rapid reset, MadeYouReset, CONTINUATION, SETTINGS, PING, empty DATA): the own
//!   transport ends the connection with ENHANCE_YOUR_CALM (or a bound) within a bounded count.
//! * A slow reader holds the upstream back (flow control reaches it), and then reads every
//!   byte.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use sluice_h2::frame::{self, flag, kind, Head, HEAD_LEN, PREFACE};
use sluice_h2::{hpack, Reason};
use support::TestProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An HTTP/1.1 upstream that records every request's bytes (head and body as they came) and
/// answers each with its body echoed and a field of its own.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Answer body bytes written so far (all connections).
    written: Arc<std::sync::atomic::AtomicUsize>,
}

impl Recorder {
    async fn start(response_body: Option<usize>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (record, count) = (Arc::clone(&seen), Arc::clone(&written));
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let recorded = (Arc::clone(&record), Arc::clone(&count));
                tokio::spawn(serve_recorded(conn, recorded, response_body));
            }
        });
        Self {
            addr,
            seen,
            written,
        }
    }

    fn taken(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// Where a recorder keeps the requests it saw, and counts the answer bytes it wrote.
type Records = (
    Arc<Mutex<Vec<Vec<u8>>>>,
    Arc<std::sync::atomic::AtomicUsize>,
);

/// A flood: the bytes of its `i`th repetition.
type Flood = Box<dyn Fn(u32) -> Vec<u8>>;

/// One upstream connection: request after request, each recorded whole.
async fn serve_recorded(
    mut conn: TcpStream,
    (seen, written): Records,
    response_body: Option<usize>,
) {
    let mut buf = Vec::new();
    loop {
        let Some((len, body_len)) = read_request(&mut conn, &mut buf).await else {
            return;
        };
        let request: Vec<u8> = buf.drain(..len + body_len).collect();
        let body = request[len..].to_vec();
        seen.lock().unwrap().push(request);
        let body = match response_body {
            Some(n) => vec![b'r'; n],
            None => body,
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Upstream: recorded\r\n\r\n",
            body.len()
        );
        if conn.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        for chunk in body.chunks(64 * 1024) {
            if conn.write_all(chunk).await.is_err() {
                return;
            }
            written.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Reads until `buf` holds a whole request: its head's length and its body's (a chunked body is
/// taken whole, as the bytes it came in).
async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize)> {
    loop {
        let mut storage = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut storage);
        if let Ok(httparse::Status::Complete(len)) = req.parse(buf) {
            let field = |name: &str| {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned())
            };
            let body = if let Some(n) = field("content-length") {
                Some(n.trim().parse::<usize>().unwrap())
            } else if field("transfer-encoding").is_some() {
                chunked_len(&buf[len..])
            } else {
                Some(0)
            };
            if let Some(body) = body.filter(|b| buf.len() >= len + b) {
                return Some((len, body));
            }
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The length of a whole chunked body (with its trailers) at the start of `bytes`, if it is
/// all there.
fn chunked_len(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let line_end = at + bytes[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&bytes[at..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // Trailers, then the empty line.
            loop {
                let end = at + bytes[at..].windows(2).position(|w| w == b"\r\n")?;
                let empty = end == at;
                at = end + 2;
                if empty {
                    return Some(at);
                }
            }
        }
        at += size + 2;
        if at > bytes.len() {
            return None;
        }
    }
}

/// Two listeners in front of `upstream`: hyper's HTTP/2 (first) and the own (second).
async fn both(upstream: SocketAddr, extra: &str) -> TestProxy {
    let toml = format!(
        r#"
[[listener]]
name = "hyper"
listen = "127.0.0.1:0"
own_http2 = false
{extra}

[[listener]]
name = "own"
listen = "127.0.0.1:0"
own_http2 = true
{extra}

[[route]]
cluster = "backend"

[cluster.backend]
kind = "static"
endpoints = ["{upstream}"]
"#
    );
    TestProxy::start(&toml).await
}

/// A recorded request with what differs by design between two listeners made equal: the
/// listener's port (in `Forwarded`/`X-Forwarded-*`), the request's ID, its trace.
fn normalised(request: &[u8], ports: &[u16]) -> String {
    let text = String::from_utf8_lossy(request).into_owned();
    let mut lines: Vec<String> = Vec::new();
    for line in text.split("\r\n") {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("x-request-id:") || lower.starts_with("traceparent:") {
            continue;
        }
        let mut line = line.to_string();
        for port in ports {
            line = line.replace(&port.to_string(), "PORT");
        }
        lines.push(line);
    }
    lines.join("\r\n")
}

/// The cases of the differential: what the `h2` crate's client sends.
fn requests(authority: &str) -> Vec<Request<Full<Bytes>>> {
    let uri = |path: &str| format!("http://{authority}{path}");
    let get = |path: &str| Request::get(uri(path)).body(Full::default()).unwrap();
    vec![
        get("/"),
        get("/a/b?x=1&y=%20z"),
        Request::get(uri("/fields"))
            .header("accept", "text/html")
            .header("x-many", "one")
            .header("x-many", "two")
            .header("user-agent", "differential/1")
            .body(Full::default())
            .unwrap(),
        Request::post(uri("/upload"))
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::from(vec![7u8; 100_000])))
            .unwrap(),
        Request::put(uri("/small"))
            .header("content-length", "5")
            .body(Full::new(Bytes::from_static(b"hello")))
            .unwrap(),
        Request::delete(uri("/thing"))
            .body(Full::default())
            .unwrap(),
        Request::head(uri("/head")).body(Full::default()).unwrap(),
        Request::options(uri("/opts"))
            .body(Full::default())
            .unwrap(),
    ]
}

/// The same requests through both transports reach the upstream as the same bytes and get
/// the same answers.
#[tokio::test]
async fn both_transports_send_the_same_upstream_bytes_and_answers() {
    let upstream = Recorder::start(None).await;
    let proxy = both(upstream.addr, "").await;
    let ports: Vec<u16> = proxy.addrs.iter().map(|(_, a)| a.port()).collect();
    let mut outcomes = Vec::new();
    for (_, addr) in &proxy.addrs {
        let mut sender = support::h2_connect(*addr).await;
        let mut answers = Vec::new();
        for req in requests("differential.test") {
            let res = sender.send_request(req).await.expect("request failed");
            let status = res.status();
            let mut fields: Vec<(String, String)> = res
                .headers()
                .iter()
                .filter(|(n, _)| *n != "date")
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
                .collect();
            fields.sort();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            answers.push((status, fields, body));
        }
        let seen: Vec<String> = upstream
            .taken()
            .iter()
            .map(|r| normalised(r, &ports))
            .collect();
        outcomes.push((answers, seen));
    }
    let (hyper, own) = (&outcomes[0], &outcomes[1]);
    assert_eq!(
        hyper.1.len(),
        requests("x").len(),
        "every request reached the upstream"
    );
    for (i, (a, b)) in hyper.1.iter().zip(&own.1).enumerate() {
        assert_eq!(a, b, "request {i} reached the upstream differently");
    }
    assert_eq!(hyper.0, own.0, "the answers differ");
    assert_eq!(own.0[3].2.len(), 100_000, "the upload came back whole");
}

/// A raw HTTP/2 client: frames written by hand, read back as they come.
struct Raw {
    conn: TcpStream,
    buf: Vec<u8>,
}

/// What a raw exchange ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// An answer with this status.
    Status(u16),
    /// RST_STREAM with this code.
    Reset(u32),
    /// GOAWAY with this code.
    GoAway(u32),
    /// The connection closed with neither.
    Closed,
}

impl Raw {
    async fn connect(addr: SocketAddr, settings: &[(u16, u32)]) -> Self {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let mut out = PREFACE.to_vec();
        frame::write_settings(&mut out, false, settings);
        conn.write_all(&out).await.unwrap();
        Self {
            conn,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.conn.write_all(bytes).await
    }

    /// The next frame (its head and payload); `None` at the end of the connection.
    async fn frame(&mut self) -> Option<(Head, Vec<u8>)> {
        loop {
            if let Some(head) = Head::parse(&self.buf) {
                let end = HEAD_LEN + head.len as usize;
                if self.buf.len() >= end {
                    let payload = self.buf[HEAD_LEN..end].to_vec();
                    self.buf.drain(..end);
                    return Some((head, payload));
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads until stream `id` is answered, reset, or the connection goes away (SETTINGS, PING
    /// and WINDOW_UPDATE frames skipped, SETTINGS acknowledged).
    async fn outcome(&mut self, id: u32) -> Outcome {
        let read = async {
            while let Some((head, payload)) = self.frame().await {
                match head.kind {
                    kind::HEADERS if head.stream == id => {
                        let mut status = 0;
                        hpack::Decoder::default()
                            .decode(&payload, |n, v| {
                                if n == b":status" {
                                    status = std::str::from_utf8(v).unwrap().parse().unwrap();
                                }
                            })
                            .unwrap();
                        return Outcome::Status(status);
                    }
                    kind::RST_STREAM if head.stream == id => {
                        return Outcome::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap()))
                    }
                    kind::GOAWAY => {
                        return Outcome::GoAway(u32::from_be_bytes(
                            payload[4..8].try_into().unwrap(),
                        ))
                    }
                    kind::SETTINGS if !head.has(flag::ACK) => {
                        let mut ack = Vec::new();
                        frame::write_settings(&mut ack, true, &[]);
                        let _ = self.conn.write_all(&ack).await;
                    }
                    _ => {}
                }
            }
            Outcome::Closed
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("no outcome within 10 s")
    }
}

/// A header block of `fields`, literal (the decoder's dynamic table untouched).
fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        hpack::encode_field(&mut out, name, value.as_bytes(), false);
    }
    out
}

fn headers(id: u32, fields: &[(&str, &str)], end_stream: bool) -> Vec<u8> {
    let mut out = Vec::new();
    frame::write_headers(
        &mut out,
        id,
        &block(fields),
        end_stream,
        frame::DEFAULT_MAX_FRAME,
    );
    out
}

const GET: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":authority", "raw.test"),
    (":path", "/"),
];

/// A request that breaks a rule of RFC 9113 §8: each transport resets its stream (or, where
/// the `h2` crate answers 400 instead, the own transport is allowed its reset) and none of
/// them reaches the upstream.
#[tokio::test]
async fn malformed_requests_are_refused_by_both_and_never_reach_the_upstream() {
    let upstream = Recorder::start(None).await;
    let proxy = both(upstream.addr, "").await;
    let with = |extra: (&'static str, &'static str)| {
        let mut fields = GET.to_vec();
        fields.push(extra);
        fields
    };
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("an uppercase name", with(("X-Upper", "1"))),
        (
            "a connection-specific field",
            with(("connection", "keep-alive")),
        ),
        ("transfer-encoding", with(("transfer-encoding", "chunked"))),
        ("TE other than trailers", with(("te", "gzip"))),
        ("an unknown pseudo-field", with((":protocol", "websocket"))),
        ("a response pseudo-field", with((":status", "200"))),
        ("no :path", GET[..3].to_vec()),
        ("no :method", GET[1..].to_vec()),
        (
            "a pseudo-field after a regular one",
            vec![
                (":method", "GET"),
                (":scheme", "http"),
                ("x-a", "1"),
                (":authority", "raw.test"),
                (":path", "/"),
            ],
        ),
        (
            "an empty :path",
            vec![(":method", "GET"), (":scheme", "http"), (":path", "")],
        ),
        ("a duplicated :method", with((":method", "POST"))),
    ];
    for (name, fields) in &cases {
        let mut outcomes = Vec::new();
        for (_, addr) in &proxy.addrs {
            let mut raw = Raw::connect(*addr, &[]).await;
            raw.send(&headers(1, fields, true)).await.unwrap();
            outcomes.push(raw.outcome(1).await);
        }
        // The `h2` crate resets the stream, answers 400, or (an uppercase name) ends the
        // connection with PROTOCOL_ERROR.
        let refused = |o: &Outcome| {
            matches!(
                o,
                Outcome::Reset(1) | Outcome::Status(400) | Outcome::GoAway(1)
            )
        };
        assert!(
            refused(&outcomes[0]),
            "{name}: hyper's transport: {:?}",
            outcomes[0]
        );
        assert_eq!(
            outcomes[1],
            Outcome::Reset(Reason::PROTOCOL_ERROR.0),
            "{name}: the own transport"
        );
    }
    assert!(
        upstream.taken().is_empty(),
        "a malformed request reached the upstream"
    );
}

/// Content-length that the DATA frames do not match is malformed (RFC 9113 §8.1.1): the
/// stream is reset and the upstream never gets a request whose body it was promised wrongly
/// as a whole one.
#[tokio::test]
async fn a_body_longer_or_shorter_than_its_content_length_is_refused() {
    let upstream = Recorder::start(None).await;
    let proxy = both(upstream.addr, "").await;
    let own = proxy.addrs[1].1;
    for (declared, sent) in [("3", b"four".as_slice()), ("5", b"four".as_slice())] {
        let mut raw = Raw::connect(own, &[]).await;
        let mut fields = GET.to_vec();
        fields[0] = (":method", "POST");
        fields.push(("content-length", declared));
        let mut out = headers(1, &fields, false);
        frame::write_data(&mut out, 1, sent, true);
        raw.send(&out).await.unwrap();
        assert_eq!(
            raw.outcome(1).await,
            Outcome::Reset(Reason::PROTOCOL_ERROR.0),
            "content-length {declared}, {} bytes sent",
            sent.len()
        );
    }
}

/// Each flood the probes ran ends the connection with ENHANCE_YOUR_CALM (or, CONTINUATION, a
/// bound on the header block) long before the flood does; the upstream sees at most a few of
/// the requests a rapid reset opens.
#[tokio::test]
async fn floods_end_the_connection_with_enhance_your_calm() {
    let upstream = Recorder::start(None).await;
    let proxy = both(upstream.addr, "").await;
    let own = proxy.addrs[1].1;
    let calm = Reason::ENHANCE_YOUR_CALM.0;
    let floods: Vec<(&str, Flood)> = vec![
        (
            "rapid reset",
            Box::new(|i| {
                let id = 2 * i + 1;
                let mut out = headers(id, GET, true);
                frame::write_reset(&mut out, id, Reason::CANCEL);
                out
            }),
        ),
        (
            "MadeYouReset (WINDOW_UPDATE 0 on an open stream)",
            Box::new(|i| {
                let id = 2 * i + 1;
                let mut out = headers(id, GET, false);
                frame::write_head(&mut out, 4, kind::WINDOW_UPDATE, 0, id);
                out.extend_from_slice(&0u32.to_be_bytes());
                out
            }),
        ),
        (
            "SETTINGS",
            Box::new(|_| {
                let mut out = Vec::new();
                frame::write_settings(&mut out, false, &[(frame::setting::MAX_FRAME_SIZE, 16_384)]);
                out
            }),
        ),
        (
            "PING",
            Box::new(|i| {
                let mut out = Vec::new();
                frame::write_head(&mut out, 8, kind::PING, 0, 0);
                out.extend_from_slice(&u64::from(i).to_be_bytes());
                out
            }),
        ),
        (
            "empty DATA",
            Box::new(|i| {
                let mut out = Vec::new();
                if i == 0 {
                    let mut post = GET.to_vec();
                    post[0] = (":method", "POST");
                    out = headers(1, &post, false);
                }
                frame::write_data(&mut out, 1, &[], false);
                out
            }),
        ),
    ];
    for (name, make) in &floods {
        let mut raw = Raw::connect(own, &[]).await;
        let mut sent = 0;
        let mut batch = Vec::new();
        for i in 0..5_000u32 {
            batch.extend(make(i));
            if batch.len() > 16 * 1024 {
                if raw.send(&batch).await.is_err() {
                    break;
                }
                batch.clear();
            }
            sent = i;
        }
        let _ = raw.send(&batch).await;
        let outcome = raw.outcome(u32::MAX).await;
        assert_eq!(outcome, Outcome::GoAway(calm), "{name}: after {sent} sent");
    }
    assert!(
        upstream.taken().len() < 1_100,
        "the rapid reset's requests were bounded by the budget"
    );
    // CONTINUATION without end: the block is bounded.
    let mut raw = Raw::connect(own, &[]).await;
    let mut out = Vec::new();
    frame::write_head(&mut out, 0, kind::HEADERS, 0, 1);
    let filler = vec![0u8; 16_000];
    for _ in 0..20 {
        frame::write_head(&mut out, filler.len(), kind::CONTINUATION, 0, 1);
        out.extend_from_slice(&filler);
    }
    let _ = raw.send(&out).await;
    assert_eq!(
        raw.outcome(1).await,
        Outcome::GoAway(calm),
        "CONTINUATION flood"
    );
}

/// A client that does not read holds the upstream back through the windows (it cannot send
/// all of a large answer into the proxy's memory), and then gets every byte once it reads.
#[tokio::test]
async fn a_slow_reader_back_pressures_the_upstream_and_then_gets_every_byte() {
    const SIZE: usize = 64 << 20;
    let upstream = Recorder::start(Some(SIZE)).await;
    let proxy = both(upstream.addr, "").await;
    let own = proxy.addrs[1].1;
    let mut sender = support::h2_connect(own).await;
    let req = Request::get(format!("http://{own}/big"))
        .body(Full::default())
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    // Nothing read for a while: the proxy takes no more than a window per stream beyond what
    // the sockets buffer, so the upstream cannot have written the whole 64 MiB.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let written = upstream.written.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        written < SIZE / 2,
        "the upstream wrote {written} of {SIZE} bytes while the client read nothing"
    );
    let mut got = 0usize;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            got += data.len();
        }
    }
    assert_eq!(got, SIZE, "every byte of the answer arrived");
}
