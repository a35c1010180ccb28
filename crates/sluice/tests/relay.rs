//! `sluice run` serves `[[relay]]`s from the same file as everything else, and the admin API
//! shows their counters.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use sluice::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn a_relay_from_the_config_forwards_and_shows_in_status_and_metrics() {
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = backend.accept().await.unwrap();
            tokio::spawn(async move {
                let mut all = Vec::new();
                conn.read_to_end(&mut all).await.unwrap();
                conn.write_all(&all).await.unwrap();
            });
        }
    });
    let text = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[relay]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\nto = \"{backend_addr}\"\npool = 1\n"
    );
    let config = sluice::config::parse_str(&text, "relay.toml", Path::new(".")).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let handle = proxy.relays().remove(0);
    let relay = handle.addr;
    let admin = proxy.admin_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(proxy.run_until(async move {
        let _ = stopped.await;
    }));
    let mut conn = TcpStream::connect(relay).await.unwrap();
    conn.write_all(b"through the relay").await.unwrap();
    conn.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    conn.read_to_end(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"through the relay");
    let status = get(admin, "/status").await;
    assert!(status.contains(r#""relays":[{"#), "{status}");
    assert!(status.contains(r#""bytes_up":17"#), "{status}");
    let metrics = get(admin, "/metrics").await;
    assert!(
        metrics.contains("sluice_relay_bytes_down_total{relay=\"edge\"} 17"),
        "{metrics}"
    );
    // The Prometheus text format (no Accept): the family named as its samples, a counter.
    assert!(
        metrics.contains("# TYPE sluice_relay_bytes_down_total counter\n"),
        "{metrics}"
    );
    // The admin API resizes the pool at runtime; the refill follows.
    let (status, body) = post(admin, "/relays/edge/pool", r#"{"size": 3}"#).await;
    assert_eq!(status, 200, "{body}");
    for _ in 0..500 {
        if handle.stats.snapshot().pool_idle == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(handle.stats.snapshot().pool_idle, 3);
    let (status, _) = post(admin, "/relays/nope/pool", r#"{"size": 3}"#).await;
    assert_eq!(status, 404);
    stop.send(()).unwrap();
    run.await.unwrap();
}

/// The body of a plain HTTP/1.0 GET.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut all = String::new();
    conn.read_to_string(&mut all).await.unwrap();
    all.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// The status code and body of a POST with a JSON body.
async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut all = String::new();
    conn.read_to_string(&mut all).await.unwrap();
    let status = all[9..12].parse().unwrap();
    (status, all.split_once("\r\n\r\n").unwrap().1.to_owned())
}
