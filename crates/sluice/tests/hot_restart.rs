//! Hot restart through the library API (the `sluice` binary's `--upgrade` is tested end to
//! end in tests/interop): a second `Proxy` takes over the first one's listener, acceptor and
//! idle sessions, and the first one's `run_until` returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::path::Path;

use http::StatusCode;
use reverse_support::{get, Service, ServiceSpec};
use sluice::Inherited;
use sluice::Proxy;

fn config(dir: &Path, unix: bool) -> sluice::config::Config {
    let unix = if unix {
        "unix = \"acceptor.sock\"\n"
    } else {
        ""
    };
    let text = format!(
        "[runtime]\nupgrade_socket = \"upgrade.sock\"\nshutdown_grace = \"5s\"\n\
         [acceptor]\nlisten = \"127.0.0.1:0\"\nhandshakes_per_second = 0\n{unix}\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ncluster = \"api\"\n[cluster.api]\nkind = \"reverse\"\n\
         [[relay]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\nto = \"127.0.0.1:9\"\n"
    );
    sluice::config::parse_str(&text, &dir.join("test.toml").display().to_string(), dir).unwrap()
}

#[tokio::test]
async fn a_successor_takes_the_sockets_and_the_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), true);
    let old = Proxy::bind(&cfg).await.unwrap();
    let (http, acceptor) = (old.local_addrs()[0].1, old.acceptor_addr().unwrap());
    let relay = old.relays()[0].addr;
    let old_cluster = old.reverse_cluster("api").unwrap().clone();
    let old_run = tokio::spawn(old.run_until(std::future::pending()));
    let svc = Service::start(acceptor, ServiceSpec::new("a", 3)).await;
    old_cluster
        .wait_until(|c| c.idle_sessions("default") == 3)
        .await;
    assert_eq!(get(http, "/").await.status, StatusCode::OK);

    let inherited = Inherited::take_over(&dir.path().join("upgrade.sock"))
        .await
        .unwrap();
    let new = Proxy::bind_inheriting(&cfg, Some(inherited)).await.unwrap();
    assert_eq!(new.local_addrs()[0].1, http, "the same listening socket");
    assert_eq!(new.acceptor_addr().unwrap(), acceptor);
    assert_eq!(
        new.relays()[0].addr,
        relay,
        "the relay's listening socket too"
    );
    let new_cluster = new.reverse_cluster("api").unwrap().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let new_run = tokio::spawn(new.run_until(async move {
        let _ = stopped.await;
    }));
    old_run.await.unwrap();
    new_cluster
        .wait_until(|c| c.idle_sessions("default") == 3)
        .await;
    assert_eq!(old_cluster.sessions(), 0);
    assert_eq!(get(http, "/").await.status, StatusCode::OK);
    assert_eq!(svc.requests(), 2);
    // The acceptor's UNIX socket went to the successor: the old process left the file.
    assert!(dir.path().join("acceptor.sock").exists());
    let _ = stop.send(());
    new_run.await.unwrap();
    assert!(
        !dir.path().join("acceptor.sock").exists(),
        "removed by its last owner"
    );
}

#[tokio::test]
async fn http2_sessions_end_in_the_old_process_and_register_again_with_the_new() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), false);
    let old = Proxy::bind(&cfg).await.unwrap();
    let (http, acceptor) = (old.local_addrs()[0].1, old.acceptor_addr().unwrap());
    let old_cluster = old.reverse_cluster("api").unwrap().clone();
    let old_run = tokio::spawn(old.run_until(std::future::pending()));
    let h1 = Service::start(acceptor, ServiceSpec::new("h1", 1)).await;
    let h2 = Service::start(acceptor, ServiceSpec::h2("h2", 1, 4)).await;
    old_cluster
        .wait_until(|c| c.idle_sessions("default") == 5)
        .await;

    let inherited = Inherited::take_over(&dir.path().join("upgrade.sock"))
        .await
        .unwrap();
    let new = Proxy::bind_inheriting(&cfg, Some(inherited)).await.unwrap();
    let new_cluster = new.reverse_cluster("api").unwrap().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let new_run = tokio::spawn(new.run_until(async move {
        let _ = stopped.await;
    }));
    old_run.await.unwrap();
    // The HTTP/1.1 session moved; the HTTP/2 one could not, and was closed.
    h2.wait_live(0).await;
    assert_eq!(h1.live(), 1);
    new_cluster
        .wait_until(|c| c.idle_sessions("default") == 1)
        .await;
    // Its service dials again, and reaches the new process through the same acceptor socket.
    let again = Service::start(acceptor, ServiceSpec::h2("h2", 1, 4)).await;
    new_cluster
        .wait_until(|c| c.idle_sessions("default") == 5)
        .await;
    for _ in 0..5 {
        assert_eq!(get(http, "/").await.status, StatusCode::OK);
    }
    assert_eq!(h1.requests() + again.requests(), 5);
    let _ = stop.send(());
    new_run.await.unwrap();
}

