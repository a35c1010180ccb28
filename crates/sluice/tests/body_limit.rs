//! `max_request_body` (issue 33, item 4): a body over the route's or the listener's limit is
//! answered 413, before any of it is read when its length is declared, as soon as it is
//! exceeded when chunked; nothing over the limit reaches the upstream. The test command runs
//! these on the fast path and again with it off (hyper).
#![allow(clippy::unwrap_used)]

use crate::support;

use support::{exchange, Backend, TestProxy};

/// A listener that takes 10 bytes, and `/big`, whose route takes 100.
async fn proxy(backend: &Backend) -> TestProxy {
    let toml = format!(
        r#"
[[listener]]
name = "public"
listen = "127.0.0.1:0"
max_request_body = 10
[[route]]
path_prefix = "/big"
max_request_body = "100B"
cluster = "backend"
[[route]]
cluster = "backend"
[cluster.backend]
kind = "static"
endpoints = ["{}"]
"#,
        backend.addr
    );
    TestProxy::start(&toml).await
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn status(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or_default()
}

#[tokio::test]
async fn a_declared_length_over_the_listeners_limit_is_413_and_never_forwarded() {
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend).await;
    let fits = exchange(proxy.addr(), &post("/echo", "0123456789")).await;
    assert_eq!(status(&fits), "200", "{fits}");
    assert!(fits.ends_with("0123456789"), "{fits}");
    let over = exchange(proxy.addr(), &post("/echo", "0123456789x")).await;
    assert_eq!(status(&over), "413", "{over}");
    assert!(over.ends_with("request body too large\n"), "{over}");
    assert_eq!(
        backend.requests(),
        1,
        "the refused request reached the backend"
    );
}

/// The 413 comes before any of the body: a client that sends only the head (with a length
/// over the limit) is answered, and the connection closed, without sending a byte of it.
#[tokio::test]
async fn a_declared_length_over_the_limit_is_answered_before_the_body_is_sent() {
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend).await;
    let head = "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n";
    let over = exchange(proxy.addr(), head.as_bytes()).await;
    assert_eq!(status(&over), "413", "{over}");
    assert!(
        over.to_ascii_lowercase().contains("connection: close"),
        "{over}"
    );
    assert_eq!(backend.requests(), 0);
}

#[tokio::test]
async fn a_routes_limit_wins_over_the_listeners() {
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend).await;
    let body = "x".repeat(100);
    let fits = exchange(proxy.addr(), &post("/big/echo", &body)).await;
    assert_eq!(status(&fits), "200", "{fits}");
    let over = exchange(proxy.addr(), &post("/big/echo", &"x".repeat(101))).await;
    assert_eq!(status(&over), "413", "{over}");
}

#[tokio::test]
async fn a_chunked_body_is_refused_once_it_outgrows_the_limit() {
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend).await;
    let request = "POST /echo HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\
                   Transfer-Encoding: chunked\r\n\r\n6\r\n012345\r\n6\r\n6789ab\r\n0\r\n\r\n";
    let over = exchange(proxy.addr(), request.as_bytes()).await;
    assert_eq!(status(&over), "413", "{over}");
    assert!(!over.contains("6789ab"), "{over}");
    // The backend saw a request cut short, never a whole one with the second chunk.
    let fits = "POST /echo HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\
                Transfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n5\r\n56789\r\n0\r\n\r\n";
    let answer = exchange(proxy.addr(), fits.as_bytes()).await;
    assert_eq!(status(&answer), "200", "{answer}");
    assert!(answer.ends_with("0123456789"), "{answer}");
}
