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
        let (mut conn, _) = backend.accept().await.unwrap();
        let mut all = Vec::new();
        conn.read_to_end(&mut all).await.unwrap();
        conn.write_all(&all).await.unwrap();
    });
    let text = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[relay]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\nto = \"{backend_addr}\"\n"
    );
    let config = sluice::config::parse_str(&text, "relay.toml", Path::new(".")).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let relay = proxy.relays()[0].addr;
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
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
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
