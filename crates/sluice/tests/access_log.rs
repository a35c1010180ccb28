//! The access log: one line per answered request, in the chosen format, in the chosen file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod log_capture;
mod reverse_support;

use std::path::Path;
use std::time::Duration;

use log_capture::captured_logs;
use reverse_support::get;
use sluice::Proxy;

async fn serve(
    dir: &Path,
    format: &str,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    serve_to(dir, format, "access.log").await
}

async fn serve_to(
    dir: &Path,
    format: &str,
    path: &str,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let text = format!(
        "[access_log]\nformat = \"{format}\"\npath = \"{path}\"\n\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"hello\"\ndirect_response = {{ status = 200, body = \"hello\\n\" }}\n"
    );
    let config =
        sluice::config::parse_str(&text, &dir.join("t.toml").display().to_string(), dir).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let addr = proxy.local_addrs()[0].1;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(proxy.run_until(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// The log's lines once there are `n` (the writer is a background task); bounded.
async fn lines(path: &Path, n: usize) -> Vec<String> {
    for _ in 0..500 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the access log never got {n} lines");
}

#[tokio::test]
async fn json_lines_name_the_request_route_and_status() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop) = serve(dir.path(), "json").await;
    assert_eq!(get(addr, "/a?b=1").await.text(), "hello\n");
    let line = lines(&dir.path().join("access.log"), 1).await.remove(0);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["client"], "127.0.0.1");
    assert_eq!(
        (v["method"].as_str(), v["target"].as_str()),
        (Some("GET"), Some("/a?b=1"))
    );
    assert_eq!(
        (v["status"].as_u64(), v["bytes"].as_u64()),
        (Some(200), Some(6))
    );
    assert_eq!(v["route"], "hello");
    let _ = stop.send(());
}

#[tokio::test]
async fn common_log_format_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop) = serve(dir.path(), "common").await;
    get(addr, "/one").await;
    get(addr, "/two").await;
    let lines = lines(&dir.path().join("access.log"), 2).await;
    assert!(lines[0].starts_with("127.0.0.1 - - ["), "{}", lines[0]);
    assert!(
        lines[0].ends_with("] \"GET /one HTTP/1.1\" 200 6"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("\"GET /two HTTP/1.1\" 200 6"),
        "{}",
        lines[1]
    );
    let _ = stop.send(());
}

/// An answer to `HEAD` sends no body, and that is its whole: logged complete, 0 bytes (hyper's
/// server drops the unsent body, which the log took for a client gone away).
#[tokio::test]
async fn an_answer_to_head_is_logged_complete() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop) = serve(dir.path(), "json").await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = "HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
    assert!(answer.ends_with("\r\n\r\n"), "{answer:?}");
    let line = lines(&dir.path().join("access.log"), 1).await.remove(0);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (
            v["method"].as_str(),
            v["bytes"].as_u64(),
            v["complete"].as_bool()
        ),
        (Some("HEAD"), Some(0), Some(true)),
        "{line}"
    );
    let _ = stop.send(());
}

/// A template of the operator's: its fields, its text, a dash for what a request has not.
#[tokio::test]
async fn template_lines_write_the_fields_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let format =
        r#"{client} \"{request}\" {status} {bytes} route={route} up={upstream_addr} {{ok}}"#;
    let (addr, stop) = serve(dir.path(), format).await;
    get(addr, "/t?x=1").await;
    let line = lines(&dir.path().join("access.log"), 1).await.remove(0);
    assert_eq!(
        line,
        "127.0.0.1 \"GET /t?x=1 HTTP/1.1\" 200 6 route=hello up=- {ok}"
    );
    let _ = stop.send(());
}

