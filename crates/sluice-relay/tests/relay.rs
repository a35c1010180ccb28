//! End-to-end relays on loopback: plain forwarding, half-close, the tunnel's authentication and
//! `allow` list, pool refill after the peer closes pooled connections, and early connect with
//! and without CAP_NET_RAW.
#![allow(clippy::unwrap_used)]

mod capture;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use sluice_relay::{
    AllowedTarget, Forward, Relay, RelayConfig, RelayHandle, RelayOptions, RelayRole, TunnelEnd,
    TunnelTarget,
};
use sluice_session::Token;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A backend that answers each connection, after the client's EOF, with `got <n>` and closes.
/// Connections it accepts are counted; the first `close_first` are closed at once.
async fn spawn_backend(close_first: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            if count.fetch_add(1, SeqCst) < close_first {
                continue; // dropped: closed
            }
            tokio::spawn(async move {
                let mut all = Vec::new();
                conn.read_to_end(&mut all).await.unwrap();
                let reply = format!("got {}", all.len());
                conn.write_all(reply.as_bytes()).await.unwrap();
            });
        }
    });
    (addr, accepted)
}

/// Starts `config`'s relay; returns its handle.
fn start(config: RelayConfig) -> RelayHandle {
    let relay = Relay::bind(&config).unwrap();
    let handle = relay.handle();
    tokio::spawn(relay.run(std::future::pending(), Duration::ZERO));
    handle
}

/// Sends `payload`, half-closes, and returns everything read until the peer's EOF.
async fn exchange(addr: SocketAddr, payload: &[u8]) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    // The write may fail when a relay refuses: what was read tells.
    let _ = conn.write_all(payload).await;
    let _ = conn.shutdown().await;
    let mut reply = Vec::new();
    let _ = conn.read_to_end(&mut reply).await;
    String::from_utf8(reply).unwrap()
}

