//! Static clusters when endpoints fail: error statuses with short reasons (never a hang),
//! passive ejection and recovery, the stale keep-alive retry, and active health checks.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::Request;
use http_body_util::Full;
use support::upstream::{
    count_by_backend, endpoint, wait_until, within, ObservedBackend, RawBackend, RefusingPort,
};
use support::{get, static_config, Backend, Reply, TestProxy};

async fn fetch(proxy: &TestProxy, path: &str) -> Reply {
    within("request", get(&support::client(), &proxy.url(path))).await
}

async fn sequential(client: &support::Client, proxy: &TestProxy, n: usize) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        replies.push(within("request", get(client, &proxy.url("/"))).await);
    }
    replies
}

#[track_caller]
fn assert_plain_error(reply: &Reply, status: u16, reason: &str) {
    assert_eq!(
        (reply.status.as_u16(), reply.body.as_str()),
        (status, format!("{reason}\n").as_str())
    );
    assert_eq!(reply.headers["content-type"], "text/plain; charset=utf-8");
}

/// Lets `backoff` of cluster time pass at once. Only call it while no request is running:
/// paused time jumps to the next timer whenever the runtime waits for loopback I/O.
async fn skip_time(backoff: Duration) {
    tokio::time::pause();
    tokio::time::advance(backoff).await;
    tokio::time::resume();
}

#[tokio::test]
async fn refused_then_ejected_then_recovered_after_the_backoff() {
    let (dead, other) = (RefusingPort::new(), RefusingPort::new());
    let extra = r#"lb = "round_robin"
ejection = { backoff = "5s", max_backoff = "20s" }"#;
    let proxy = TestProxy::start(&static_config(&[dead.addr, other.addr], extra)).await;

    assert_plain_error(&fetch(&proxy, "/").await, 502, "upstream connect failed");
    let unavailable = "no healthy upstream";
    assert_plain_error(&fetch(&proxy, "/").await, 503, unavailable);

    // The backend comes back on its port; its ejection still holds until the backoff ends.
    let revived = Backend::start_on("revived", dead.listen()).await;
    assert_plain_error(&fetch(&proxy, "/").await, 503, unavailable);
    assert_eq!(revived.connections(), 0);
    skip_time(Duration::from_secs(5)).await;

    for _ in 0..4 {
        let reply = fetch(&proxy, "/x").await;
        assert_eq!(
            (reply.status.as_u16(), reply.body.as_str()),
            (200, "revived /x")
        );
    }
}

#[tokio::test]
async fn a_dead_endpoint_is_skipped_and_not_retried_within_its_backoff() {
    let dead = RefusingPort::new();
    let live = Backend::start("live").await;
    // Round robin starts at the first endpoint, so the first request meets the dead one.
    let extra = r#"lb = "round_robin"
ejection = { backoff = "5s", max_backoff = "20s" }"#;
    let proxy = TestProxy::start(&static_config(&[dead.addr, live.addr], extra)).await;
    let client = support::client();

    let mut replies = sequential(&client, &proxy, 10).await;
    // Were the dead endpoint tried again within its backoff, it would now get requests.
    let revived = Backend::start_on("revived", dead.listen()).await;
    replies.extend(sequential(&client, &proxy, 10).await);

    assert_eq!(count_by_backend(&replies)["live"], 20);
    assert_eq!(revived.requests(), 0);
    skip_time(Duration::from_secs(5)).await;
    let after = sequential(&client, &proxy, 10).await;
    assert_eq!(count_by_backend(&after)["revived"], 5);
}

#[tokio::test]
async fn response_timeout_is_504() {
    let backend = ObservedBackend::start("a").await;
    let extra = r#"response_timeout = "100ms""#;
    let proxy = TestProxy::start(&static_config(&[backend.addr], extra)).await;

    // `/wait` is never released: only the timeout can end the exchange.
    assert_plain_error(
        &fetch(&proxy, "/wait").await,
        504,
        "upstream response timed out",
    );
    assert_eq!(backend.requests(), 1);
}

