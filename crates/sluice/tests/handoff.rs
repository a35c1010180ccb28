//! A standalone acceptor lending one service's sessions to two consumers, in one process over
//! real sockets (the handoff socket, the acceptor, the consumers' listeners): both consumers
//! serve from the one pool, idle sessions move to the consumer whose requests wait, and the
//! service never has more requests in flight than the sessions it declared.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod reverse_support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use reverse_support::{get, Service, ServiceSpec};
use sluice::StandaloneAcceptor;
use sluice::{Proxy, ReverseCluster};
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

/// `sluice acceptor` with the cluster `api`; returns where services dial in.
async fn standalone(socket: &Path) -> (SocketAddr, Running) {
    let config = parse(&format!(
        "[acceptor]\nlisten = \"127.0.0.1:0\"\nhandshakes_per_second = 0\n\
         [handoff]\nlisten = \"{}\"\n[cluster.api]\nkind = \"reverse\"\n",
        socket.display()
    ));
    let acceptor = StandaloneAcceptor::bind(&config).await.unwrap();
    let addr = acceptor.acceptor_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(acceptor.run_until(async move {
        let _ = stopped.await;
    }));
    let running = Running {
        stop: Some(stop),
        task,
    };
    (addr, running)
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