/// A relay on a free loopback port with the configuration's default options.
fn relay(name: &str, role: RelayRole) -> RelayConfig {
    let options = RelayOptions {
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(300),
        max_connections: 10_000,
        nodelay: true,
        congestion: None,
        socket_buffer: None,
        splice: true,
        sockmap: false,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let name = name.to_owned();
    RelayConfig {
        name,
        addr,
        role,
        options,
    }
}

fn plain(to: SocketAddr) -> RelayConfig {
    let forward = Forward {
        to: to.into(),
        tunnel: None,
        pool: 0,
        early_connect: false,
    };
    relay("edge", RelayRole::Forward(forward))
}

/// `config`, an entry relay or forwarder, with `edit` applied to its forwarding.
fn forward(mut config: RelayConfig, edit: impl FnOnce(&mut Forward)) -> RelayConfig {
    let RelayRole::Forward(f) = &mut config.role else {
        panic!("not a forwarding relay");
    };
    edit(f);
    config
}

fn tunnel_end(allow: SocketAddr) -> RelayConfig {
    tunnel_allowing(&format!("{}/32", allow.ip()), allow.port(), |_, _| {})
}

/// A tunnel end allowing `net` on `port`, with `edit` applied to its options and its end.
fn tunnel_allowing(
    net: &str,
    port: u16,
    edit: impl FnOnce(&mut RelayOptions, &mut TunnelEnd),
) -> RelayConfig {
    let mut end = TunnelEnd {
        tokens: vec![Token(b"right-token".to_vec())],
        allow: vec![AllowedTarget {
            net: net.parse().unwrap(),
            port,
        }],
        preamble_timeout: Duration::from_secs(2),
        max_unauthenticated: 1024,
        pool_targets: Vec::new(),
        pool: 0,
    };
    let mut config = relay("core", RelayRole::Tunnel(end.clone()));
    edit(&mut config.options, &mut end);
    config.role = RelayRole::Tunnel(end);
    config
}

fn entry(core: SocketAddr, target: SocketAddr, token: &str) -> RelayConfig {
    forward(plain(core), |f| {
        f.tunnel = Some(TunnelTarget {
            target,
            token: Token(token.as_bytes().to_vec()),
        });
    })
}

/// Polls `cond` until it holds (a background task's progress), failing after 10 s.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

/// Each relay says where it listens and what it is, as the HTTP listeners do.
#[tokio::test(flavor = "current_thread")]
async fn each_relay_logs_where_it_listens_and_what_it_is() {
    let logs = capture::Logs::start();
    let (backend, _) = spawn_backend(0).await;
    let core = start(tunnel_end(backend)).addr;
    let edge = start(entry(core, backend, "right-token")).addr;
    let forwarder = start(plain(backend)).addr;
    let relays = [(core, "tunnel"), (edge, "entry"), (forwarder, "forwarder")];
    let line = |addr: SocketAddr, mode: &str| {
        let (addr, mode) = (format!("addr={addr}"), format!("mode=\"{mode}\""));
        logs.lines_with(&["INFO", "relay listening", &addr, &mode])
    };
    eventually("every relay logged its listening line", || {
        relays
            .iter()
            .all(|&(addr, mode)| !line(addr, mode).is_empty())
    })
    .await;
    for (addr, mode) in relays {
        assert_eq!(line(addr, mode).len(), 1, "{mode} at {addr}");
    }
}

#[tokio::test]
async fn plain_forwarding_carries_a_megabyte_each_way_of_a_half_close() {
    let (backend, _) = spawn_backend(0).await;
    let payload = vec![7u8; 1 << 20];
    for splice in [true, false] {
        let mut config = plain(backend);
        config.options.splice = splice;
        let relay = &start(config);
        // The reply only comes after the backend saw the client's FIN through the relay.
        assert_eq!(
            exchange(relay.addr, &payload).await,
            "got 1048576",
            "splice = {splice}"
        );
        let stats = relay.stats.snapshot();
        assert_eq!(
            (stats.bytes_up, stats.bytes_down),
            (1 << 20, 11),
            "splice = {splice}"
        );
    }
}

#[tokio::test]
async fn a_tunnel_relays_with_the_right_token_to_an_allowed_target() {
    let (backend, accepted) = spawn_backend(0).await;
    let core = start(tunnel_end(backend)).addr;
    let edge = &start(entry(core, backend, "right-token"));
    assert_eq!(exchange(edge.addr, b"hello").await, "got 5");
    assert_eq!(accepted.load(SeqCst), 1);
}

#[tokio::test]
async fn a_tunnel_refuses_no_token_a_wrong_token_and_a_target_not_allowed() {
    let (backend, accepted) = spawn_backend(0).await;
    let (elsewhere, elsewhere_accepted) = spawn_backend(0).await;
    let core = &start(tunnel_end(backend));
    // No preamble at all: bytes a client would send straight to the tunnel end.
    assert_eq!(exchange(core.addr, b"GET / HTTP/1.1\r\n\r\n").await, "");
    let wrong = &start(entry(core.addr, backend, "wrong-token"));
    assert_eq!(exchange(wrong.addr, b"hello").await, "");
    let not_allowed = &start(entry(core.addr, elsewhere, "right-token"));
    assert_eq!(exchange(not_allowed.addr, b"hello").await, "");
    assert_eq!(accepted.load(SeqCst), 0);
    assert_eq!(elsewhere_accepted.load(SeqCst), 0);
    assert_eq!(core.stats.snapshot().refused, 3);
}

/// The namespace's default congestion control, and another one this process may set (from
/// `tcp_allowed_congestion_control`, which binds only a process without CAP_NET_ADMIN): a
/// socket that uses the other was set to it.
fn default_and_other_congestion() -> (String, String) {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{f}")).unwrap();
    let default = read("tcp_congestion_control").trim().to_owned();
    let allowed = read("tcp_allowed_congestion_control");
    let other = allowed.split_whitespace().find(|c| *c != default);
    let other = other.expect("a second allowed congestion control (reno is built in)");
    (default, other.to_owned())
}

/// The congestion control `ss -ti` reports for each established TCP socket `filter` selects.
fn congestion_of(filter: &str) -> Vec<String> {
    let out = std::process::Command::new("ss")
        .args(["-tinH", "state", "established", filter])
        .output()
        .expect("ss (iproute2)");
    assert!(out.status.success(), "ss {filter}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    // Each socket is an address line, then (indented) its details, the algorithm first.
    let lines = text.lines().filter(|l| l.starts_with(char::is_whitespace));
    let names = lines.filter_map(|l| l.split_whitespace().next().map(str::to_owned));
    names.collect()
}

/// `congestion` is set on the sockets a relay connects and on those a tunnel end accepts: both
/// ends of the leg between relays, the tunnel end's side sending the answers back. The entry
/// relay's client keeps the default.
#[tokio::test]
async fn congestion_control_is_set_on_both_ends_of_the_leg_between_relays() {
    let (default, cc) = default_and_other_congestion();
    let (backend, accepted) = spawn_backend(0).await;
    let mut core = tunnel_end(backend);
    core.options.congestion = Some(cc.clone());
    let core = start(core).addr;
    let mut edge = entry(core, backend, "right-token");
    edge.options.congestion = Some(cc.clone());
    let edge = &start(edge);
    let mut client = TcpStream::connect(edge.addr).await.unwrap();
    client.write_all(b"held").await.unwrap();
    eventually("the chain reaches the backend", || {
        accepted.load(SeqCst) == 1
    })
    .await;
    let tunnel_side = congestion_of(&format!("( src {core} )"));
    let entry_side = congestion_of(&format!("( dst {core} )"));
    let clients_side = congestion_of(&format!("( src {} )", edge.addr));
    assert_eq!(tunnel_side, [cc.as_str()], "the tunnel end's accepted leg");
    assert_eq!(entry_side, [cc.as_str()], "the entry relay's connection");
    assert_eq!(clients_side, [default.as_str()], "the entry relay's client");
    client.shutdown().await.unwrap();
    let mut reply = String::new();
    client.read_to_string(&mut reply).await.unwrap();
    assert_eq!(reply, "got 4");
}

/// A target `::ffff:127.0.0.1` is 127.0.0.1: an IPv6 `allow` range does not reach it, the
/// IPv4 entry for it does (and the tunnel end connects to it as IPv4).
#[tokio::test]
async fn an_ipv4_mapped_target_is_matched_and_connected_as_ipv4() {
    let (backend, accepted) = spawn_backend(0).await;
    let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{}", backend.port())
        .parse()
        .unwrap();
    let any_v6 = &start(tunnel_allowing("::/0", backend.port(), |_, _| {}));
    let edge = &start(entry(any_v6.addr, mapped, "right-token"));
    assert_eq!(exchange(edge.addr, b"hello").await, "");
    assert_eq!(
        accepted.load(SeqCst),
        0,
        "an IPv6 range reached an IPv4 service"
    );
    assert_eq!(any_v6.stats.snapshot().refused, 1);
    let v4 = &start(tunnel_end(backend));
    let edge = &start(entry(v4.addr, mapped, "right-token"));
    assert_eq!(exchange(edge.addr, b"hello").await, "got 5");
}

#[tokio::test]
async fn the_pool_replaces_connections_the_peer_closed() {
    // The backend closes the first two connections: the ones the pool opened first.
    let (backend, accepted) = spawn_backend(2).await;
    let relay = &start(forward(plain(backend), |f| f.pool = 2));
    eventually("the dead pooled connections are replaced", || {
        let s = relay.stats.snapshot();
        s.pool_dead >= 2 && s.pool_idle == 2
    })
    .await;
    assert_eq!(exchange(relay.addr, b"pooled").await, "got 6");
    let stats = relay.stats.snapshot();
    assert_eq!(
        stats.pool_misses, 0,
        "the client took a live pooled connection"
    );
    assert!(accepted.load(SeqCst) >= 4);
}

#[tokio::test]
async fn a_pooled_tunnel_is_authenticated_before_the_client_comes() {
    let (backend, _) = spawn_backend(0).await;
    let core = &start(tunnel_end(backend));
    let edge = &start(forward(entry(core.addr, backend, "right-token"), |f| {
        f.pool = 3
    }));
    eventually("the pool is full", || edge.stats.snapshot().pool_idle == 3).await;
    assert_eq!(exchange(edge.addr, b"hi").await, "got 2");
    assert_eq!(edge.stats.snapshot().pool_misses, 0);
    // A pool with a wrong token is closed by the tunnel end, seen dead, and never used.
    let wrong = &start(forward(entry(core.addr, backend, "wrong-token"), |f| {
        f.pool = 1
    }));
    eventually("the refused pooled connection is seen dead", || {
        wrong.stats.snapshot().pool_dead >= 1
    })
    .await;
}

#[tokio::test]
async fn a_tunnel_end_keeps_connections_to_its_pool_targets_ready() {
    let (backend, accepted) = spawn_backend(0).await;
    let config = tunnel_allowing("127.0.0.1/32", backend.port(), |_, end| {
        end.pool_targets = vec![backend];
        end.pool = 2;
    });
    let core = &start(config);
    // Connected before any client.
    eventually("the tunnel end's pool is full", || {
        core.stats.snapshot().pool_idle == 2
    })
    .await;
    assert_eq!(accepted.load(SeqCst), 2);
    let edge = &start(entry(core.addr, backend, "right-token"));
    assert_eq!(exchange(edge.addr, b"pooled").await, "got 6");
    // The client's last leg was a pooled connection: no connect for it, a miss counted never.
    let stats = core.stats.snapshot();
    assert_eq!(stats.pool_misses, 0);
    eventually("the pool refilled", || core.stats.snapshot().pool_idle == 2).await;
    assert_eq!(accepted.load(SeqCst), 3, "one used, one refill");
}

#[tokio::test]
async fn a_tunnel_end_connects_to_targets_outside_its_pool_as_before() {
    let (pooled, _) = spawn_backend(0).await;
    let (unpooled, accepted) = spawn_backend(0).await;
    let config = tunnel_allowing("127.0.0.1/32", unpooled.port(), |_, end| {
        end.allow.push(AllowedTarget {
            net: "127.0.0.1/32".parse().unwrap(),
            port: pooled.port(),
        });
        end.pool_targets = vec![pooled];
        end.pool = 1;
    });
    let core = &start(config);
    let edge = &start(entry(core.addr, unpooled, "right-token"));
    assert_eq!(exchange(edge.addr, b"direct").await, "got 6");
    assert_eq!(accepted.load(SeqCst), 1);
}

/// A next hop that closes every connection at once, as a tunnel end refusing a token does;
/// `too_many` fires when more than `limit` have come.
async fn refusing_hop(limit: usize) -> (SocketAddr, tokio::sync::oneshot::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (too_many, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        for _ in 0..=limit {
            drop(listener.accept().await.unwrap());
        }
        let _ = too_many.send(());
    });
    (addr, rx)
}

/// A pool whose connections are closed right after the preamble dials less and less often:
/// nine refills of two in two minutes (after 0.5 s, 1 s, 2 s, ... up to 30 s between them),
/// where it used to redial at once, for ever.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_pool_whose_connections_are_refused_backs_off() {
    let (hop, too_many) = refusing_hop(24).await;
    let target = "127.0.0.1:9".parse().unwrap();
    let _edge = start(forward(entry(hop, target, "wrong-token"), |f| f.pool = 2));
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(120)) => {}
        _ = too_many => panic!("more than 24 dials in two minutes"),
    }
}

