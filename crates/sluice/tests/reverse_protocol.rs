//! What the session protocol carries beyond requests: the client's address on every request
//! (`Sluice-Client-Addr`), and a drained instance kept out until it is resumed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod reverse_support;

use bytes::Bytes;
use http::Response;
use reverse_support::custom::{serve_fn, Frames};
use reverse_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A service whose every answer is the `Sluice-Client-Addr` values it received, one a line.
async fn echo_client_addr(proxy: &TestProxy) {
    serve_fn(
        proxy.acceptor,
        &ServiceSpec::new("a", 1),
        |req| async move {
            let values: Vec<&str> = req
                .headers()
                .get_all("sluice-client-addr")
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            let body = Bytes::from(values.join("\n"));
            Ok(Response::new(Frames::new([body], None)))
        },
    )
    .await;
    proxy.idle("default", 1).await;
}

#[tokio::test]
async fn every_request_carries_the_client_address_and_never_the_clients_own() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    echo_client_addr(&proxy).await;

    let mut client = TcpStream::connect(proxy.http).await.unwrap();
    let me = client.local_addr().unwrap();
    client
        .write_all(
            b"GET / HTTP/1.1\r\nHost: test\r\nSluice-Client-Addr: 6.6.6.6:1\r\n\
              sluice-client-addr: [2001:db8::6]:2\r\nX-Forwarded-For: 6.6.6.6\r\n\
              Connection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(body, format!("127.0.0.1:{}", me.port()));
    proxy.stop().await;
}
