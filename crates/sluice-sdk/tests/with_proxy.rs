//! The SDK against the real proxy: a `sluice::Proxy` built from TOML text, with its listener
//! and acceptor on 127.0.0.1:0, and SDK instances that dial in and register sessions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice::{Proxy, ReverseCluster};
use sluice_sdk::{serve, Backoff, Identity, Options, Sessions};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Fails a test that would otherwise hang; never a timing assertion.
async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .expect("the test hung")
}

/// The proxy's configuration: the listener and the acceptor at the given addresses (port 0:
/// any), and one reverse cluster, `api`, that every request goes to.
fn config(http: SocketAddr, acceptor: SocketAddr) -> sluice::config::Config {
    let text = format!(
        r#"[runtime]
shutdown_grace = "1s"

[acceptor]
listen = "{acceptor}"
handshakes_per_second = 0

[[listener]]
name = "public"
listen = "{http}"

[[route]]
cluster = "api"

[cluster.api]
kind = "reverse"
queue_max = 1024
queue_timeout = "10s"
"#
    );
    sluice::config::parse_str(&text, "test.toml", Path::new(".")).unwrap()
}

/// A proxy running on a runtime of its own, on its own thread, as if in another process:
/// stopping it drops that runtime, so every socket it holds closes as at a process exit.
struct RunningProxy {
    http: SocketAddr,
    acceptor: SocketAddr,
    cluster: ReverseCluster,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

type Bound = Result<(SocketAddr, SocketAddr, ReverseCluster), String>;

impl RunningProxy {
    /// Binds the listener and the acceptor at the given addresses (port 0: any) and runs.
    async fn start(http: SocketAddr, acceptor: SocketAddr) -> Self {
        let config = config(http, acceptor);
        let (bound, ready) = oneshot::channel::<Bound>();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let proxy = match Proxy::bind(&config).await {
                    Ok(proxy) => proxy,
                    Err(e) => return drop(bound.send(Err(e.to_string()))),
                };
                let cluster = proxy.reverse_cluster("api").unwrap().clone();
                let addrs = (proxy.local_addrs()[0].1, proxy.acceptor_addr().unwrap());
                let _ = bound.send(Ok((addrs.0, addrs.1, cluster)));
                proxy
                    .run_until(async move {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        let (http, acceptor, cluster) = within(ready).await.unwrap().unwrap();
        Self {
            http,
            acceptor,
            cluster,
            stop,
            thread,
        }
    }

    async fn any_port() -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start(any, any).await
    }

    /// Waits until the proxy holds `n` idle sessions (all of them, when nothing is in flight).
    async fn idle(&self, n: usize) {
        within(self.cluster.wait_until(|c| c.idle_sessions("default") == n)).await;
    }

    /// Stops the proxy (its `run_until` returns), drops its runtime and waits until it has.
    async fn stop(self) {
        let _ = self.stop.send(());
        let thread = self.thread;
        within(tokio::task::spawn_blocking(move || thread.join()))
            .await
            .unwrap()
            .unwrap();
    }
}

/// A service that counts requests in flight and answers `hello from ID` after `work`.
#[derive(Debug, Default)]
struct Counter {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    served: watch::Sender<usize>,
}

impl Counter {
    async fn handle(&self, id: &str, work: Duration) -> Response<Full<Bytes>> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(work).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.served.send_modify(|n| *n += 1);
        Response::new(Full::from(format!("hello from {id}")))
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    fn served(&self) -> usize {
        *self.served.borrow()
    }

    /// Waits until at least `n` requests have been served.
    async fn served_at_least(&self, n: usize) {
        let mut served = self.served.subscribe();
        within(served.wait_for(|s| *s >= n)).await.unwrap();
    }
}

/// Starts instance `id` of `api` with `capacity` sessions, each request taking `work`.
fn instance(
    acceptor: SocketAddr,
    id: &str,
    capacity: usize,
    work: Duration,
) -> (Sessions, Arc<Counter>) {
    let mut identity = Identity::new("api");
    identity.instance = Some(id.to_owned());
    let mut options = Options::new(acceptor, identity);
    options.capacity = capacity;
    // A restarted proxy is found again within tens of milliseconds.
    options.backoff = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(100),
        jitter: 0.5,
    };
    let counter = Arc::new(Counter::default());
    let (c, id) = (Arc::clone(&counter), id.to_owned());
    let service = tower::service_fn(move |_req: Request<Incoming>| {
        let (c, id) = (Arc::clone(&c), id.clone());
        async move { Ok::<_, Infallible>(c.handle(&id, work).await) }
    });
    (serve(options, service).unwrap(), counter)
}

/// Waits until the SDK reports exactly `n` sessions registered.
async fn registered(sessions: &Sessions, n: usize) {
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.registered == n))
        .await
        .unwrap();
}