/// Once pooled connections work again, the backoff is forgotten: a connection taken is
/// replaced at once, not after the wait the refused ones had built up.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_pool_that_works_again_refills_at_once() {
    // The first eight connections (four refills of two) are closed at once.
    let (backend, accepted) = spawn_backend(8).await;
    let relay = &start(forward(plain(backend), |f| f.pool = 2));
    // A minute of paused time: the refused refills are over, the fifth one stays.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(accepted.load(SeqCst), 10);
    assert_eq!(relay.stats.snapshot().pool_idle, 2);
    assert_eq!(exchange(relay.addr, b"pooled").await, "got 6");
    let refilled = eventually("the taken one is replaced", || {
        relay.stats.snapshot().pool_idle == 2
    });
    tokio::time::timeout(Duration::from_millis(400), refilled)
        .await
        .expect("the refill waited out an old backoff");
}

/// The entry relay says why its pool keeps emptying.
#[tokio::test(flavor = "current_thread")]
async fn an_entry_relay_warns_when_its_pooled_connections_are_refused() {
    let logs = capture::Logs::start();
    let (backend, _) = spawn_backend(0).await;
    let core = &start(tunnel_end(backend));
    let _edge = start(forward(entry(core.addr, backend, "wrong-token"), |f| {
        f.pool = 1
    }));
    let to = format!("to={}", core.addr);
    let warned = || {
        logs.lines_with(&[
            "WARN",
            "closed right after the preamble",
            "wrong token",
            &to,
        ])
    };
    eventually("the entry relay warned", || !warned().is_empty()).await;
    assert!(warned()[0].contains("relay=edge"), "{:?}", warned());
}

