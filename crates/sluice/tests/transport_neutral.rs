//! Issue 49: `ProxyService` is not bound to hyper's body. A request whose body another
//! transport made (an own HTTP/2, HTTP/3, a framework user's), boxed as a
//! [`sluice::RequestBody`], is routed and forwarded as hyper's is, body and all.

#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sluice::{Matcher, ProxyService, Route, RouteTable, StaticCluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An upstream that answers one request with its body, as it came.
async fn echo_once() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0; 4096];
        let (head_end, length) = loop {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended before its head");
            got.extend_from_slice(&buf[..n]);
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            break (end + 4, length);
        };
        while got.len() < head_end + length {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended before its body");
            got.extend_from_slice(&buf[..n]);
        }
        let body = &got[head_end..head_end + length];
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
        conn.write_all(head.as_bytes()).await.unwrap();
        conn.write_all(body).await.unwrap();
    });
    addr
}

#[tokio::test]
async fn a_body_another_transport_made_goes_upstream_whole() {
    let upstream = echo_once().await;
    let cluster = StaticCluster::new("echo", [upstream], Default::default()).unwrap();
    let mut table = RouteTable::new();
    table.push(Matcher::any(), Route::to_upstream("all", cluster));
    let proxy = ProxyService::new(table);
    let sent = Full::new(Bytes::from_static(b"from a transport hyper does not serve"));
    let body = sent.map_err(|never| -> BoxError { match never {} }).boxed();
    let req = http::Request::post("/echo")
        .header(http::header::HOST, "example.test")
        .body(body)
        .unwrap();
    let res = proxy.handle(req).await;
    assert_eq!(res.status(), http::StatusCode::OK);
    let got = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&got[..], b"from a transport hyper does not serve");
}
