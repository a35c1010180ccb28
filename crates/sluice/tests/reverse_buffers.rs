//! `response_buffer`: a client that does not read its response does not hold the session.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod reverse_support;

use std::time::Duration;

use http::StatusCode;
use reverse_support::{get, start_proxy, Service, ServiceSpec, DEFAULT_ROUTE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// Far more than the kernel buffers between the proxy and a client that reads nothing.
const BIG: usize = 16 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_client_releases_the_session_once_the_body_is_buffered() {
    let cluster = "response_buffer = \"32MiB\"\nqueue_timeout = \"10s\"";
    let proxy = start_proxy(cluster, DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(proxy.http).await.unwrap();
    let head = format!("GET /big/{BIG} HTTP/1.1\r\nHost: test\r\n\r\n");
    stalled.write_all(head.as_bytes()).await.unwrap();
    // Once the service has answered the stalled client and the proxy has buffered the body,
    // the session is idle again, although the client has read nothing.
    tokio::time::timeout(Duration::from_secs(5), async {
        while svc.requests() < 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the stalled client's request never reached the service");
    proxy.idle("default", 1).await;
    // The only session serves another client while the first has read nothing.
    let res = get(proxy.http, "/").await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(svc.requests(), 2);
    // The stalled client still gets every byte when it finally reads.
    let mut all = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    while !all.ends_with(&vec![b'x'; 1024]) || all.len() < BIG {
        let n = stalled.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed early after {} bytes", all.len());
        all.extend_from_slice(&chunk[..n]);
    }
    assert!(all.starts_with(b"HTTP/1.1 200"));
    proxy.stop().await;
}