/// A tunnel end logs its refusals once per interval for each kind, with a count, not one line
/// per refused connection.
#[tokio::test(flavor = "current_thread")]
async fn a_tunnel_end_logs_repeated_refusals_once_with_a_count() {
    let logs = capture::Logs::start();
    let (backend, _) = spawn_backend(0).await;
    let core = &start(tunnel_end(backend));
    let wrong = &start(entry(core.addr, backend, "wrong-token"));
    for _ in 0..5 {
        assert_eq!(exchange(wrong.addr, b"hello").await, "");
    }
    assert_eq!(core.stats.snapshot().refused, 5);
    let lines = logs.lines_with(&["tunnel connections refused"]);
    assert!(!lines.is_empty() && lines.len() < 5, "{lines:?}");
    let first = &lines[0];
    for part in [
        "WARN",
        "relay=core",
        "unknown token",
        "refused=1",
        "peer.addr=127.0.0.1:",
    ] {
        assert!(first.contains(part), "{part} in {first}");
    }
}

/// Silent connections to a tunnel end do not count towards `max_connections`: with 8 of them
/// open and a limit of 2, an authenticated client is relayed at once. (Before, each held a
/// slot for the preamble's whole wait, here an hour.)
#[tokio::test]
async fn silent_connections_do_not_hold_a_tunnel_ends_slots() {
    let (backend, _) = spawn_backend(0).await;
    let net = format!("{}/32", backend.ip());
    let core = &start(tunnel_allowing(&net, backend.port(), |opts, end| {
        opts.max_connections = 2;
        opts.connect_timeout = Duration::from_secs(3600);
        end.preamble_timeout = Duration::from_secs(60);
    }));
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(TcpStream::connect(core.addr).await.unwrap());
    }
    let edge = &start(entry(core.addr, backend, "right-token"));
    let reply = tokio::time::timeout(Duration::from_secs(10), exchange(edge.addr, b"hello"))
        .await
        .expect("the authenticated client waited behind silent connections");
    assert_eq!(reply, "got 5");
    assert_eq!(
        core.stats.snapshot().active,
        8,
        "the silent ones are still open"
    );
}

