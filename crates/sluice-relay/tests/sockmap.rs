//! Kernel splicing (`sockmap`) against the user-space path: every test runs the same
//! assertions with `sockmap` on and off, on real sockets. The program needs CAP_BPF and
//! CAP_NET_ADMIN: these tests fail, never skip, without them (CI runs as root); the fallback
//! without them is tests/sockmap_fallback.rs (a process of its own, as the program is loaded
//! once per process).
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_relay::{
    AllowedTarget, Forward, Relay, RelayConfig, RelayHandle, RelayOptions, RelayRole, TunnelEnd,
    TunnelTarget,
};
use sluice_session::Token;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Both modes, each test's assertions made in each.
const MODES: [bool; 2] = [true, false];

fn options(sockmap: bool, idle: Duration) -> RelayOptions {
    RelayOptions {
        connect_timeout: Duration::from_secs(5),
        idle_timeout: idle,
        max_connections: 10_000,
        nodelay: true,
        congestion: None,
        socket_buffer: None,
        splice: true,
        sockmap,
    }
}

fn forwarder(to: SocketAddr, sockmap: bool, idle: Duration) -> RelayConfig {
    let forward = Forward {
        to: to.into(),
        tunnel: None,
        pool: 0,
        early_connect: false,
    };
    RelayConfig {
        name: format!("edge-sockmap-{sockmap}"),
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        role: RelayRole::Forward(forward),
        options: options(sockmap, idle),
    }
}

/// Starts `config`'s relay; its handle says whether the kernel forwards, which it must when
/// asked (these tests need the program loaded).
fn start(config: RelayConfig) -> RelayHandle {
    let wanted = config.options.sockmap;
    let relay = Relay::bind(&config).unwrap();
    let handle = relay.handle();
    assert_eq!(
        handle.sockmap(),
        wanted,
        "sockmap = {wanted}: the program did not load (needs CAP_BPF and CAP_NET_ADMIN, e.g. root)"
    );
    tokio::spawn(relay.run(std::future::pending(), Duration::ZERO));
    handle
}

/// A listener whose first connection is handed to `serve`.
async fn backend<F, Fut>(serve: F) -> SocketAddr
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        serve(conn).await;
    });
    addr
}

/// `len` bytes of a pattern that no shift or repetition of a chunk matches.
fn pattern(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_u32;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Polls `cond` until it holds, failing after 10 s.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

/// 100 MiB each way at once, byte-exact: an echo backend returns what the client sends while
/// it sends, and closes after the client's FIN. The counters match the bytes, and with
/// `sockmap` the program counted them: they did not go through the relay's process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_modes_carry_100_mib_each_way_byte_exact_and_count_them() {
    const LEN: usize = 100 << 20;
    let sent = std::sync::Arc::new(pattern(LEN));
    for sockmap in MODES {
        let echo = backend(|conn| async move {
            let (mut r, mut w) = conn.into_split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
        })
        .await;
        let relay = start(forwarder(echo, sockmap, Duration::from_secs(60)));
        let conn = TcpStream::connect(relay.addr).await.unwrap();
        let (mut r, mut w) = conn.into_split();
        // The first byte's echo: the relay has connected and (with `sockmap`) every later byte
        // reaches its sockets after they entered the map.
        w.write_all(&sent[..1]).await.unwrap();
        let mut back = vec![0u8; 1];
        r.read_exact(&mut back).await.unwrap();
        let payload = std::sync::Arc::clone(&sent);
        let writer = tokio::spawn(async move {
            w.write_all(&payload[1..]).await.unwrap();
            w.shutdown().await.unwrap();
        });
        r.read_to_end(&mut back).await.unwrap();
        writer.await.unwrap();
        if back != *sent {
            let at = back.iter().zip(sent.iter()).position(|(a, b)| a != b);
            let got = back.len();
            panic!("sockmap = {sockmap}: {got} bytes back, the first difference at {at:?}");
        }
        eventually("the relay ended the connection", || {
            relay.stats.snapshot().active == 0
        })
        .await;
        let stats = relay.stats.snapshot();
        let len = LEN as u64;
        assert_eq!(
            (stats.bytes_up, stats.bytes_down),
            (len, len),
            "sockmap = {sockmap}"
        );
        // The program's own count: every byte after the first, each way, went through the
        // kernel alone (the first may have been copied while the sockets entered the map).
        let kernel = (stats.kernel_spliced, stats.bytes_kernel >= 2 * (len - 1));
        assert_eq!(kernel, (u64::from(sockmap), sockmap), "{stats:?}");
        assert!(stats.bytes_kernel <= 2 * len, "{stats:?}");
    }
}