#[tokio::test]
async fn without_a_successor_the_acceptor_removes_its_socket_file() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::bind(&config(dir.path(), true)).await.unwrap();
    assert!(dir.path().join("acceptor.sock").exists());
    proxy.run_until(async {}).await;
    assert!(!dir.path().join("acceptor.sock").exists());
}

/// A crash (SIGKILL) leaves the acceptor's UNIX socket file behind: the next start replaces
/// it, while a socket some live process listens on is never taken.
#[tokio::test]
async fn a_socket_file_left_by_a_crash_does_not_stop_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acceptor.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(
        path.exists(),
        "a dropped listener leaves its file, as a crash does"
    );
    let proxy = Proxy::bind(&config(dir.path(), true)).await.unwrap();
    let served = tokio::net::UnixStream::connect(&path).await;
    assert!(served.is_ok(), "the new acceptor listens on the path");
    drop(served);
    proxy.run_until(async {}).await;

    let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let refused = Proxy::bind(&config(dir.path(), true)).await.unwrap_err();
    assert!(
        refused.to_string().contains("another process is listening"),
        "{refused}"
    );
    drop(live);
}

#[tokio::test]
async fn taking_over_from_nobody_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Inherited::take_over(&dir.path().join("upgrade.sock"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("upgrade.sock"), "{err}");
}

/// A relay whose pipes the kernel splices (`sockmap = true`, issue 54) through a hot restart:
/// the pipe the old process holds keeps carrying bytes, spliced, until its client closes it,
/// while the successor takes new connections on the same socket and splices them too; the
/// old process ends when its last pipe has. Needs CAP_BPF and CAP_NET_ADMIN (root, as the
/// test command runs): without them the program does not load, which the test reports.
#[tokio::test]
async fn a_sockmap_relays_pipes_live_through_a_hot_restart() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let to = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((conn, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    async fn round_trip(conn: &mut tokio::net::TcpStream, what: &[u8]) {
        conn.write_all(what).await.unwrap();
        let mut back = vec![0; what.len()];
        conn.read_exact(&mut back).await.unwrap();
        assert_eq!(back, what);
    }
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[runtime]\nupgrade_socket = \"upgrade.sock\"\nshutdown_grace = \"30s\"\n\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ndirect_response = {{ status = 204 }}\n\
         [[relay]]\nname = \"edge\"\nlisten = \"127.0.0.1:0\"\nto = \"{to}\"\nsockmap = true\n"
    );
    let path = dir.path().join("test.toml").display().to_string();
    let cfg = sluice::config::parse_str(&text, &path, dir.path()).unwrap();
    let old = Proxy::bind(&cfg).await.unwrap();
    let old_relay = old.relays().remove(0);
    assert!(
        old_relay.sockmap(),
        "the sockmap program did not load (needs CAP_BPF and CAP_NET_ADMIN, e.g. root)"
    );
    let old_run = tokio::spawn(old.run_until(std::future::pending()));
    let mut held = tokio::net::TcpStream::connect(old_relay.addr)
        .await
        .unwrap();
    round_trip(&mut held, b"before").await;

    let inherited = Inherited::take_over(&dir.path().join("upgrade.sock"))
        .await
        .unwrap();
    let new = Proxy::bind_inheriting(&cfg, Some(inherited)).await.unwrap();
    let new_relay = new.relays().remove(0);
    assert_eq!(
        new_relay.addr, old_relay.addr,
        "the relay's socket went over"
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let new_run = tokio::spawn(new.run_until(async move {
        let _ = stopped.await;
    }));
    // The old process still holds its pipe, and the kernel still splices it.
    round_trip(&mut held, b"during the hand-over").await;
    let mut fresh = tokio::net::TcpStream::connect(new_relay.addr)
        .await
        .unwrap();
    round_trip(&mut fresh, b"to the successor").await;
    round_trip(&mut held, b"after").await;
    let (old_stats, new_stats) = (old_relay.stats.snapshot(), new_relay.stats.snapshot());
    assert_eq!(old_stats.accepted, 1, "{old_stats:?}");
    assert_eq!(new_stats.accepted, 1, "{new_stats:?}");
    assert_eq!(
        (old_stats.kernel_spliced, new_stats.kernel_spliced),
        (1, 1),
        "each process spliced its own pipe in the kernel: {old_stats:?} {new_stats:?}"
    );
    assert!(!old_run.is_finished(), "the old process waits for its pipe");
    held.shutdown().await.unwrap();
    let mut rest = Vec::new();
    held.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    tokio::time::timeout(std::time::Duration::from_secs(20), old_run)
        .await
        .expect("the old process ends once its last pipe has")
        .unwrap();
    round_trip(&mut fresh, b"still").await;
    fresh.shutdown().await.unwrap();
    fresh.read_to_end(&mut rest).await.unwrap();
    let _ = stop.send(());
    new_run.await.unwrap();
}