/// A connection that sends no token within `preamble_timeout` is closed, however long the
/// other timeouts are.
#[tokio::test]
async fn a_silent_connection_is_closed_after_the_preamble_timeout() {
    let (backend, _) = spawn_backend(0).await;
    let net = format!("{}/32", backend.ip());
    let core = &start(tunnel_allowing(&net, backend.port(), |opts, end| {
        opts.connect_timeout = Duration::from_secs(3600);
        opts.idle_timeout = Duration::from_secs(3600);
        end.preamble_timeout = Duration::from_millis(50);
    }));
    let mut silent = TcpStream::connect(core.addr).await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut rest))
        .await
        .expect("the silent connection was closed");
    assert!(read.is_err() || rest.is_empty(), "{read:?} {rest:?}");
    eventually("the tunnel end let it go", || {
        core.stats.snapshot().active == 0
    })
    .await;
}

/// `max_unauthenticated` bounds the connections waiting for their token: beyond it, a new one
/// takes the place of the oldest still waiting (from the address holding the most), which is
/// closed, so the bound holds without making new connections wait behind silent ones.
#[tokio::test]
async fn unauthenticated_connections_are_bounded_on_their_own() {
    let (backend, _) = spawn_backend(0).await;
    let net = format!("{}/32", backend.ip());
    let core = &start(tunnel_allowing(&net, backend.port(), |_, end| {
        end.max_unauthenticated = 2;
        end.preamble_timeout = Duration::from_secs(3600);
    }));
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(TcpStream::connect(core.addr).await.unwrap());
        let n = silent.len() as u64;
        eventually("each is accepted", || core.stats.snapshot().accepted == n).await;
    }
    // The oldest was closed for the third.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), silent[0].read_to_end(&mut rest))
        .await
        .expect("the oldest silent connection was closed");
    assert!(read.is_err() || rest.is_empty(), "{read:?} {rest:?}");
    eventually("two wait for their token", || {
        core.stats.snapshot().active == 2
    })
    .await;
}

