//! `request_buffer` and `response_buffer`: a client that does not read its response does not
//! hold the session; bodies of unknown length are buffered too, and trailers survive.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use reverse_support::custom::{lettered, send_req, serve_fn, serve_raw, Frames};
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
    within("the session to be idle", proxy.idle("default", 1)).await;
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

/// Waits for `fut`, failing the test if it takes longer than a few seconds.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// `/stream` answers `chunks` as a chunked body; anything else answers `ok`. Counts requests.
async fn streaming_service(acceptor: std::net::SocketAddr, chunks: Vec<Bytes>) -> Arc<AtomicUsize> {
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&served);
    serve_fn(
        acceptor,
        &ServiceSpec::new("a", 1),
        move |req: Request<Incoming>| {
            count.fetch_add(1, Ordering::SeqCst);
            let body = if req.uri().path() == "/stream" {
                chunks.clone()
            } else {
                vec![Bytes::from_static(b"ok")]
            };
            async move { Ok(Response::new(Frames::new(body, None))) }
        },
    )
    .await;
    served
}

/// Sends `GET path` on a connection with a tiny receive buffer and returns the response once
/// its head has arrived, without reading the body.
async fn stalled_get(addr: std::net::SocketAddr, path: &str) -> Response<Incoming> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "test")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    within("the response head", sender.send_request(req))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_response_within_the_buffer_releases_the_session_before_the_client_reads() {
    let cluster = "response_buffer = \"32MiB\"\nqueue_timeout = \"10s\"";
    let proxy = start_proxy(cluster, DEFAULT_ROUTE).await;
    let chunks = lettered(16, 1024 * 1024);
    let served = streaming_service(proxy.acceptor, chunks.clone()).await;
    proxy.idle("default", 1).await;
    let stalled = stalled_get(proxy.http, "/stream").await;
    // The whole body is in the proxy, so the only session is idle although the client has
    // read nothing, and it serves another client.
    within("the session to be idle", proxy.idle("default", 1)).await;
    let res = get(proxy.http, "/").await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(served.load(Ordering::SeqCst), 2);
    // With the whole body in hand, the proxy frames it with Content-Length.
    let expected: Vec<u8> = chunks.concat();
    let length = stalled.headers().get(header::CONTENT_LENGTH).unwrap();
    assert_eq!(length.to_str().unwrap(), expected.len().to_string());
    let body = stalled.into_body().collect().await.unwrap().to_bytes();
    assert!(body == expected, "body differs ({} bytes)", body.len());
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_larger_than_the_buffer_holds_the_session_until_read_and_arrives_whole() {
    let cluster = "response_buffer = \"1MiB\"\nqueue_timeout = \"300ms\"";
    let proxy = start_proxy(cluster, DEFAULT_ROUTE).await;
    // Far more than the buffer and the kernel's socket buffers together.
    let chunks = lettered(16, 1024 * 1024);
    streaming_service(proxy.acceptor, chunks.clone()).await;
    proxy.idle("default", 1).await;
    let stalled = stalled_get(proxy.http, "/stream").await;
    // The rest of the body is still on the session, so it cannot serve anyone else.
    assert_eq!(proxy.cluster.idle_sessions("default"), 0);
    let res = get(proxy.http, "/").await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE);
    let body = stalled.into_body().collect().await.unwrap().to_bytes();
    let expected: Vec<u8> = chunks.concat();
    assert!(body == expected, "body differs ({} bytes)", body.len());
    // Read to the end, the session goes back.
    within("the session to be idle", proxy.idle("default", 1)).await;
    assert_eq!(get(proxy.http, "/").await.status, StatusCode::OK);
    proxy.stop().await;
}

/// Echoes the request body, and in `x-seen-length` / `x-seen-te` the framing it came with.
async fn echo(req: Request<Incoming>) -> Result<Response<Frames>, std::io::Error> {
    let seen = |h: &HeaderMap, name| {
        h.get(name)
            .map_or("none".to_owned(), |v| v.to_str().unwrap().to_owned())
    };
    let length = seen(req.headers(), header::CONTENT_LENGTH);
    let te = seen(req.headers(), header::TRANSFER_ENCODING);
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut res = Response::new(Frames::new([body], None));
    res.headers_mut()
        .insert("x-seen-length", length.parse().unwrap());
    res.headers_mut().insert("x-seen-te", te.parse().unwrap());
    Ok(res)
}