/// Linux drops a SYN to a listener whose accept queue is full, so the connect hangs until
/// the connect timeout.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn connect_timeout_is_504() {
    let blackhole = support::upstream::BlackholePort::new().await;
    let extra = r#"connect_timeout = "100ms""#;
    let proxy = TestProxy::start(&static_config(&[blackhole.addr], extra)).await;

    assert_plain_error(&fetch(&proxy, "/").await, 504, "upstream connect timed out");
}

#[tokio::test]
async fn a_backend_answering_garbage_is_502() {
    let backend = RawBackend::garbage().await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;

    assert_plain_error(&fetch(&proxy, "/").await, 502, "upstream protocol error");
    assert_eq!(backend.stats.answered.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_get_on_a_stale_pooled_connection_is_retried_on_a_fresh_one() {
    let backend = RawBackend::one_request_per_connection().await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;
    let client = support::client();

    let first = within("first", get(&client, &proxy.url("/"))).await;
    let second = within("second", get(&client, &proxy.url("/"))).await;

    assert_eq!((first.status.as_u16(), first.body.as_str()), (200, "ok"));
    assert_eq!((second.status.as_u16(), second.body.as_str()), (200, "ok"));
    // The second request went out on the pooled connection, which the backend closed.
    assert_eq!(backend.stats.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(backend.connections(), 2);
}

#[tokio::test]
async fn a_post_on_a_stale_pooled_connection_is_not_retried() {
    let backend = RawBackend::one_request_per_connection().await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;
    let client = support::client();
    let warm = within("warm-up", get(&client, &proxy.url("/"))).await;
    assert_eq!(warm.status, 200);

    let post = Request::post(proxy.url("/submit"))
        .body(Full::from("payload"))
        .unwrap();
    let reply = within("post", support::send(&client, post)).await;

    assert_plain_error(&reply, 502, "upstream protocol error");
    assert_eq!(backend.stats.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(backend.connections(), 1, "the POST was sent twice");
}

#[tokio::test]
async fn health_checks_take_a_failing_endpoint_out_and_back_in() {
    let (good, flaky) = (
        ObservedBackend::start("good").await,
        ObservedBackend::start("flaky").await,
    );
    flaky.healthy.store(false, Ordering::SeqCst);
    let extra = r#"lb = "round_robin"
health_check = { path = "/healthz", interval = "50ms", timeout = "1s", unhealthy_threshold = 2, healthy_threshold = 1 }"#;
    let proxy = TestProxy::start(&static_config(&[good.addr, flaky.addr], extra)).await;
    // Checks start with the cluster's first request.
    assert_eq!(fetch(&proxy, "/").await.status, 200);
    let (good_ep, flaky_ep) = (endpoint(&proxy, good.addr), endpoint(&proxy, flaky.addr));

    wait_until("flaky marked unhealthy", || !flaky_ep.is_healthy()).await;
    let replies = sequential(&support::client(), &proxy, 20).await;
    assert_eq!(count_by_backend(&replies)["good"], 20);
    assert!(good_ep.is_healthy());

    flaky.healthy.store(true, Ordering::SeqCst);
    wait_until("flaky back in rotation", || flaky_ep.is_healthy()).await;
    let replies = sequential(&support::client(), &proxy, 20).await;
    let counts = count_by_backend(&replies);
    assert_eq!((counts["good"], counts["flaky"]), (10, 10));
}

/// An h2c endpoint (HTTP/2 prior knowledge) that answers each request with a head (`:status
/// 200`), a DATA frame `hello`, then trailers that are malformed (a connection-specific field,
/// `connection: x`, which HTTP/2 forbids: a stream error). With `gate`, the trailers wait until
/// it is told; without, the whole answer goes out in one write.
async fn h2c_with_malformed_trailers(
    gate: Option<std::sync::Arc<tokio::sync::Notify>>,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let gate = gate.clone();
            tokio::spawn(async move {
                // The server's SETTINGS first, as HTTP/2 wants.
                if s.write_all(&frame(4, 0, 0, &[])).await.is_err() {
                    return;
                }
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut at = 24; // past the client's preface
                loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while buf.len() >= at + 9 {
                        let len = u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]]);
                        let end = at + 9 + len as usize;
                        if buf.len() < end {
                            break;
                        }
                        let (kind, flags) = (buf[at + 3], buf[at + 4]);
                        let id = u32::from_be_bytes(buf[at + 5..at + 9].try_into().unwrap());
                        at = end;
                        if kind == 4 && flags & 1 == 0 {
                            let _ = s.write_all(&frame(4, 1, 0, &[])).await;
                        }
                        if kind != 1 {
                            continue;
                        }
                        // HEADERS :status 200 (static table index 8), END_HEADERS.
                        let mut answer = frame(1, 4, id, &[0x88]);
                        answer.extend(frame(0, 0, id, b"hello"));
                        // Trailers, END_STREAM | END_HEADERS: `connection: x`, a literal
                        // field without indexing.
                        let mut trailers = vec![0x00, 10];
                        trailers.extend_from_slice(b"connection");
                        trailers.extend_from_slice(&[1, b'x']);
                        let trailers = frame(1, 5, id, &trailers);
                        match &gate {
                            None => answer.extend(trailers),
                            Some(gate) => {
                                let _ = s.write_all(&answer).await;
                                gate.notified().await;
                                answer = trailers;
                            }
                        }
                        let _ = s.write_all(&answer).await;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `GET / HTTP/1.1` with `Connection: close` and reads until the proxy closes.
async fn raw_get_to_close(proxy: std::net::SocketAddr) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let head = b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    client.write_all(head).await.unwrap();
    let mut got = Vec::new();
    let read = client.read_to_end(&mut got);
    let _ = within("the answer", read).await;
    got
}

/// Issue 47, finding 9: a static h2c cluster whose endpoint sends malformed trailers together
/// with its head. Before, an HTTP/1.1 client got an empty close (hyper's server had the head
/// in its buffer when the body failed, and dropped both); now the failure is seen before the
/// head goes out, and the client gets 502 with a short reason.
#[tokio::test]
async fn malformed_h2c_trailers_before_the_head_went_out_are_502() {
    let backend = h2c_with_malformed_trailers(None).await;
    let proxy = TestProxy::start(&static_config(&[backend], "protocol = \"h2c\"")).await;
    let got = raw_get_to_close(proxy.addr()).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 502 "), "{text:?}");
    assert!(text.contains("upstream protocol error"), "{text:?}");
}

/// ... and when the head (and some of the body) has gone out before the trailers fail, the
/// client's connection closes without the chunked body's last chunk: an incomplete body, never
/// one that looks whole.
#[tokio::test]
async fn malformed_h2c_trailers_after_the_head_went_out_cut_the_body_short() {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let backend = h2c_with_malformed_trailers(Some(std::sync::Arc::clone(&gate))).await;
    let proxy = TestProxy::start(&static_config(&[backend], "protocol = \"h2c\"")).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let head = b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    client.write_all(head).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    while !got.windows(5).any(|w| w == b"hello") {
        let n = within("the head and the data", client.read(&mut chunk))
            .await
            .unwrap();
        assert!(n > 0, "{:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    gate.notify_one();
    within("the close", client.read_to_end(&mut got))
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text:?}");
    assert!(text.contains("transfer-encoding: chunked"), "{text:?}");
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "the body looked whole: {text:?}"
    );
}

/// ... and an HTTP/2 client's stream is reset once the head went out: it sees the head, the
/// data that came, then an error, never a clean end of the body.
#[tokio::test]
async fn malformed_h2c_trailers_after_the_head_went_out_reset_an_http2_clients_stream() {
    use http_body_util::BodyExt;
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let backend = h2c_with_malformed_trailers(Some(std::sync::Arc::clone(&gate))).await;
    let proxy = TestProxy::start(&static_config(&[backend], "protocol = \"h2c\"")).await;
    let mut client = support::h2_connect_with::<Full<bytes::Bytes>>(proxy.addr()).await;
    let req = Request::get(proxy.url("/"))
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let res = within("the head", client.send_request(req)).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let first = within("the data", body.frame()).await;
    let data = first.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&data[..], b"hello");
    gate.notify_one();
    let next = within("the reset", body.frame()).await;
    assert!(matches!(next, Some(Err(_))), "{next:?}");
}
