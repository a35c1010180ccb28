//! HTTP/1.1 strictness on raw sockets: framing a proxy must refuse (request-smuggling
//! vectors), oversize and slow heads, and hop-by-hop headers.
//!
//! Every refusal closes the connection: a request pipelined behind the bad one is never
//! answered, and the backend never receives the bad request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use support::upstream::within;
use support::wire::{read_response, Got};
use support::{exchange, read_to_close, Backend, TestProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A proxy in front of `upstream`, with a 1 KiB head limit and a 200 ms head timeout.
async fn proxy_to(upstream: SocketAddr) -> TestProxy {
    proxy_with_header_timeout(upstream, "200ms").await
}

/// A proxy in front of `upstream`, with a 1 KiB head limit and the head timeout `timeout`.
async fn proxy_with_header_timeout(upstream: SocketAddr, timeout: &str) -> TestProxy {
    TestProxy::start(&config_with_header_timeout(upstream, timeout)).await
}

/// [`proxy_with_header_timeout`]'s configuration.
fn config_with_header_timeout(upstream: SocketAddr, timeout: &str) -> String {
    format!(
        r#"
[[listener]]
name = "test"
listen = "127.0.0.1:0"
max_header_size = "1KiB"
request_header_timeout = "{timeout}"

[[route]]
cluster = "backend"

[cluster.backend]
kind = "static"
endpoints = ["{upstream}"]
"#
    )
}

async fn start() -> (Backend, TestProxy) {
    let backend = Backend::start("b").await;
    let proxy = proxy_to(backend.addr).await;
    (backend, proxy)
}

/// A well-formed request pipelined behind each bad one; it must never be answered.
const SECOND: &str = "GET /second HTTP/1.1\r\nHost: x\r\n\r\n";

/// Sends `bad` with [`SECOND`] behind it to `addr`; returns the one response received.
async fn refused_by(addr: SocketAddr, bad: &str) -> String {
    let raw = exchange(addr, format!("{bad}{SECOND}").as_bytes()).await;
    assert_eq!(raw.matches("HTTP/1.1 ").count(), 1, "{raw:?}");
    assert!(!raw.contains("/second"), "{raw:?}");
    raw
}

/// Asserts the status line, a `connection: close` header and the exact body.
fn assert_closing_response(raw: &str, status: &str, body: &str) {
    let (head, rest) = raw.split_once("\r\n\r\n").expect("a whole response head");
    assert!(
        head.starts_with(&format!("HTTP/1.1 {status}\r\n")),
        "{raw:?}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{raw:?}"
    );
    assert_eq!(rest, body, "{raw:?}");
}

/// For refusals made while parsing the head: the backend was never even connected to.
fn assert_backend_untouched(backend: &Backend) {
    assert_eq!((backend.connections(), backend.requests()), (0, 0));
}

const CL_AND_TE: [&str; 2] = [
    "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
];

#[tokio::test]
async fn content_length_with_transfer_encoding_is_400_and_closes() {
    for bad in CL_AND_TE {
        let (backend, proxy) = start().await;
        let raw = refused_by(proxy.addr(), bad).await;
        assert_closing_response(
            &raw,
            "400 Bad Request",
            "both Content-Length and Transfer-Encoding\n",
        );
        assert_backend_untouched(&backend);
    }
}

#[tokio::test]
async fn content_length_with_transfer_encoding_later_on_a_keep_alive_connection_is_400() {
    let (backend, proxy) = start().await;
    let good = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
    let raw = exchange(
        proxy.addr(),
        format!("{good}{}{SECOND}", CL_AND_TE[0]).as_bytes(),
    )
    .await;
    let responses: Vec<&str> = raw.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(responses.len(), 2, "{raw:?}");
    assert!(responses[0].starts_with("200 OK\r\n"), "{raw:?}");
    assert!(responses[0].ends_with("\r\n\r\nhello"), "{raw:?}");
    assert_closing_response(
        &format!("HTTP/1.1 {}", responses[1]),
        "400 Bad Request",
        "both Content-Length and Transfer-Encoding\n",
    );
    assert_eq!(backend.requests(), 1);
}

#[tokio::test]
async fn conflicting_content_lengths_are_400_and_close() {
    for bad in [
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!",
    ] {
        let (backend, proxy) = start().await;
        let raw = refused_by(proxy.addr(), bad).await;
        // hyper refuses these while parsing the head: an empty 400.
        assert_closing_response(&raw, "400 Bad Request", "");
        assert_backend_untouched(&backend);
    }
}

#[tokio::test]
async fn invalid_chunked_framing_is_400_and_the_backend_never_gets_a_whole_request() {
    for bad in [
        // A chunk size that is not hex.
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        // Chunk data not followed by CRLF.
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
    ] {
        // A raw upstream, to see exactly what the proxy forwarded before the body failed.
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = proxy_to(upstream.local_addr().unwrap()).await;
        let forwarded = tokio::spawn(async move {
            let (mut conn, _) = upstream.accept().await.unwrap();
            read_to_close(&mut conn).await
        });
        let raw = refused_by(proxy.addr(), bad).await;
        assert_closing_response(&raw, "400 Bad Request", "invalid request body\n");
        // The body streams, so the head and any valid chunks may already be upstream; the
        // proxy then closes that connection before the terminating chunk.
        let forwarded = forwarded.await.unwrap();
        assert!(!forwarded.contains("\r\n0\r\n\r\n"), "{forwarded:?}");
        assert!(!forwarded.contains("/second"), "{forwarded:?}");
    }
}

#[tokio::test]
async fn obs_fold_is_400_and_closes() {
    for bad in [
        "GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n\tb\r\n\r\n",
    ] {
        let (backend, proxy) = start().await;
        let raw = refused_by(proxy.addr(), bad).await;
        assert_closing_response(&raw, "400 Bad Request", "");
        assert_backend_untouched(&backend);
    }
}

/// hyper's limit, which the fast path's parser shares: 100 fields (Host included); the 101st
/// makes the head 431 however small it is.
#[tokio::test]
async fn more_than_100_fields_is_431_and_closes() {
    // `n` fields in all: Host, Connection and n - 2 more, short enough that 101 of them stay
    // under this listener's 1 KiB head.
    let head = |n: usize| {
        let fields: String = (2..n).map(|i| format!("{i}:v\r\n")).collect();
        format!("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{fields}\r\n")
    };
    let (backend, proxy) = start().await;
    let raw = refused_by(proxy.addr(), &head(101)).await;
    assert_closing_response(&raw, "431 Request Header Fields Too Large", "");
    assert_backend_untouched(&backend);
    // 96 go through (the upstream, hyper too, takes 100 with the forwarding fields added).
    let fits = exchange(proxy.addr(), head(96).as_bytes()).await;
    assert!(fits.starts_with("HTTP/1.1 200 OK\r\n"), "{fits}");
}

#[tokio::test]
async fn head_over_max_header_size_is_431_and_closes() {
    let (backend, proxy) = start().await;
    let head = |value_len: usize| {
        format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(value_len)
        )
    };
    let raw = refused_by(proxy.addr(), &head(2048)).await;
    assert_closing_response(&raw, "431 Request Header Fields Too Large", "");
    assert_backend_untouched(&backend);

    // Just under the 1 KiB limit still passes.
    let ok = format!(
        "{}GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        head(900)
    );
    let raw = exchange(proxy.addr(), ok.as_bytes()).await;
    assert_eq!(raw.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{raw:?}");
}

#[tokio::test]
async fn slow_head_gets_408_after_request_header_timeout() {
    let (backend, proxy) = start().await;
    let raw = exchange(proxy.addr(), b"GET / HTTP/1.1\r\nHost: x\r\n").await;
    assert_closing_response(&raw, "408 Request Timeout", "request header timed out");
    assert_backend_untouched(&backend);
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_silently_after_request_header_timeout() {
    let (backend, proxy) = start().await;
    assert_eq!(exchange(proxy.addr(), b"").await, "");
    // Nor is a keep-alive connection told anything when no next request begins.
    let raw = exchange(proxy.addr(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(raw.matches("HTTP/1.1 ").count(), 1, "{raw:?}");
    assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw:?}");
    assert_eq!(backend.requests(), 1);
}

/// A response that the connection's close ends reaches the client with a clean end of stream
/// even when request bytes are still unread at the proxy: it sends its FIN before it closes
/// (a close with bytes unread sends a reset, which the client would read as an error).
#[tokio::test]
async fn a_closing_response_ends_cleanly_with_request_bytes_left_unread() {
    let (backend, proxy) = start().await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    // More than the proxy's first read takes, behind a request that ends the connection.
    let mut bytes = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec();
    bytes.resize(bytes.len() + 16 * 1024, b'x');
    conn.write_all(&bytes).await.unwrap();
    // The answer and the close happen before the client reads: a reset would be there first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut got = Vec::new();
    conn.read_to_end(&mut got)
        .await
        .expect("a clean end of stream, not a reset");
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got:?}");
    assert_eq!(backend.requests(), 1);
}

/// The head timer starts again at each wait for a next request: a keep-alive client whose
/// requests come half a timeout apart is served for as long as it keeps sending them. (A
/// timer that ran from the first wait would close the connection before the third request.)
#[tokio::test]
async fn the_header_timeout_runs_from_each_wait_for_a_next_request() {
    let backend = Backend::start("b").await;
    let proxy = proxy_with_header_timeout(backend.addr, "1s").await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    for i in 0..4 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let got = next_response(&mut conn).await;
        assert_eq!(got.status, 200, "request {i}: {got:?}");
    }
    assert_eq!(backend.requests(), 4);
    // And after the last answer, the timer still closes the idle connection.
    assert_eq!(read_to_close(&mut conn).await, "");
}

/// A keep-alive connection idle between requests closes as soon as the proxy shuts down,
/// however many requests it carried before (on the fast path, one wait for the shutdown serves
/// all of a connection's waits for a request). Neither the grace nor the head timeout would
/// close it within the 3 s `read_to_close` waits.
#[tokio::test]
async fn a_shutdown_closes_a_connection_idle_after_its_requests() {
    let backend = Backend::start("b").await;
    let toml = config_with_header_timeout(backend.addr, "1h");
    let toml = format!("[runtime]\nshutdown_grace = \"1h\"\n{toml}");
    let proxy = TestProxy::start(&toml).await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    for i in 0..3 {
        conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let got = next_response(&mut conn).await;
        assert_eq!(got.status, 200, "request {i}: {got:?}");
    }
    proxy.shutdown();
    let rest = read_to_close(&mut conn).await;
    assert_eq!(rest, "", "nothing more is sent on the idle connection");
    within("the proxy's end", proxy.task).await.unwrap();
}

/// The same for a connection idle long enough that the fast path gave it back to the server
/// (after half a second), beside one that has just been answered: both close at the shutdown,
/// and one kept idle that long still has its next request served.
#[tokio::test]
async fn a_shutdown_closes_a_connection_long_idle() {
    let backend = Backend::start("b").await;
    let toml = config_with_header_timeout(backend.addr, "1h");
    let toml = format!("[runtime]\nshutdown_grace = \"1h\"\n{toml}");
    let proxy = TestProxy::start(&toml).await;
    let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut long = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut just = TcpStream::connect(proxy.addr()).await.unwrap();
    for conn in [&mut long, &mut just] {
        conn.write_all(request).await.unwrap();
        assert_eq!(next_response(conn).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    long.write_all(request).await.unwrap();
    assert_eq!(
        next_response(&mut long).await.status,
        200,
        "served after the long wait"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    just.write_all(request).await.unwrap();
    assert_eq!(next_response(&mut just).await.status, 200);
    proxy.shutdown();
    for conn in [&mut long, &mut just] {
        assert_eq!(read_to_close(conn).await, "", "nothing more is sent");
    }
    within("the proxy's end", proxy.task).await.unwrap();
}

/// Reads one whole response from `conn` (status 0 if it closes first).
async fn next_response(conn: &mut TcpStream) -> Got {
    let mut bytes = Vec::new();
    loop {
        let got = read_response(&bytes, false);
        if got.status != 0 && got.body.is_some() {
            return got;
        }
        if conn.read_buf(&mut bytes).await.unwrap_or(0) == 0 {
            return got;
        }
    }
}

#[tokio::test]
async fn hop_by_hop_headers_are_not_forwarded() {
    let (backend, proxy) = start().await;
    let raw = exchange(
        proxy.addr(),
        b"GET /headers HTTP/1.1\r\nHost: x\r\nConnection: x-secret, close\r\nx-secret: 1\r\n\
          Keep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: websocket\r\nx-kept: 1\r\n\r\n",
    )
    .await;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{raw:?}");
    let seen: Vec<&str> = body
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(name, _)| name))
        .collect();
    for hop in ["connection", "x-secret", "keep-alive", "te", "upgrade"] {
        assert!(!seen.contains(&hop), "{hop} forwarded: {body:?}");
    }
    assert!(body.contains("x-kept: 1\n"), "{body:?}");
    assert_eq!(backend.requests(), 1);
}

#[tokio::test]
async fn requests_the_router_and_upstream_could_read_differently_are_refused() {
    let cases = [
        (
            "GET /x HTTP/1.1\r\n\r\n",
            "400 Bad Request",
            "missing Host header\n",
        ),
        (
            "GET /x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
            "400 Bad Request",
            "more than one Host header\n",
        ),
        (
            "GET /public/../admin HTTP/1.1\r\nHost: x\r\n\r\n",
            "400 Bad Request",
            "dot-segments in the path\n",
        ),
        (
            "GET /public/%2e%2e/admin HTTP/1.1\r\nHost: x\r\n\r\n",
            "400 Bad Request",
            "dot-segments in the path\n",
        ),
        (
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
            "501 Not Implemented",
            "CONNECT is not supported\n",
        ),
    ];
    for (bad, status, body) in cases {
        let (backend, proxy) = start().await;
        let raw = refused_by(proxy.addr(), bad).await;
        assert_closing_response(&raw, status, body);
        assert_backend_untouched(&backend);
    }
}

#[tokio::test]
async fn transfer_codings_other_than_chunked_are_501_and_chunked_twice_is_400() {
    let cases = [
        (
            "gzip, chunked",
            "501 Not Implemented",
            "unsupported transfer coding\n",
        ),
        (
            "chunked, chunked",
            "400 Bad Request",
            "chunked transfer coding applied twice\n",
        ),
    ];
    for (coding, status, reason) in cases {
        let (backend, proxy) = start().await;
        let bad = format!(
            "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {coding}\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let raw = refused_by(proxy.addr(), &bad).await;
        assert_closing_response(&raw, status, reason);
        assert_eq!(backend.requests(), 0, "{coding}");
    }
}

#[tokio::test]
async fn a_get_with_a_chunked_body_is_forwarded_with_its_body() {
    let (backend, proxy) = start().await;
    let raw = exchange(
        proxy.addr(),
        b"GET /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw:?}");
    assert!(raw.ends_with("\r\n\r\nhello"), "{raw:?}");
    assert_eq!(backend.requests(), 1);
}

#[tokio::test]
async fn an_upstream_response_with_length_and_chunked_is_framed_by_chunks_and_not_reused() {
    let upstream = support::upstream::RawBackend::conflicting_framing().await;
    let proxy = proxy_to(upstream.addr).await;
    let request = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    let raw = exchange(
        proxy.addr(),
        format!("{request}{request}GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await;
    let responses: Vec<&str> = raw.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(responses.len(), 3, "{raw:?}");
    for response in responses {
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("200 OK\r\n"), "{raw:?}");
        assert!(!head.contains("content-length: 50"), "{raw:?}");
        // Chunked (or close-delimited) towards the client, carrying exactly `ok`.
        assert!(body == "2\r\nok\r\n0\r\n\r\n" || body == "ok", "{raw:?}");
    }
    // Each response's connection was closed after it, never reused.
    assert_eq!(upstream.connections(), 3);
}