/// A `method` request to `/echo` whose body is sent chunked, in `chunks`.
fn chunked_request(method: Method, chunks: Vec<Bytes>) -> Request<Frames> {
    Request::builder()
        .method(method)
        .uri("/echo")
        .header("host", "test")
        .body(Frames::new(chunks, None))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_within_the_buffer_is_sent_with_content_length() {
    let proxy = start_proxy("request_buffer = \"64KiB\"", DEFAULT_ROUTE).await;
    serve_fn(proxy.acceptor, &ServiceSpec::new("a", 1), echo).await;
    proxy.idle("default", 1).await;
    let chunks = lettered(8, 4096);
    let res = send_req(proxy.http, chunked_request(Method::POST, chunks.clone())).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.headers["x-seen-length"], "32768");
    assert_eq!(res.headers["x-seen-te"], "none");
    assert_eq!(res.body, chunks.concat());
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_larger_than_the_buffer_arrives_whole_and_chunked() {
    let proxy = start_proxy("request_buffer = \"64KiB\"", DEFAULT_ROUTE).await;
    serve_fn(proxy.acceptor, &ServiceSpec::new("a", 1), echo).await;
    proxy.idle("default", 1).await;
    let chunks = lettered(32, 8192);
    let res = send_req(proxy.http, chunked_request(Method::POST, chunks.clone())).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.headers["x-seen-length"], "none");
    assert_eq!(res.headers["x-seen-te"], "chunked");
    assert_eq!(res.body, chunks.concat());
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_chunked_request_is_retried_when_its_session_dies() {
    let proxy = start_proxy("request_buffer = \"64KiB\"", DEFAULT_ROUTE).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    serve_fn(proxy.acceptor, &ServiceSpec::new("a", 2), move |req| {
        let first = seen.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                // Read the request, then drop the session without a response byte.
                let _ = req.into_body().collect().await;
                return Err(std::io::Error::other("dropping the session"));
            }
            echo(req).await
        }
    })
    .await;
    proxy.idle("default", 2).await;
    let chunks = lettered(4, 4096);
    let res = send_req(proxy.http, chunked_request(Method::PUT, chunks.clone())).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body, chunks.concat());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_survive_a_buffered_response() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let response: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\
        trailer: x-checksum\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\
        x-checksum: 42\r\n\r\n";
    serve_raw(proxy.acceptor, &ServiceSpec::new("a", 1), response).await;
    proxy.idle("default", 1).await;
    let req = Request::get("/")
        .header("host", "test")
        .header(header::TE, "trailers")
        .body(Frames::default())
        .unwrap();
    let res = send_req(proxy.http, req).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body, "hello world");
    let trailers = res.trailers.expect("the trailers were lost");
    assert_eq!(trailers["x-checksum"], "42");
    // The body ended within the buffer, so the session went back.
    within("the session to be idle", proxy.idle("default", 1)).await;
    proxy.stop().await;
}

/// An HTTP/1.0 request without `Host` reaches the service as HTTP/1.1 with the cluster's name
/// as its `Host` (every HTTP/1.1 request carries one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_request_without_host_reaches_the_service_with_the_cluster_name() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    serve_fn(
        proxy.acceptor,
        &ServiceSpec::new("a", 1),
        |req| async move {
            let host = req.headers().get(header::HOST).cloned();
            let seen = host.map_or_else(|| "none".to_owned(), |h| h.to_str().unwrap().to_owned());
            Ok(Response::new(Frames::new([Bytes::from(seen)], None)))
        },
    )
    .await;
    proxy.idle("default", 1).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.http).await.unwrap();
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.0 200 OK\r\n"), "{raw:?}");
    assert!(raw.ends_with("\r\n\r\napi"), "{raw:?}");
    proxy.stop().await;
}

/// A service's response with both `Content-Length` and `Transfer-Encoding` is framed by the
/// chunks, and its session is closed after it rather than reused out of step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_with_length_and_chunked_is_framed_by_chunks_and_retires_its_session() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
    serve_raw(proxy.acceptor, &ServiceSpec::new("a", 1), answer).await;
    proxy.idle("default", 1).await;
    let reply = get(proxy.http, "/").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "ok");
    // Read whole within response_buffer, it goes out with its true length, never the 50.
    let length = reply.headers.get(header::CONTENT_LENGTH);
    assert!(length.is_none_or(|l| l == "2"), "{:?}", reply.headers);
    proxy.cluster.wait_until(|c| c.sessions() == 0).await;
    proxy.stop().await;
}