/// A full disk (`/dev/full` fails every write with ENOSPC): requests are served as before,
/// and the failure is logged once per interval with the lines lost, not once per request.
#[tokio::test]
async fn a_full_disk_does_not_fail_requests_and_is_reported_once_per_interval() {
    let logs = captured_logs();
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop) = serve_to(dir.path(), "common", "/dev/full").await;
    let reports = || {
        let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
        text.matches("the access log cannot be written").count()
    };
    for i in 0..50 {
        assert_eq!(get(addr, &format!("/{i}")).await.text(), "hello\n");
        // Each request's line is written (and fails) before the next is sent.
        for _ in 0..100 {
            if reports() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // 50 requests take far less than the 10 s interval: only the first failure is reported.
    assert_eq!(reports(), 1);
    let _ = stop.send(());
}

/// Issue 28, item 10: a line is written when the body ends, so a streamed response's
/// `duration_ms` covers the stream ($request_time) and `bytes` counts what was sent
/// ($body_bytes_sent), for streams and for Sluice's own 503s alike; it names the instance
/// that served it and how long the request waited for a session.
#[tokio::test]
async fn lines_are_written_at_the_bodys_end_with_upstream_and_queue_wait() {
    use bytes::Bytes;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use reverse_support::custom::serve_fn;
    use reverse_support::ServiceSpec;

    let dir = tempfile::tempdir().unwrap();
    let text = "[access_log]\nformat = \"json\"\npath = \"access.log\"\n\
         [acceptor]\nlisten = \"127.0.0.1:0\"\n\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"empty\"\npath_prefix = \"/empty\"\ncluster = \"nobody\"\n\
         [[route]]\nname = \"api\"\ncluster = \"api\"\n\
         [cluster.api]\nkind = \"reverse\"\nqueue_timeout = \"10s\"\n\
         [cluster.nobody]\nkind = \"reverse\"\n";
    let config = sluice::config::parse_str(
        text,
        &dir.path().join("t.toml").display().to_string(),
        dir.path(),
    )
    .unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let addr = proxy.local_addrs()[0].1;
    let acceptor = proxy.acceptor_addr().unwrap();
    let cluster = proxy.reverse_cluster("api").unwrap().clone();
    tokio::spawn(proxy.run_until(std::future::pending()));
    // One session: three chunks of 100 bytes, 150 ms apart.
    let _svc = serve_fn(acceptor, &ServiceSpec::new("streamer", 1), |_req| async {
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
        tokio::spawn(async move {
            for i in 0..3u8 {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from(vec![b'a' + i; 100]))))
                    .await;
            }
        });
        let mut rx = rx;
        let body = StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
        Ok(http::Response::new(body))
    })
    .await;
    cluster
        .wait_until(|c| c.idle_sessions("default") == 1)
        .await;
    // Two at once on one session: the second waits for the first's whole stream.
    let (a, b) = tokio::join!(get(addr, "/s1"), get(addr, "/s2"));
    assert_eq!((a.body.len(), b.body.len()), (300, 300));
    let refused = get(addr, "/empty").await;
    assert_eq!(refused.status, 503);
    let lines = lines(&dir.path().join("access.log"), 3).await;
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by_target = |t: &str| parsed.iter().find(|v| v["target"] == t).unwrap().clone();
    for t in ["/s1", "/s2"] {
        let v = by_target(t);
        assert_eq!(v["bytes"], 300, "{v}");
        assert_eq!(v["complete"], true, "{v}");
        assert_eq!(v["instance"], "streamer", "{v}");
        // The stream alone takes 300 ms: a line written at the head said ~0.
        assert!(v["duration_ms"].as_f64().unwrap() >= 300.0, "{v}");
    }
    let waited = ["/s1", "/s2"].map(|t| by_target(t)["queue_ms"].as_f64().unwrap());
    assert!(
        waited.iter().any(|w| *w >= 250.0),
        "one waited for the other's stream: {waited:?}"
    );
    let empty = by_target("/empty");
    assert_eq!(empty["status"], 503);
    assert_eq!(empty["bytes"], refused.body.len() as u64, "{empty}");
    assert_eq!(empty["request_bytes"], 0);
}
