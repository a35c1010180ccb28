//! Clients that stop halfway (issue 29, items 1 and 5).
//!
//! A request whose body stops arriving: before, a reverse cluster held it forever
//! (request_buffer waited with no timer) and a static one answered 504 at its response
//! timeout. Now `client_body_timeout` answers 408 and closes, on HTTP/1.1 (both paths: the
//! fast path leaves bodies not all read to hyper) and HTTP/2, and no session or upstream
//! request is spent on it.
//!
//! An h2c connection that sends only the preface, or HEADERS without END_HEADERS: before, it
//! lived `idle_timeout` (60 s); now its first request must be complete within
//! `request_header_timeout`, as on HTTP/1.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use reverse_support::{start_proxy_with, Service, ServiceSpec, DEFAULT_ROUTE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LISTENER: &str = "client_body_timeout = \"300ms\"\nrequest_header_timeout = \"30s\"";

/// Sends `head` (and `body`) and reads until the proxy closes, within a guard far above the
/// body timeout; panics if the connection stays open.
async fn answer_to(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut got))
        .await
        .expect("the proxy still holds a stalled request after 20 s")
        .unwrap();
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_body_that_never_comes_is_answered_408_without_a_session() {
    let proxy = start_proxy_with(LISTENER, "", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    let stalls = [
        (
            "POST /rev/stall HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",
            &b""[..],
        ),
        (
            "POST /rev/stall HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",
            b"12345",
        ),
        (
            "POST /rev/stall HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"",
        ),
        (
            "POST /rev/stall HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"3\r\nabc\r\n",
        ),
    ];
    for (head, body) in stalls {
        let answer = answer_to(proxy.http, head, body).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{head:?}: {answer:?}");
        assert!(answer.contains("request body timed out"), "{answer:?}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer:?}"
        );
    }
    assert_eq!(svc.requests(), 0, "a stalled request took a session");
    proxy.idle("default", 2).await;
}

#[tokio::test]
async fn an_http2_request_without_data_is_answered_408() {
    let proxy = start_proxy_with(LISTENER, "", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let stream = TcpStream::connect(proxy.http).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    // HEADERS without END_STREAM, then no DATA: the sender half is kept and never used.
    let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
    let body = StreamBody::new(tokio_stream_from(rx));
    let req = Request::post(format!("http://{}/rev/stall", proxy.http))
        .body(body)
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(20), sender.send_request(req))
        .await
        .expect("no answer after 20 s")
        .unwrap();
    assert_eq!(res.status(), 408);
    assert_eq!(svc.requests(), 0);
}

/// A body streamed to a static upstream that stops is the client's 408, not the upstream's
/// 504 (the cluster's response timeout is far longer here).
#[tokio::test]
async fn a_body_streamed_to_a_static_upstream_that_stops_is_408() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = upstream.local_addr().unwrap();
    // The upstream reads what comes and never answers.
    tokio::spawn(async move {
        while let Ok((mut s, _)) = upstream.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    let toml = format!(
        "[[listener]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\n{LISTENER}\n\
         [[route]]\ncluster = \"b\"\n\
         [cluster.b]\nkind = \"static\"\nendpoints = [\"{backend}\"]\nresponse_timeout = \"60s\"\n"
    );
    let config = sluice::config::parse_str(&toml, "t.toml", std::path::Path::new(".")).unwrap();
    let proxy = sluice::Proxy::bind(&config).await.unwrap();
    let addr = proxy.local_addrs()[0].1;
    tokio::spawn(proxy.run_until(std::future::pending()));
    let head = "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
    let answer = answer_to(addr, head, &[b'x'; 1000]).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
}

/// The same over HTTP/2 to the endpoint (`protocol = "h2c"`): hyper's HTTP/2 client answers a
/// request body that fails with a reset stream, which was a 502; it is the client's 408 too.
#[tokio::test]
async fn a_body_streamed_to_an_h2c_upstream_that_stops_is_408() {
    use hyper_util::rt::TokioExecutor;
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = upstream.local_addr().unwrap();
    // The upstream reads the whole body before it answers.
    tokio::spawn(async move {
        while let Ok((s, _)) = upstream.accept().await {
            let svc = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async {
                use http_body_util::BodyExt;
                let body = req.into_body().collect().await;
                let len = body.map_or(0, |b| b.to_bytes().len());
                let body = http_body_util::Full::new(Bytes::from(len.to_string()));
                Ok::<_, Infallible>(http::Response::new(body))
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc),
            );
        }
    });
    let toml = format!(
        "[[listener]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\n{LISTENER}\n\
         [[route]]\ncluster = \"b\"\n\
         [cluster.b]\nkind = \"static\"\nendpoints = [\"{backend}\"]\nprotocol = \"h2c\"\n\
         response_timeout = \"60s\"\n"
    );
    let config = sluice::config::parse_str(&toml, "t.toml", std::path::Path::new(".")).unwrap();
    let proxy = sluice::Proxy::bind(&config).await.unwrap();
    let addr = proxy.local_addrs()[0].1;
    tokio::spawn(proxy.run_until(std::future::pending()));
    let head = "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
    let answer = answer_to(addr, head, &[b'x'; 1000]).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
}

/// A body that keeps coming, slower than the timeout in total but never pausing that long,
/// is forwarded whole.
#[tokio::test]
async fn a_slow_body_that_keeps_coming_is_not_cut() {
    let proxy = start_proxy_with(LISTENER, "", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let mut stream = TcpStream::connect(proxy.http).await.unwrap();
    let head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        stream.write_all(b"x").await.unwrap();
    }
    let mut got = Vec::new();
    stream.read_to_end(&mut got).await.unwrap();
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert_eq!(svc.requests(), 1);
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The h2c preface and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A HEADERS frame on stream 1 without END_HEADERS (flags 0), holding `:method: GET` only.
const OPEN_HEADERS: &[u8] = b"\0\0\x01\x01\0\0\0\0\x01\x82";

#[tokio::test]
async fn an_h2c_connection_without_a_complete_request_is_closed_at_the_header_timeout() {
    let proxy = start_proxy_with(LISTENER_H2, "", DEFAULT_ROUTE).await;
    for sent in [PREFACE.to_vec(), [PREFACE, OPEN_HEADERS].concat()] {
        let mut stream = TcpStream::connect(proxy.http).await.unwrap();
        stream.write_all(&sent).await.unwrap();
        let mut got = Vec::new();
        // idle_timeout is 60 s here: a close well before it is the header timer's.
        tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut got))
            .await
            .expect("the h2c connection is still open after 20 s")
            .ok();
    }
}