/// Connects to `to` from `from` (another loopback address: 127.0.0.0/8 is all loopback).
async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(to).await.unwrap()
}

/// Issue 47, finding 9: silent connections filling `max_unauthenticated` made an honest
/// client wait in the accept queue until they timed out (`preamble_timeout`, an hour here; 8 s
/// behind 200 in the probe). Now the oldest silent one is closed for each newcomer, so an
/// authenticated tunnel goes through at once, whether the flood came before it or keeps coming
/// from another address while it authenticates.
#[tokio::test]
async fn a_flood_of_silent_connections_does_not_delay_an_authenticated_tunnel() {
    let (backend, _) = spawn_backend(0).await;
    let net = format!("{}/32", backend.ip());
    let core = &start(tunnel_allowing(&net, backend.port(), |opts, end| {
        opts.connect_timeout = Duration::from_secs(3600);
        end.max_unauthenticated = 4;
        end.preamble_timeout = Duration::from_secs(3600);
    }));
    // Before: 50 silent connections from the honest client's own address.
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(TcpStream::connect(core.addr).await.unwrap());
    }
    let edge = &start(entry(core.addr, backend, "right-token"));
    let reply = tokio::time::timeout(Duration::from_secs(10), exchange(edge.addr, b"hello"))
        .await
        .expect("the authenticated client waited behind silent connections");
    assert_eq!(reply, "got 5");
    // Meanwhile: a flood from another address that keeps coming (bounded) while clients of
    // the entry relay authenticate, each on a new tunnel connection.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooded = Arc::new(AtomicUsize::new(0));
    let (flooding, count) = (Arc::clone(&stop), Arc::clone(&flooded));
    let target = core.addr;
    let flood = tokio::spawn(async move {
        let mut open = std::collections::VecDeque::new();
        for _ in 0..5000 {
            if flooding.load(SeqCst) {
                break;
            }
            open.push_back(connect_from([127, 0, 0, 2], target).await);
            count.fetch_add(1, SeqCst);
            if open.len() > 200 {
                open.pop_front();
            }
        }
    });
    eventually("the flood is under way", || flooded.load(SeqCst) >= 100).await;
    for i in 0..5 {
        let payload = vec![b'x'; i + 1];
        let reply = tokio::time::timeout(Duration::from_secs(10), exchange(edge.addr, &payload))
            .await
            .expect("an authenticated client waited behind the flood");
        assert_eq!(reply, format!("got {}", i + 1));
    }
    stop.store(true, SeqCst);
    flood.await.unwrap();
    let refused = core.stats.snapshot().refused;
    assert!(refused >= 100, "the flood was shed: {refused}");
}

/// Whether this thread may open packet sockets.
fn has_net_raw() -> bool {
    let caps = rustix::thread::capabilities(None).unwrap();
    caps.effective
        .contains(rustix::thread::CapabilitySet::NET_RAW)
}