/// Half-close both ways: the backend's FIN reaches the client while the client still sends,
/// and the client's later FIN reaches the backend, which saw every byte.
#[tokio::test]
async fn both_modes_pass_on_a_half_close_in_each_direction() {
    for sockmap in MODES {
        let (got_tx, got) = oneshot::channel();
        let addr = backend(|mut conn| async move {
            conn.write_all(b"banner").await.unwrap();
            conn.shutdown().await.unwrap();
            let mut all = Vec::new();
            conn.read_to_end(&mut all).await.unwrap();
            let _ = got_tx.send(all);
        })
        .await;
        let relay = start(forwarder(addr, sockmap, Duration::from_secs(60)));
        let mut conn = TcpStream::connect(relay.addr).await.unwrap();
        let mut banner = Vec::new();
        conn.read_to_end(&mut banner).await.unwrap();
        assert_eq!(banner, b"banner", "sockmap = {sockmap}");
        let payload = pattern(3 << 20);
        conn.write_all(&payload).await.unwrap();
        conn.shutdown().await.unwrap();
        let got = got.await.unwrap();
        assert!(got == payload, "sockmap = {sockmap}: {} bytes", got.len());
        eventually("the relay ended the connection", || {
            relay.stats.snapshot().active == 0
        })
        .await;
        let stats = relay.stats.snapshot();
        assert_eq!((stats.bytes_up, stats.bytes_down), (3 << 20, 6));
    }
}

/// What the client sees when the backend resets the connection.
async fn client_after_reset(sockmap: bool) -> std::io::ErrorKind {
    let addr = backend(|mut conn| async move {
        let mut first = [0u8; 5];
        conn.read_exact(&mut first).await.unwrap();
        // SO_LINGER 0: close sends RST.
        socket2::SockRef::from(&conn)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(conn);
    })
    .await;
    let relay = start(forwarder(addr, sockmap, Duration::from_secs(60)));
    let mut conn = TcpStream::connect(relay.addr).await.unwrap();
    conn.write_all(b"hello").await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut rest))
        .await
        .expect("the reset reached the client");
    eventually("the relay ended the connection", || {
        relay.stats.snapshot().active == 0
    })
    .await;
    assert!(rest.is_empty(), "sockmap = {sockmap}: {rest:?}");
    match read {
        Ok(_) => std::io::ErrorKind::UnexpectedEof,
        Err(e) => e.kind(),
    }
}

/// A reset from the backend ends the relayed connection the same way in both modes.
#[tokio::test]
async fn both_modes_end_the_connection_on_a_reset_alike() {
    let on = client_after_reset(true).await;
    let off = client_after_reset(false).await;
    assert_eq!(on, off, "sockmap on: {on:?}, off: {off:?}");
}

/// A connection silent for `idle_timeout` is closed; one that keeps moving bytes (through the
/// kernel, which user space does not see) is not.
#[tokio::test]
async fn both_modes_close_an_idle_connection_but_not_a_busy_one() {
    let idle = Duration::from_millis(400);
    for sockmap in MODES {
        // Busy: a byte each way every quarter of the idle timeout, for three idle timeouts.
        let echo = backend(|conn| async move {
            let (mut r, mut w) = conn.into_split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
        })
        .await;
        let relay = start(forwarder(echo, sockmap, idle));
        let mut conn = TcpStream::connect(relay.addr).await.unwrap();
        for _ in 0..12 {
            conn.write_all(b"p").await.unwrap();
            let mut b = [0u8; 1];
            conn.read_exact(&mut b).await.unwrap();
            tokio::time::sleep(idle / 4).await;
        }
        assert_eq!(relay.stats.snapshot().active, 1, "sockmap = {sockmap}");
        // Silent: closed after the idle timeout.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut rest))
            .await
            .expect("the idle connection was closed");
        assert!(
            read.is_ok() && rest.is_empty(),
            "sockmap = {sockmap}: {read:?}"
        );
        eventually("the relay ended the connection", || {
            relay.stats.snapshot().active == 0
        })
        .await;
        assert_eq!(relay.stats.snapshot().bytes_up, 12, "sockmap = {sockmap}");
    }
}

