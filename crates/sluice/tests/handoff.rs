//! A standalone acceptor lending one service's sessions to two consumers, in one process over
//! real sockets (the handoff socket, the acceptor, the consumers' listeners): both consumers
//! serve from the one pool, idle sessions move to the consumer whose requests wait, and the
//! service never has more requests in flight than the sessions it declared. Its admin API
//! shows what it lends to whom.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use reverse_support::{get, Service, ServiceSpec};
use sluice::{Proxy, ReverseCluster, Standalone};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running process's stand-in: a stop trigger and its task.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
    }
}

fn parse(text: &str) -> sluice::config::Config {
    sluice::config::parse_str(text, "test.toml", Path::new(".")).unwrap()
}

/// `sluice acceptor` with the cluster `api` and the admin API; returns where services dial in.
async fn standalone(socket: &Path) -> (SocketAddr, Running) {
    let (addr, _, running) = standalone_with_admin(socket).await;
    (addr, running)
}

/// [`standalone`], returning its admin API's address too.
async fn standalone_with_admin(socket: &Path) -> (SocketAddr, SocketAddr, Running) {
    let config = parse(&format!(
        "[acceptor]\nlisten = \"127.0.0.1:0\"\nhandshakes_per_second = 0\n\
         [handoff]\nlisten = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [cluster.api]\nkind = \"reverse\"\n",
        socket.display()
    ));
    let acceptor = Standalone::bind(&config).await.unwrap();
    let addr = acceptor.acceptor_addr().unwrap();
    let admin = acceptor.admin_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(acceptor.run_until(async move {
        let _ = stopped.await;
    }));
    let running = Running {
        stop: Some(stop),
        task,
    };
    (addr, admin, running)
}

/// `sluice run` whose cluster `api` draws on the acceptor at `socket`, keeping 2 idle.
async fn consumer(socket: &Path) -> (SocketAddr, ReverseCluster, Running) {
    let config = parse(&format!(
        "[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ncluster = \"api\"\n\
         [cluster.api]\nkind = \"reverse\"\nhandoff = \"{}\"\nhandoff_idle = 2\n\
         queue_timeout = \"20s\"\n",
        socket.display()
    ));
    let proxy = Proxy::bind(&config).await.unwrap();
    let http = proxy.local_addrs()[0].1;
    let cluster = proxy.reverse_cluster("api").unwrap().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run_until(async move {
        let _ = stopped.await;
    }));
    let running = Running {
        stop: Some(stop),
        task,
    };
    (http, cluster, running)
}

/// Waits (within 20 s) until `done` holds.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    waited.await.unwrap_or_else(|_| panic!("never: {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_share_one_pool_and_idle_sessions_move_to_demand() {
    const SESSIONS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("handoff.sock");
    let (acceptor, standalone) = standalone(&socket).await;
    let (a_http, a, a_run) = consumer(&socket).await;
    let (b_http, b, b_run) = consumer(&socket).await;
    let service = Service::start(acceptor, ServiceSpec::new("svc", SESSIONS)).await;
    // Credit ahead of demand: each consumer holds idle sessions before any request.
    eventually("both consumers hold sessions", || {
        a.sessions() > 0 && b.sessions() > 0
    })
    .await;
    assert_eq!(get(a_http, "/").await.status, 200);
    assert_eq!(get(b_http, "/").await.status, 200);

    // Requests that wait at the service pile up on consumer a: b's idle sessions are recalled
    // and lent to a, beyond an even split (b keeps at most one). Before the ledger lent by
    // share, b asked at once to top its idle sessions up and got the recalled one back in turn:
    // a stayed at 4 of 6, b at 2 idle.
    let waiting: Vec<_> = (0..SESSIONS)
        .map(|_| tokio::spawn(get(a_http, "/wait")))
        .collect();
    let in_flight = || service.stats.in_flight.load(Ordering::SeqCst);
    let seen = || {
        let (a_idle, b_idle) = (a.idle_sessions("default"), b.idle_sessions("default"));
        let (a_all, b_all) = (a.sessions(), b.sessions());
        format!(
            "in flight {}, a {a_all} ({a_idle} idle, {} queued), b {b_all} ({b_idle} idle)",
            in_flight(),
            a.queued("default")
        )
    };
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while in_flight() < SESSIONS - 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    waited
        .await
        .unwrap_or_else(|_| panic!("consumer a never had all but one session busy: {}", seen()));
    service.open_gate();
    for request in waiting {
        assert_eq!(request.await.unwrap().status, 200);
    }
    // One session serves one request at a time, across both consumers.
    assert!(
        service.max_in_flight() <= SESSIONS,
        "{}",
        service.max_in_flight()
    );
    assert_eq!(service.live(), SESSIONS, "no session was lost or re-dialed");
    for running in [a_run, b_run, standalone] {
        running.stop().await;
    }
}