const LISTENER_H2: &str = "request_header_timeout = \"300ms\"\nidle_timeout = \"60s\"";

/// Issue 47, finding 9: a body that stalls after the reverse cluster's `request_buffer` was
/// filled (what fit went out, the rest streams to the session) is the client's 408 at its
/// `client_body_timeout`, as before the buffer filled, not a 502: on HTTP/1.1 sessions and on
/// HTTP/2 ones, whose service reads the whole body before it answers.
#[tokio::test]
async fn a_body_that_stalls_past_the_request_buffer_is_408() {
    let cluster = "request_buffer = \"1KiB\"\nresponse_timeout = \"60s\"";
    // Each with two units of capacity: two sessions, or one of two streams.
    for spec in [ServiceSpec::new("h1", 2), ServiceSpec::h2("h2", 1, 2)] {
        let proxy = start_proxy_with(LISTENER, cluster, DEFAULT_ROUTE).await;
        let _svc = Service::start(proxy.acceptor, spec.clone()).await;
        proxy.idle("default", 2).await;
        let stalls = [
            (
                "POST /collect HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
                vec![b'x'; 2000],
            ),
            (
                "POST /collect HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                [&b"7d0\r\n"[..], &[b'x'; 2000], b"\r\n"].concat(),
            ),
        ];
        for (head, body) in stalls {
            let answer = answer_to(proxy.http, head, &body).await;
            let what = (&spec.instance, head);
            assert!(answer.starts_with("HTTP/1.1 408"), "{what:?}: {answer:?}");
            assert!(answer.contains("request body timed out"), "{answer:?}");
        }
        proxy.stop().await;
    }
}