/// `GET /` on a fresh connection; the status and body.
async fn get(addr: SocketAddr) -> (StatusCode, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/")
        .header("host", "app.example")
        .body(Full::<Bytes>::default())
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `workers` clients sending requests back to back until `stop` is set; every status seen.
fn load(addr: SocketAddr, workers: usize, stop: Arc<AtomicBool>) -> JoinHandle<Vec<StatusCode>> {
    tokio::spawn(async move {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..workers {
            let stop = Arc::clone(&stop);
            set.spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    statuses.push(get(addr).await.0);
                }
                statuses
            });
        }
        set.join_all().await.concat()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_queues_in_the_proxy_and_never_exceeds_the_sessions() {
    let proxy = RunningProxy::any_port().await;
    let (sessions, counter) = instance(proxy.acceptor, "a", 4, Duration::from_millis(10));
    registered(&sessions, 4).await;
    proxy.idle(4).await;

    // 40 clients at once, ten times the capacity, three requests each.
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let addr = proxy.http;
        clients.spawn(async move {
            let mut replies = Vec::new();
            for _ in 0..3 {
                replies.push(get(addr).await);
            }
            replies
        });
    }
    let replies = within(clients.join_all()).await.concat();
    assert_eq!(replies.len(), 120);
    for (status, body) in &replies {
        assert_eq!((*status, body.as_str()), (StatusCode::OK, "hello from a"));
    }
    assert_eq!(counter.served(), 120);
    assert_eq!(
        counter.max_in_flight(),
        4,
        "the service saw more or less than its sessions"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_redials_a_restarted_proxy_at_the_same_address() {
    let first = RunningProxy::any_port().await;
    let (http, acceptor) = (first.http, first.acceptor);
    let (sessions, counter) = instance(acceptor, "a", 3, Duration::ZERO);
    registered(&sessions, 3).await;
    first.idle(3).await;
    assert_eq!(get(http).await.0, StatusCode::OK);

    first.stop().await;
    // Every session ended with the proxy; the SDK keeps re-dialing a closed port meanwhile.
    registered(&sessions, 0).await;
    let second = RunningProxy::start(http, acceptor).await;
    registered(&sessions, 3).await;
    second.idle(3).await;
    for _ in 0..6 {
        assert_eq!(get(http).await, (StatusCode::OK, "hello from a".into()));
    }
    assert_eq!(counter.served(), 7);
    within(sessions.shutdown()).await.unwrap();
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_under_continuous_load_loses_no_request() {
    let proxy = RunningProxy::any_port().await;
    let work = Duration::from_millis(2);
    let (a, a_counter) = instance(proxy.acceptor, "a", 4, work);
    let (b, b_counter) = instance(proxy.acceptor, "b", 4, work);
    registered(&a, 4).await;
    registered(&b, 4).await;
    proxy.idle(8).await;

    let stop = Arc::new(AtomicBool::new(false));
    let statuses = load(proxy.http, 8, Arc::clone(&stop));
    a_counter.served_at_least(20).await;
    within(a.shutdown()).await.unwrap();
    within(proxy.cluster.wait_until(|c| c.instance_sessions("a") == 0)).await;
    // The load goes on, now to `b` alone.
    let b_before = b_counter.served();
    b_counter.served_at_least(b_before + 20).await;
    stop.store(true, Ordering::SeqCst);
    let statuses = within(statuses).await.unwrap();

    assert!(statuses.len() >= 40, "{} requests", statuses.len());
    let failed: Vec<_> = statuses.iter().filter(|s| !s.is_success()).collect();
    assert!(failed.is_empty(), "non-2xx during the drain: {failed:?}");
    assert_eq!(proxy.cluster.instance_sessions("a"), 0);
    assert_eq!(proxy.cluster.instance_sessions("b"), 4);
    within(b.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_capacity_closes_sessions_at_the_proxy() {
    let proxy = RunningProxy::any_port().await;
    let (sessions, _counter) = instance(proxy.acceptor, "a", 4, Duration::ZERO);
    registered(&sessions, 4).await;
    proxy.idle(4).await;
    assert_eq!(proxy.cluster.instance_sessions("a"), 4);

    sessions.set_capacity(1);
    // A surplus session retires with its next response, so requests drive the shrink.
    within(async {
        while proxy.cluster.instance_sessions("a") > 1 {
            assert_eq!(get(proxy.http).await.0, StatusCode::OK);
        }
    })
    .await;
    registered(&sessions, 1).await;
    for _ in 0..3 {
        assert_eq!(get(proxy.http).await.0, StatusCode::OK);
    }
    assert_eq!(proxy.cluster.instance_sessions("a"), 1);
    assert_eq!(sessions.capacity(), 1);
    within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_stopped_in_process_closes_its_sessions() {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let proxy = Proxy::bind(&config(any, any)).await.unwrap();
    let (sessions, _counter) = instance(proxy.acceptor_addr().unwrap(), "a", 2, Duration::ZERO);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run_until(async move {
        let _ = stopped.await;
    }));
    registered(&sessions, 2).await;
    let _ = stop.send(());
    within(task).await.unwrap();
    registered(&sessions, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_the_address_the_proxy_saw_not_one_the_client_chose() {
    use sluice_sdk::ClientAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let proxy = RunningProxy::any_port().await;
    let mut options = Options::new(proxy.acceptor, Identity::new("api"));
    options.capacity = 1;
    let service = tower::service_fn(|req: Request<Incoming>| async move {
        let client = req.extensions().get::<ClientAddr>().copied();
        let body = client.map_or_else(|| "none".to_owned(), |c| c.to_string());
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::from(body)))
    });
    let sessions = serve(options, service).unwrap();
    proxy.idle(1).await;

    let mut client = TcpStream::connect(proxy.http).await.unwrap();
    let me = client.local_addr().unwrap();
    client
        .write_all(
            b"GET / HTTP/1.1\r\nHost: a\r\nSluice-Client-Addr: 6.6.6.6:1\r\n\
              X-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = String::new();
    within(client.read_to_string(&mut answer)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(&format!("\r\n\r\n{me}")), "{answer}");
    within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_drain_keeps_the_instance_out_and_shutdown_still_works() {
    let proxy = RunningProxy::any_port().await;
    let (sessions, _counter) = instance(proxy.acceptor, "a", 2, Duration::ZERO);
    registered(&sessions, 2).await;
    assert!(proxy.cluster.drain_and_hold("a"));

    // The SDK's re-dials are refused with 410: it stops, reports it, and stays out.
    let mut status = sessions.subscribe();
    let status = within(status.wait_for(|s| s.registered == 0 && s.last_error.is_some()))
        .await
        .unwrap()
        .clone();
    let error = status.last_error.unwrap();
    assert!(error.is_drained() && !error.is_retryable(), "{error}");
    let registrations = status.registrations;
    assert_eq!(proxy.cluster.instance_sessions("a"), 0);
    within(sessions.shutdown()).await.unwrap();
    assert_eq!(proxy.cluster.instance_sessions("a"), 0);
    assert_eq!(registrations, 2, "it must not have re-registered");

    // Resumed, the same instance id registers again.
    assert!(proxy.cluster.resume("a"));
    let (again, _counter) = instance(proxy.acceptor, "a", 1, Duration::ZERO);
    registered(&again, 1).await;
    within(again.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_closes_idle_sessions_at_once_and_the_next_burst_stays_within_it() {
    let proxy = RunningProxy::any_port().await;
    let (sessions, counter) = instance(proxy.acceptor, "a", 8, Duration::from_millis(20));
    registered(&sessions, 8).await;
    proxy.idle(8).await;

    sessions.set_capacity(2);
    // No request needed: the six idle surplus sessions close, and the proxy drops them.
    within(proxy.cluster.wait_until(|c| c.instance_sessions("a") == 2)).await;
    registered(&sessions, 2).await;
    let burst: Vec<_> = (0..8).map(|_| tokio::spawn(get(proxy.http))).collect();
    for request in burst {
        assert_eq!(within(request).await.unwrap().0, StatusCode::OK);
    }
    assert!(counter.max_in_flight() <= 2, "{}", counter.max_in_flight());
    within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_instance_comes_back_by_itself_within_one_probe() {
    let proxy = RunningProxy::any_port().await;
    let mut identity = Identity::new("api");
    identity.instance = Some("a".into());
    let mut options = Options::new(proxy.acceptor, identity);
    options.capacity = 2;
    options.drained_probe = Duration::from_millis(50);
    let sessions = serve(
        options,
        tower::service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(Full::<Bytes>::from("back")))
        }),
    )
    .unwrap();
    registered(&sessions, 2).await;
    assert!(proxy.cluster.drain_and_hold("a"));
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.registered == 0 && s.last_error.is_some()))
        .await
        .unwrap();
    assert!(sessions.last_error().unwrap().is_drained());

    // `sluice ctl resume`: nothing to do at the service.
    assert!(proxy.cluster.resume("a"));
    registered(&sessions, 2).await;
    proxy.idle(2).await;
    assert_eq!(get(proxy.http).await, (StatusCode::OK, "back".into()));
    within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}