/// A consumer that stops gives its sessions back to the acceptor (`RETURN`) instead of closing
/// them: the service keeps every connection, and the next consumer is served with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_stops_returns_its_sessions_to_the_acceptor() {
    const SESSIONS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("handoff.sock");
    let (acceptor, standalone) = standalone(&socket).await;
    let (a_http, a, a_run) = consumer(&socket).await;
    let service = Service::start(acceptor, ServiceSpec::new("svc", SESSIONS)).await;
    eventually("the consumer holds sessions", || a.sessions() > 0).await;
    assert_eq!(get(a_http, "/").await.status, 200);
    let held = a.sessions();
    tokio::time::timeout(Duration::from_secs(20), a_run.stop())
        .await
        .expect("the consumer stopped");
    assert_eq!(a.sessions(), 0, "sessions left in the stopped consumer");
    // A session closed by the consumer would show at the service a moment later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        service.live(),
        SESSIONS,
        "the stopped consumer closed sessions ({held} were lent to it)"
    );
    let (b_http, b, b_run) = consumer(&socket).await;
    eventually("the next consumer holds sessions", || b.sessions() > 0).await;
    assert_eq!(get(b_http, "/").await.status, 200);
    assert_eq!(service.live(), SESSIONS);
    for running in [b_run, standalone] {
        running.stop().await;
    }
}

/// One admin API call from loopback: the status and the body.
async fn admin(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let status = reply[9..12].parse().unwrap();
    let body = reply.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// `sluice acceptor` serves the admin API: its clusters and instances, the consumers it lends
/// to with their credit and loans, its metrics, readiness, and instance drains. Before, it
/// had no admin API at all: an operator could not see what it lent to whom.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_acceptor_shows_what_it_lends_to_whom() {
    const SESSIONS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("handoff.sock");
    let (acceptor, admin_addr, standalone) = standalone_with_admin(&socket).await;
    let (a_http, a, a_run) = consumer(&socket).await;
    let service = Service::start(acceptor, ServiceSpec::new("svc", SESSIONS)).await;
    eventually("the consumer holds sessions", || a.sessions() >= 2).await;
    assert_eq!(get(a_http, "/").await.status, 200);

    assert_eq!(
        admin(admin_addr, "GET", "/ready").await,
        (200, "ready\n".into())
    );
    let lent_now = || async {
        let (status, body) = admin(admin_addr, "GET", "/status").await;
        assert_eq!(status, 200, "{body}");
        json(&body)
    };
    let status = lent_now().await;
    assert_eq!(status["acceptor"]["addr"], acceptor.to_string(), "{status}");
    let cluster = &status["clusters"][0];
    assert_eq!(cluster["name"], "api", "{status}");
    assert_eq!(cluster["sessions"], SESSIONS, "{status}");
    assert_eq!(cluster["instances"][0]["id"], "svc", "{status}");
    let consumers = status["consumers"].as_array().expect("consumers listed");
    assert_eq!(consumers.len(), 1, "{status}");
    let slice = &consumers[0]["slices"][0];
    assert_eq!(
        (&slice["cluster"], &slice["slice"]),
        (&"api".into(), &"default".into())
    );
    assert_eq!(slice["lent"], a.sessions(), "{status}");
    // Issue 48, item 6: the acceptor's own slice counts the sessions it lent (they are its
    // instance's), and says where they are rather than "no requests and no sessions".
    // (A session in transit to the consumer is in neither count for a moment: asked again.)
    let mut here = cluster["slices"][0].clone();
    for _ in 0..50 {
        if here["sessions"] == SESSIONS {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        here = lent_now().await["clusters"][0]["slices"][0].clone();
    }
    assert_eq!(here["sessions"], SESSIONS, "{here}");
    let why = here["why"].as_str().unwrap_or_default();
    assert!(why.contains("lent to consumers"), "{here}");

    let (status, metrics) = admin(admin_addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    let registered = metrics
        .lines()
        .find(|l| l.starts_with("sluice_acceptor_handshakes_total{") && l.contains("registered"))
        .unwrap_or_else(|| panic!("no registered handshakes in:\n{metrics}"));
    assert!(
        registered.ends_with(&format!(" {SESSIONS}")),
        "{registered}"
    );
    assert!(
        metrics.contains("sluice_sessions{cluster=\"api\",instance=\"svc\",state=\"active\"} 4"),
        "{metrics}"
    );

    let (status, body) = admin(admin_addr, "POST", "/clusters/api/instances/svc/drain").await;
    assert_eq!(status, 200, "{body}");
    let status = lent_now().await;
    assert_eq!(
        status["clusters"][0]["instances"][0]["draining"], true,
        "{status}"
    );
    assert_eq!(admin(admin_addr, "POST", "/drain").await.0, 200);
    assert_eq!(admin(admin_addr, "GET", "/ready").await.0, 503);
    drop(service);
    for running in [a_run, standalone] {
        running.stop().await;
    }
}

#[tokio::test]
async fn a_standalone_acceptor_refuses_http2_sessions_it_could_not_lend() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("handoff.sock");
    let (addr, running) = standalone(&socket).await;
    let spec = ServiceSpec::h2("a", 1, 8);
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(&spec.registration().encode())
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(
        answer.ends_with("a standalone acceptor lends HTTP/1.1 sessions only\n"),
        "{answer}"
    );
    // HTTP/1.1 sessions register as before.
    let h1 = reverse_support::service::dial(addr, &ServiceSpec::new("a", 1).registration()).await;
    assert_eq!(h1.1, 101);
    running.stop().await;
}
