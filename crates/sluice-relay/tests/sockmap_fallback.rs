//! Kernel splicing asked for where the program cannot be loaded (no CAP_BPF, CAP_NET_ADMIN or
//! CAP_SYS_ADMIN on the loading thread): the relay says why, once, reports `sockmap` off, and
//! forwards in user space. A test binary of its own: the program is loaded (or not) once per
//! process.
#![allow(clippy::unwrap_used)]

mod capture;

use std::net::SocketAddr;
use std::time::Duration;

use rustix::thread::CapabilitySet;
use sluice_relay::{Forward, Relay, RelayConfig, RelayOptions, RelayRole};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(flavor = "current_thread")]
async fn without_the_capabilities_a_relay_logs_once_and_forwards_in_user_space() {
    let logs = capture::Logs::start();
    // Capabilities are per thread; this runtime runs on this test's thread only.
    let mut caps = rustix::thread::capabilities(None).unwrap();
    for cap in [
        CapabilitySet::BPF,
        CapabilitySet::NET_ADMIN,
        CapabilitySet::SYS_ADMIN,
        CapabilitySet::PERFMON,
    ] {
        caps.effective.remove(cap);
    }
    rustix::thread::set_capabilities(None, caps).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let to = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut all = Vec::new();
        conn.read_to_end(&mut all).await.unwrap();
        conn.write_all(format!("got {}", all.len()).as_bytes())
            .await
            .unwrap();
    });
    let forward = Forward {
        to: to.into(),
        tunnel: None,
        pool: 0,
        early_connect: false,
    };
    let config = RelayConfig {
        name: "fallback".to_owned(),
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        role: RelayRole::Forward(forward),
        options: RelayOptions {
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            max_connections: 16,
            nodelay: true,
            congestion: None,
            socket_buffer: None,
            splice: true,
            sockmap: true,
        },
    };
    let relay = Relay::bind(&config).unwrap();
    let handle = relay.handle();
    assert!(
        !handle.sockmap(),
        "the program loaded without the capabilities"
    );
    tokio::spawn(relay.run(std::future::pending(), Duration::ZERO));
    let mut conn = TcpStream::connect(handle.addr).await.unwrap();
    conn.write_all(&[1u8; 100_000]).await.unwrap();
    conn.shutdown().await.unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).await.unwrap();
    assert_eq!(reply, "got 100000");
    let stats = handle.stats.snapshot();
    assert_eq!(
        (stats.bytes_up, stats.kernel_spliced, stats.bytes_kernel),
        (100_000, 0, 0)
    );
    let warned = logs.lines_with(&["WARN", "sockmap is off", "relay=fallback"]);
    assert_eq!(warned.len(), 1, "{warned:?}");
}