/// An entry relay and a tunnel end, both splicing in the kernel (or not): the preamble is read
/// in user space, the client's bytes behind it are forwarded (also those that came in the
/// preamble's segments), and the answer comes back.
#[tokio::test]
async fn both_modes_relay_through_a_tunnel() {
    const LEN: usize = 1 << 20;
    for sockmap in MODES {
        // Answers after a whole mebibyte, before the client's FIN: the connection is still
        // open (and can enter the map) when the relays have connected.
        let target = backend(|mut conn| async move {
            let mut all = vec![0u8; LEN];
            conn.read_exact(&mut all).await.unwrap();
            assert!(all == pattern(LEN), "the target got other bytes");
            conn.write_all(b"got it").await.unwrap();
            let mut rest = Vec::new();
            conn.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty(), "{} bytes more", rest.len());
        })
        .await;
        let token = Token(b"right-token".to_vec());
        let end = TunnelEnd {
            tokens: vec![token.clone()],
            allow: vec![AllowedTarget {
                net: "127.0.0.1/32".parse().unwrap(),
                port: target.port(),
            }],
            preamble_timeout: Duration::from_secs(2),
            max_unauthenticated: 64,
            pool_targets: Vec::new(),
            pool: 0,
        };
        let mut core = forwarder(target, sockmap, Duration::from_secs(60));
        core.role = RelayRole::Tunnel(end);
        let core = start(core);
        let mut entry = forwarder(core.addr, sockmap, Duration::from_secs(60));
        if let RelayRole::Forward(f) = &mut entry.role {
            f.tunnel = Some(TunnelTarget { target, token });
        }
        let entry = start(entry);
        let mut conn = TcpStream::connect(entry.addr).await.unwrap();
        conn.write_all(&pattern(LEN)).await.unwrap();
        let mut reply = [0u8; 6];
        conn.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"got it", "sockmap = {sockmap}");
        conn.shutdown().await.unwrap();
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "sockmap = {sockmap}");
        for relay in [&entry, &core] {
            eventually("the relays ended the connection", || {
                relay.stats.snapshot().active == 0
            })
            .await;
            let stats = relay.stats.snapshot();
            assert_eq!(stats.bytes_down, 6, "sockmap = {sockmap}");
            assert_eq!(stats.kernel_spliced, u64::from(sockmap));
        }
        // The entry's bytes up include its preamble, which it wrote itself.
        assert_eq!(
            core.stats.snapshot().bytes_up,
            LEN as u64,
            "sockmap = {sockmap}"
        );
    }
}

/// A stopping relay lets a spliced connection finish within the grace, and closes one still
/// open when the grace ends (taking it out of the kernel's map).
#[tokio::test]
async fn both_modes_drain_within_the_grace_and_close_after_it() {
    for sockmap in MODES {
        for finish in [true, false] {
            let grace = match finish {
                true => Duration::from_secs(10),
                false => Duration::from_millis(300),
            };
            let addr = backend(|mut conn| async move {
                let mut all = Vec::new();
                conn.read_to_end(&mut all).await.unwrap();
                let _ = conn
                    .write_all(format!("got {}", all.len()).as_bytes())
                    .await;
            })
            .await;
            let config = forwarder(addr, sockmap, Duration::from_secs(60));
            let relay = Relay::bind(&config).unwrap();
            let handle = relay.handle();
            assert_eq!(handle.sockmap(), sockmap);
            let (stop, stopped) = oneshot::channel::<()>();
            let shutdown = async move {
                let _ = stopped.await;
            };
            let task = tokio::spawn(relay.run(shutdown, grace));
            let mut conn = TcpStream::connect(handle.addr).await.unwrap();
            conn.write_all(b"hello").await.unwrap();
            eventually("the connection is relayed", || {
                handle.stats.snapshot().bytes_up == 5
            })
            .await;
            stop.send(()).unwrap();
            let mut reply = Vec::new();
            if finish {
                tokio::time::sleep(Duration::from_millis(100)).await;
                conn.write_all(b" world").await.unwrap();
                conn.shutdown().await.unwrap();
                conn.read_to_end(&mut reply).await.unwrap();
                assert_eq!(reply, b"got 11", "sockmap = {sockmap}");
            } else {
                let read =
                    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut reply))
                        .await
                        .expect("the relayed connection was closed after the grace");
                assert!(
                    read.is_err() || reply.is_empty(),
                    "sockmap = {sockmap}: {read:?}"
                );
            }
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("the relay returned")
                .unwrap();
        }
    }
}
