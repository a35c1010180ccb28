//! The real proxy for the SDK's tests: a `sluice::Proxy` built from TOML text, with its
//! listener and acceptor on 127.0.0.1:0, run on a thread and runtime of its own.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

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
use sluice_sdk::{serve, Acceptor, Backoff, Identity, Options, Sessions};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Fails a test that would otherwise hang; never a timing assertion.
pub(crate) async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .expect("the test hung")
}

/// The proxy's configuration: the listener and the acceptor at the given addresses (port 0:
/// any), and one reverse cluster, `api`, that every request goes to.
pub(crate) fn config(http: SocketAddr, acceptor: SocketAddr) -> sluice::config::Config {
    config_with_grace(http, acceptor, "1s")
}

/// [`config`] with this `shutdown_grace` (how long a stopping proxy lets requests finish).
pub(crate) fn config_with_grace(
    http: SocketAddr,
    acceptor: SocketAddr,
    grace: &str,
) -> sluice::config::Config {
    let text = format!(
        r#"[runtime]
shutdown_grace = "{grace}"

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
pub(crate) struct RunningProxy {
    pub(crate) http: SocketAddr,
    pub(crate) acceptor: SocketAddr,
    pub(crate) cluster: ReverseCluster,
    stop: oneshot::Sender<()>,
    kill: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

pub(crate) type Bound = Result<(SocketAddr, SocketAddr, ReverseCluster), String>;

impl RunningProxy {
    /// Binds the listener and the acceptor at the given addresses (port 0: any) and runs.
    pub(crate) async fn start(http: SocketAddr, acceptor: SocketAddr) -> Self {
        Self::start_config(config(http, acceptor)).await
    }

    /// A proxy on free ports that lets requests finish for `grace` when it stops.
    pub(crate) async fn with_grace(grace: &str) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start_config(config_with_grace(any, any, grace)).await
    }

    async fn start_config(config: sluice::config::Config) -> Self {
        let (bound, ready) = oneshot::channel::<Bound>();
        let (stop, stopped) = oneshot::channel::<()>();
        let (kill, killed) = oneshot::channel::<()>();
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
                let run = proxy.run_until(async move {
                    let _ = stopped.await;
                });
                // Killed: the runtime drops mid-run, every socket closes, nothing says goodbye.
                tokio::select! {
                    () = run => {}
                    Ok(()) = killed => {}
                }
            });
        });
        let (http, acceptor, cluster) = within(ready).await.unwrap().unwrap();
        Self {
            http,
            acceptor,
            cluster,
            stop,
            kill,
            thread,
        }
    }

    pub(crate) async fn any_port() -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start(any, any).await
    }

    /// Waits until the proxy holds `n` idle sessions (all of them, when nothing is in flight).
    pub(crate) async fn idle(&self, n: usize) {
        within(self.cluster.wait_until(|c| c.idle_sessions("default") == n)).await;
    }

    /// Stops the proxy (its `run_until` returns), drops its runtime and waits until it has.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        join(self.thread).await;
    }

    /// Ends the proxy as a crash would: no shutdown, no `DRAINING`; its sockets just close.
    pub(crate) async fn kill(self) {
        let _ = self.kill.send(());
        join(self.thread).await;
    }
}

/// Waits, without blocking the runtime, until the proxy's thread has ended.
async fn join(thread: std::thread::JoinHandle<()>) {
    within(tokio::task::spawn_blocking(move || thread.join()))
        .await
        .unwrap()
        .unwrap();
}

/// A service that counts requests in flight and answers `hello from ID` after `work`.
#[derive(Debug, Default)]
pub(crate) struct Counter {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    served: watch::Sender<usize>,
}

impl Counter {
    pub(crate) async fn handle(&self, id: &str, work: Duration) -> Response<Full<Bytes>> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(work).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.served.send_modify(|n| *n += 1);
        Response::new(Full::from(format!("hello from {id}")))
    }

    pub(crate) fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    pub(crate) fn served(&self) -> usize {
        *self.served.borrow()
    }

    /// Waits until at least `n` requests have been served.
    pub(crate) async fn served_at_least(&self, n: usize) {
        let mut served = self.served.subscribe();
        within(served.wait_for(|s| *s >= n)).await.unwrap();
    }
}

/// Options for instance `id` of `api` with `capacity` sessions and a quick backoff.
pub(crate) fn options_for(acceptor: impl Into<Acceptor>, id: &str, capacity: usize) -> Options {
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
    options
}

/// Starts instance `id` of `api` with `capacity` sessions, each request taking `work`.
pub(crate) fn instance(
    acceptor: SocketAddr,
    id: &str,
    capacity: usize,
    work: Duration,
) -> (Sessions, Arc<Counter>) {
    counted(options_for(acceptor, id, capacity), work)
}

/// Serves `options` with a [`Counter`] whose requests each take `work`.
pub(crate) fn counted(options: Options, work: Duration) -> (Sessions, Arc<Counter>) {
    let id = options.identity.instance.clone().unwrap_or_default();
    let counter = Arc::new(Counter::default());
    let (c, id) = (Arc::clone(&counter), id);
    let service = tower::service_fn(move |_req: Request<Incoming>| {
        let (c, id) = (Arc::clone(&c), id.clone());
        async move { Ok::<_, Infallible>(c.handle(&id, work).await) }
    });
    (serve(options, service).unwrap(), counter)
}

/// Waits until the SDK reports exactly `n` sessions registered.
pub(crate) async fn registered(sessions: &Sessions, n: usize) {
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.registered == n))
        .await
        .unwrap();
}

/// `GET /` on a fresh connection; the status and body.
pub(crate) async fn get(addr: SocketAddr) -> (StatusCode, String) {
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
pub(crate) fn load(
    addr: SocketAddr,
    workers: usize,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<StatusCode>> {
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