#[tokio::test(flavor = "current_thread")]
async fn early_connect_falls_back_to_connect_on_accept_without_cap_net_raw() {
    // Capabilities are per thread; this runtime runs on this test's thread only.
    let mut caps = rustix::thread::capabilities(None).unwrap();
    caps.effective
        .remove(rustix::thread::CapabilitySet::NET_RAW);
    rustix::thread::set_capabilities(None, caps).unwrap();
    assert!(!has_net_raw());
    let (backend, _) = spawn_backend(0).await;
    let relay = &start(forward(plain(backend), |f| f.early_connect = true));
    assert!(!relay.early_connect());
    assert_eq!(exchange(relay.addr, b"fallback").await, "got 8");
    assert_eq!(relay.stats.snapshot().early, 0);
}

#[tokio::test(flavor = "current_thread")]
async fn early_connect_starts_the_next_leg_on_the_syn_with_cap_net_raw() {
    if !has_net_raw() {
        eprintln!("skipped: needs CAP_NET_RAW (root); CI runs as root");
        return;
    }
    let (backend, _) = spawn_backend(0).await;
    let relay = &start(forward(plain(backend), |f| f.early_connect = true));
    assert!(relay.early_connect());
    assert_eq!(exchange(relay.addr, b"early").await, "got 5");
    let stats = relay.stats.snapshot();
    assert_eq!(stats.early, 1, "one next-leg connect started on the SYN");
    assert_eq!(stats.connects, 1, "and it was the one used");
}

/// Binds `config`'s relay and runs it until the returned sender fires (or drops).
fn start_stoppable(
    config: RelayConfig,
    grace: Duration,
) -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let relay = Relay::bind(&config).unwrap();
    let addr = relay.handle().addr;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    (addr, stop, tokio::spawn(relay.run(shutdown, grace)))
}

/// A relay that stops refuses new connections but lets those under way finish within the
/// grace, and returns once they have.
#[tokio::test]
async fn a_stopping_relay_drains_its_connections_within_the_grace() {
    let (backend, accepted) = spawn_backend(0).await;
    let (addr, stop, task) = start_stoppable(plain(backend), Duration::from_secs(10));
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"hello").await.unwrap();
    eventually("the relay reached the backend", || {
        accepted.load(SeqCst) == 1
    })
    .await;
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !task.is_finished(),
        "the relay stopped with a connection under way"
    );
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "a stopped relay accepted a new connection"
    );
    conn.write_all(b" world").await.unwrap();
    conn.shutdown().await.unwrap();
    let mut reply = Vec::new();
    conn.read_to_end(&mut reply).await.unwrap();
    assert_eq!(reply, b"got 11");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the relay returned once its connection ended")
        .unwrap();
}

/// A connection still open when the grace ends is closed, and the relay returns.
#[tokio::test]
async fn a_relayed_connection_still_open_when_the_grace_ends_is_closed() {
    let (backend, accepted) = spawn_backend(0).await;
    let (addr, stop, task) = start_stoppable(plain(backend), Duration::from_millis(300));
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"hello").await.unwrap();
    eventually("the relay reached the backend", || {
        accepted.load(SeqCst) == 1
    })
    .await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the relay returned after the grace")
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest))
        .await
        .expect("the relayed connection was closed");
    assert!(read.is_err() || rest.is_empty(), "{read:?} {rest:?}");
}

#[tokio::test]
async fn a_next_hop_with_several_addresses_is_tried_in_turn_past_one_that_refuses() {
    // A port nothing listens on any more: connects to it are refused.
    let refused = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let (live, accepted) = spawn_backend(0).await;
    let config = forward(plain(live), |f| {
        f.to = sluice_relay::NextHop::Addrs(vec![refused, live]);
    });
    let handle = start(config);
    // Each connection starts at the next address: one of these two starts at the refusing one.
    for _ in 0..2 {
        assert_eq!(exchange(handle.addr, b"hello").await, "got 5");
    }
    assert_eq!(accepted.load(SeqCst), 2);
    assert_eq!(handle.stats.snapshot().refused, 0);
}
