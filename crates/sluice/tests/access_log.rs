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
