//! A listener's connection limits (issue 33, item 2): `max_requests_per_connection` (NGINX's
//! `keepalive_requests`: the last request's response closes an HTTP/1.1 connection, an HTTP/2
//! one gets GOAWAY) and `max_connections_per_client` (NGINX's `limit_conn`: more are closed
//! as they are accepted). The test command runs these on the fast path and again with it off.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::Request;
use http_body_util::Full;
use support::{Backend, TestProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn proxy(backend: &Backend, listener: &str) -> TestProxy {
    let toml = format!(
        "[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n{listener}\n\
         [[route]]\ncluster = \"backend\"\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        backend.addr
    );
    TestProxy::start(&toml).await
}

async fn connect(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::from(from), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// Writes `request` and reads its answer; `None` when the connection closed first.
async fn exchange(conn: &mut TcpStream, request: &str) -> Option<String> {
    conn.write_all(request.as_bytes()).await.ok()?;
    support::read_answer(conn).await
}

/// Whether the peer closed `conn` (EOF or reset), waiting up to 10 s.
async fn closed(conn: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut byte)).await;
    matches!(read, Ok(Ok(0) | Err(_)))
}

const GET: &str = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
/// A chunked body: the fast path leaves it to hyper's path.
const CHUNKED: &str =
    "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n";

fn closes(answer: &str) -> bool {
    answer
        .to_ascii_lowercase()
        .contains("\r\nconnection: close\r\n")
}

#[tokio::test]
async fn the_last_request_of_a_connection_closes_it_across_a_hand_over_to_hyper() {
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend, "max_requests_per_connection = 3").await;
    let mut conn = connect([127, 0, 0, 1], proxy.addr()).await;
    let first = exchange(&mut conn, GET).await.unwrap();
    assert!(
        first.starts_with("HTTP/1.1 200") && !closes(&first),
        "{first}"
    );
    // The second goes to hyper's path: the count goes on there.
    let second = exchange(&mut conn, CHUNKED).await.unwrap();
    assert!(
        second.starts_with("HTTP/1.1 200") && !closes(&second),
        "{second}"
    );
    let third = exchange(&mut conn, GET).await.unwrap();
    assert!(
        third.starts_with("HTTP/1.1 200") && closes(&third),
        "{third}"
    );
    assert!(closed(&mut conn).await, "open after its last request");
    // Every request was served: three reached the backend.
    assert_eq!(backend.requests(), 3);
}

#[tokio::test]
async fn on_the_fast_path_alone_the_last_response_says_close() {
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend, "max_requests_per_connection = 2").await;
    let mut conn = connect([127, 0, 0, 1], proxy.addr()).await;
    let first = exchange(&mut conn, GET).await.unwrap();
    assert!(!closes(&first), "{first}");
    let second = exchange(&mut conn, GET).await.unwrap();
    assert!(closes(&second), "{second}");
    assert!(closed(&mut conn).await);
    if let Some(served) = support::fast_path_served(&proxy.metrics) {
        assert_eq!(served, 2, "the fast path did not serve both");
    }
}

#[tokio::test]
async fn an_http2_connection_gets_goaway_after_its_last_request() {
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend, "max_requests_per_connection = 2").await;
    let mut h2 = support::h2_connect(proxy.addr()).await;
    for _ in 0..2 {
        let req = Request::get(proxy.url("/")).body(Full::default()).unwrap();
        assert_eq!(support::h2_send(&mut h2, req).await.status, 200);
    }
    for _ in 0..200 {
        if h2.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the HTTP/2 connection is still open after its last request");
}

#[tokio::test]
async fn a_client_over_its_connection_limit_is_closed_at_accept_and_others_are_not() {
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend, "max_connections_per_client = 2").await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = connect([127, 0, 0, 1], proxy.addr()).await;
        assert!(exchange(&mut conn, GET).await.is_some());
        held.push(conn);
    }
    let mut third = connect([127, 0, 0, 1], proxy.addr()).await;
    assert!(closed(&mut third).await, "a third connection was kept");
    let mut other = connect([127, 0, 0, 2], proxy.addr()).await;
    assert!(
        exchange(&mut other, GET).await.is_some(),
        "another client was refused"
    );
    let metrics = proxy.metrics.render();
    let refused = "sluice_client_connections_refused_total{listener=\"public\"} 1";
    assert!(metrics.contains(refused), "{metrics}");
    // A connection that closes gives its place back (once the server has seen it close).
    drop(held.pop());
    for _ in 0..200 {
        let mut again = connect([127, 0, 0, 1], proxy.addr()).await;
        if exchange(&mut again, GET).await.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a closed connection's place was not given back");
}
