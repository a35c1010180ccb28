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

/// A relay whose pipes the kernel splices (`sockmap = true`) says so in `/status`, with the
/// connections and bytes the kernel forwarded (issue 54). Needs CAP_BPF and CAP_NET_ADMIN
/// (root, as the test command runs).
#[tokio::test]
async fn a_sockmap_relay_shows_what_the_kernel_spliced_in_status() {
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((conn, _)) = backend.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    let text = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[relay]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\nto = \"{backend_addr}\"\nsockmap = true\n"
    );
    let config = sluice::config::parse_str(&text, "relay.toml", Path::new(".")).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let handle = proxy.relays().remove(0);
    assert!(handle.sockmap(), "the program did not load (needs root)");
    let admin = proxy.admin_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(proxy.run_until(async move {
        let _ = stopped.await;
    }));
    let mut conn = TcpStream::connect(handle.addr).await.unwrap();
    let mut back = [0u8; 1];
    conn.write_all(b"a").await.unwrap();
    conn.read_exact(&mut back).await.unwrap();
    // Past the first byte the sockets are in the map: these go through the kernel alone.
    conn.write_all(&[7u8; 4096]).await.unwrap();
    conn.shutdown().await.unwrap();
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest.len(), 4096);
    for _ in 0..500 {
        if handle.stats.snapshot().active == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let status: serde_json::Value = serde_json::from_str(&get(admin, "/status").await).unwrap();
    let relay = &status["relays"][0];
    assert_eq!(relay["sockmap"], true, "{relay}");
    assert_eq!(relay["kernel_spliced"], 1, "{relay}");
    // Every byte after the first each way, and maybe the first (the sockets may have entered
    // the map before it): `bytes_up` + `bytes_down` is 2 * 4097.
    let kernel = relay["bytes_kernel"].as_u64().unwrap();
    assert!((2 * 4096..=2 * 4097).contains(&kernel), "{relay}");
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

/// A relay whose `to` is a name with `resolve` (issue 53): looked up with a real DNS server on
/// loopback (hickory-server) whose zone the test changes while connections are relayed. Two
/// backends on the same port of 127.0.0.2 and 127.0.0.3 say who they are, then echo.
mod next_hop_by_name {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::path::Path;

    use sluice::Proxy;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use crate::support::dns::TestDns;
    use crate::support::upstream::{wait_until, within};

    const HOST: &str = "next.sluice.test.";
    const A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
    const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

    /// A backend on `listener`: each connection's first byte is answered with `who` and a
    /// newline, the rest echoed (nothing before: a pooled connection that got bytes would be
    /// discarded as broken).
    fn backend(who: &'static str, listener: TcpListener) {
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    conn.read_exact(&mut [0u8; 1]).await?;
                    conn.write_all(format!("{who}\n").as_bytes()).await?;
                    let (mut r, mut w) = conn.split();
                    tokio::io::copy(&mut r, &mut w).await?;
                    w.shutdown().await
                });
            }
        });
    }

    /// Backends `a` and `b` on the same free port of 127.0.0.2 and 127.0.0.3.
    async fn backends() -> u16 {
        for _ in 0..20 {
            let a = TcpListener::bind((A, 0)).await.unwrap();
            let port = a.local_addr().unwrap().port();
            if let Ok(b) = TcpListener::bind((B, port)).await {
                backend("a", a);
                backend("b", b);
                return port;
            }
        }
        panic!("no port free on both 127.0.0.2 and 127.0.0.3");
    }

    /// A running proxy with the relay `edge` to `next.sluice.test:<port>` with `resolve` (and
    /// `pool`), asking `dns`.
    async fn start(dns: &TestDns, port: u16, pool: usize) -> Running {
        let text = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\
             [dns]\nnameservers = [\"{}\"]\ntimeout = \"500ms\"\n\
             [[relay]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\n\
             to = \"next.sluice.test:{port}\"\npool = {pool}\n\
             resolve = {{ min_ttl = \"100ms\", max_ttl = \"1s\" }}\n",
            dns.addr
        );
        let config = sluice::config::parse_str(&text, "relay.toml", Path::new(".")).unwrap();
        let proxy = Proxy::bind(&config).await.unwrap();
        let handle = proxy.relays().remove(0);
        let admin = proxy.admin_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(proxy.run_until(async move {
            let _ = stopped.await;
        }));
        Running {
            handle,
            admin,
            stop,
            run,
        }
    }

    struct Running {
        handle: sluice_relay::RelayHandle,
        admin: SocketAddr,
        stop: tokio::sync::oneshot::Sender<()>,
        run: tokio::task::JoinHandle<()>,
    }

    impl Running {
        async fn stop(self) {
            self.stop.send(()).unwrap();
            self.run.await.unwrap();
        }
    }

    /// A connection through the relay and who answered it (`None`: the relay closed it).
    async fn through(relay: SocketAddr) -> (TcpStream, Option<String>) {
        let mut conn = TcpStream::connect(relay).await.unwrap();
        // Refused by the relay: the write may fail; the read says.
        let _ = conn.write_all(b"?").await;
        let mut who = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            match within("the backend's name", conn.read(&mut byte)).await {
                Ok(1) if byte[0] == b'\n' => break,
                Ok(1) => who.push(byte[0]),
                _ => return (conn, None),
            }
        }
        (conn, Some(String::from_utf8(who).unwrap()))
    }

    async fn echo(conn: &mut TcpStream, bytes: &[u8]) {
        conn.write_all(bytes).await.unwrap();
        let mut back = vec![0; bytes.len()];
        within("the echo", conn.read_exact(&mut back))
            .await
            .unwrap();
        assert_eq!(back, bytes);
    }

    #[tokio::test]
    async fn new_connections_follow_the_name_and_established_ones_finish() {
        let dns = TestDns::start("sluice.test.").await;
        let port = backends().await;
        dns.set(HOST, &[A], 0).await;
        let proxy = start(&dns, port, 2).await;
        let relay = proxy.handle.addr;
        let (mut held, who) = through(relay).await;
        assert_eq!(who.as_deref(), Some("a"));
        wait_until("the pool filled", || {
            proxy.handle.stats.snapshot().pool_idle == 2
        })
        .await;

        dns.set(HOST, &[B], 0).await;
        let stats = &proxy.handle.stats;
        wait_until("the relay saw the move", || {
            stats.snapshot().dns_changes == 1
        })
        .await;
        // Every new connection goes there: the pool's connections to a are closed, not handed
        // out.
        for _ in 0..5 {
            assert_eq!(through(relay).await.1.as_deref(), Some("b"));
        }
        // The pipe relayed before the move still works, and finishes where it is.
        echo(&mut held, b"still relayed to a").await;
        held.shutdown().await.unwrap();
        let mut rest = Vec::new();
        within("a's end", held.read_to_end(&mut rest))
            .await
            .unwrap();

        // A failed lookup keeps the last addresses.
        dns.remove(HOST).await;
        wait_until("a failed lookup", || stats.snapshot().dns_failures > 0).await;
        assert_eq!(through(relay).await.1.as_deref(), Some("b"));
        let s = stats.snapshot();
        assert_eq!((s.dns_changes, s.dns_addresses), (1, 1));
        let next_hop = proxy.handle.next_hop().unwrap();
        assert_eq!(next_hop.addrs, [SocketAddr::from((B, port))]);

        let status = super::get(proxy.admin, "/status").await;
        let name = format!(
            r#""next_hop":{{"name":"next.sluice.test:{port}","addrs":["127.0.0.3:{port}"]"#
        );
        assert!(status.contains(&name), "{status}");
        let metrics = super::get(proxy.admin, "/metrics").await;
        for line in [
            "sluice_relay_dns_changes_total{relay=\"edge\"} 1",
            "sluice_relay_dns_addresses{relay=\"edge\"} 1",
        ] {
            assert!(metrics.contains(line), "{line} in {metrics}");
        }
        proxy.stop().await;
    }

    #[tokio::test]
    async fn a_name_that_has_not_resolved_refuses_clients_until_it_does() {
        let dns = TestDns::start("sluice.test.").await;
        let port = backends().await;
        let proxy = start(&dns, port, 0).await;
        let relay = proxy.handle.addr;
        assert_eq!(through(relay).await.1, None, "closed: no address yet");
        assert!(proxy.handle.stats.snapshot().refused >= 1);
        dns.set(HOST, &[A, B], 0).await;
        let mut answered = std::collections::BTreeSet::new();
        within("both addresses to answer", async {
            while answered.len() < 2 {
                if let Some(who) = through(relay).await.1 {
                    answered.insert(who);
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        proxy.stop().await;
    }
}