/// A service streams JSON lines with pauses (a generator, a long poll that answers event by
/// event): each line reaches the client before the service sends the next one. The service
/// waits for the client's word after each line, so a proxy that held the body back until its
/// end (or until `response_buffer` filled) would never deliver it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_reaches_the_client_chunk_by_chunk() {
    use reverse_support::custom::Channel;
    use tokio::sync::{mpsc, Mutex};
    let proxy = start_proxy("queue_timeout = \"10s\"", DEFAULT_ROUTE).await;
    let (lines_tx, lines_rx) = mpsc::channel::<mpsc::Sender<Bytes>>(1);
    let lines_tx = Arc::new(Mutex::new(Some(lines_tx)));
    serve_fn(proxy.acceptor, &ServiceSpec::new("a", 1), move |_req| {
        let lines_tx = Arc::clone(&lines_tx);
        async move {
            let (tx, rx) = mpsc::channel(1);
            if let Some(hand) = lines_tx.lock().await.take() {
                hand.send(tx).await.unwrap();
            }
            let res = Response::builder()
                .header("content-type", "application/x-ndjson")
                .body(Channel(rx))
                .unwrap();
            Ok::<_, std::io::Error>(res)
        }
    })
    .await;
    proxy.idle("default", 1).await;

    let stream = tokio::net::TcpStream::connect(proxy.http).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/events")
        .header("host", "test")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let pending = tokio::spawn(async move { sender.send_request(req).await.unwrap() });
    let mut lines_rx = lines_rx;
    let service = within("the request to reach the service", lines_rx.recv())
        .await
        .unwrap();
    service.send(Bytes::from("{\"n\":1}\n")).await.unwrap();
    let res = within("the response head", pending).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let mut received = Vec::new();
    for n in 1..=3 {
        // Everything of line n arrives while the service still holds the rest back.
        let line = format!("{{\"n\":{n}}}\n");
        while received.len() < line.len() {
            let frame = within("the next line", body.frame())
                .await
                .unwrap()
                .unwrap();
            received.extend_from_slice(&frame.into_data().unwrap());
        }
        assert_eq!(String::from_utf8_lossy(&received), line);
        received.clear();
        if n < 3 {
            let next = format!("{{\"n\":{}}}\n", n + 1);
            service.send(Bytes::from(next)).await.unwrap();
        }
    }
    drop(service);
    assert!(within("the end", body.frame()).await.is_none());
    // The session goes back once the stream has ended.
    within("the session to be idle", proxy.idle("default", 1)).await;
    proxy.stop().await;
}

/// A pause in a response (the service's, or this machine's scheduler's) ends the read-ahead's
/// wait, and what came is sent; the rest is still read off the session at the service's pace,
/// so a client that reads nothing does not keep the session for a body that fits the buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_in_a_response_does_not_leave_its_session_to_a_stalled_client() {
    use reverse_support::custom::Channel;
    use tokio::sync::{mpsc, Mutex};
    let cluster = "response_buffer = \"32MiB\"\nqueue_timeout = \"10s\"";
    let proxy = start_proxy(cluster, DEFAULT_ROUTE).await;
    let (senders_tx, mut senders) = mpsc::channel::<mpsc::Sender<Bytes>>(1);
    let senders_tx = Arc::new(Mutex::new(Some(senders_tx)));
    serve_fn(proxy.acceptor, &ServiceSpec::new("a", 1), move |_req| {
        let senders_tx = Arc::clone(&senders_tx);
        async move {
            // The first request's body is fed by the test; later ones are empty.
            let (tx, rx) = mpsc::channel(1);
            if let Some(hand) = senders_tx.lock().await.take() {
                hand.send(tx).await.unwrap();
            }
            Ok::<_, std::io::Error>(Response::new(Channel(rx)))
        }
    })
    .await;
    proxy.idle("default", 1).await;

    let addr = proxy.http;
    let stalled = tokio::spawn(async move { stalled_get(addr, "/pause").await });
    let service = within("the request to reach the service", senders.recv())
        .await
        .unwrap();
    service.send(Bytes::from_static(b"first\n")).await.unwrap();
    // Far longer than the read-ahead waits for a next chunk.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stalled = within("the response head", stalled).await.unwrap();
    let rest = Bytes::from(vec![b'r'; 4 << 20]);
    service.send(rest.clone()).await.unwrap();
    drop(service);

    // The rest is in the proxy: the only session serves another client.
    within("the session to be idle", proxy.idle("default", 1)).await;
    assert_eq!(get(proxy.http, "/").await.status, StatusCode::OK);
    let body = stalled.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 6 + rest.len());
    assert!(body.starts_with(b"first\n") && body[6..] == rest[..]);
    proxy.stop().await;
}
