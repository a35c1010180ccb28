//! The listener's idle timeout closes silent connections, never one with a request in flight.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::time::Duration;

use support::{get, Backend, TestProxy};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

fn config(backend: std::net::SocketAddr) -> String {
    format!(
        r#"
[[listener]]
name = "test"
listen = "127.0.0.1:0"
idle_timeout = "200ms"

[[route]]
cluster = "backend"

[cluster.backend]
kind = "static"
endpoints = ["{backend}"]
"#
    )
}

#[tokio::test]
async fn a_slow_upstream_response_outlives_the_idle_timeout() {
    let backend = Backend::start("slow").await;
    let proxy = TestProxy::start(&config(backend.addr)).await;
    // Nothing moves on the client connection for 3x the idle timeout while the upstream works.
    let res = get(&support::client(), &proxy.url("/delay/600")).await;
    assert_eq!(
        (res.status.as_u16(), res.body.as_str()),
        (200, "slow /delay/600")
    );
}

#[tokio::test]
async fn a_silent_connection_is_closed() {
    let backend = Backend::start("b").await;
    let proxy = TestProxy::start(&config(backend.addr)).await;
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
}
