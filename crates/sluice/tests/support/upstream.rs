//! Helpers for the static-cluster tests: backends that report more, raw-TCP misbehaving
//! backends, ports that refuse or never finish a connect, and bounded waiting.

use std::future::Future;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice::StaticCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{handle, Backend, Client, Reply, Stats, TestProxy};

/// How long any single wait in these tests may take before the test fails as hung.
pub const HANG_GUARD: Duration = Duration::from_secs(5);

/// Awaits `fut`, failing the test if it has not finished within [`HANG_GUARD`].
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, fut)
        .await
        .unwrap_or_else(|_| panic!("hung: {what}"))
}

/// Polls `cond` every few milliseconds until it holds; fails the test after [`HANG_GUARD`].
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Like [`super::get`], but a failed exchange is returned instead of panicking.
pub async fn try_get(client: &Client, url: &str) -> Result<Reply, String> {
    use http_body_util::BodyExt;
    let req = Request::get(url).body(Full::default()).unwrap();
    let res = client.request(req).await.map_err(|e| e.to_string())?;
    let (parts, body) = res.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The proxy's cluster `backend` (the one [`super::static_config`] defines).
pub fn static_cluster(proxy: &TestProxy) -> StaticCluster {
    let (_, upstream) = proxy
        .proxy_clusters
        .iter()
        .find(|(name, _)| name == "backend")
        .expect("no cluster named backend");
    match upstream {
        sluice::Upstream::Static(c) => c.clone(),
        sluice::Upstream::Reverse(_) => panic!("backend is a static cluster"),
    }
}

/// The proxy-side view of the endpoint at `addr` of the `backend` cluster.
pub fn endpoint(proxy: &TestProxy, addr: SocketAddr) -> Arc<sluice::Endpoint> {
    static_cluster(proxy)
        .endpoints()
        .into_iter()
        .find(|e| e.addr() == addr)
        .expect("no such endpoint")
}

/// A [`Backend`] that also counts its open connections, answers `/healthz` with 200 or 503
/// as `healthy` says, and holds `/wait` requests until [`ObservedBackend::open_gate`].
pub struct ObservedBackend {
    backend: Backend,
    /// Connections accepted and not yet closed.
    pub open: Arc<AtomicUsize>,
    /// What `/healthz` reports; starts healthy.
    pub healthy: Arc<AtomicBool>,
    gate: watch::Sender<bool>,
}

impl ObservedBackend {
    pub async fn start(name: &str) -> Self {
        Self::start_on(name, TcpListener::bind("127.0.0.1:0").await.unwrap()).await
    }

    pub async fn start_on(name: &str, listener: TcpListener) -> Self {
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(Stats::default());
        let open = Arc::new(AtomicUsize::new(0));
        let healthy = Arc::new(AtomicBool::new(true));
        let gate = watch::channel(false).0;
        let shared = Shared {
            name: name.to_owned(),
            stats: Arc::clone(&stats),
            open: Arc::clone(&open),
            healthy: Arc::clone(&healthy),
            gate: gate.subscribe(),
        };
        let task = tokio::spawn(accept_observed(listener, shared));
        let backend = Backend {
            name: name.to_owned(),
            addr,
            stats,
            task,
        };
        Self {
            backend,
            open,
            healthy,
            gate,
        }
    }

    /// Lets every held and future `/wait` request answer.
    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.backend.stats.in_flight.load(Ordering::SeqCst)
    }
}

impl Deref for ObservedBackend {
    type Target = Backend;

    fn deref(&self) -> &Backend {
        &self.backend
    }
}

#[derive(Clone)]
struct Shared {
    name: String,
    stats: Arc<Stats>,
    open: Arc<AtomicUsize>,
    healthy: Arc<AtomicBool>,
    gate: watch::Receiver<bool>,
}

async fn accept_observed(listener: TcpListener, shared: Shared) {
    while let Ok((stream, _)) = listener.accept().await {
        shared.stats.connections.fetch_add(1, Ordering::SeqCst);
        shared.open.fetch_add(1, Ordering::SeqCst);
        let conn = shared.clone();
        tokio::spawn(async move {
            let svc_state = conn.clone();
            let svc = hyper::service::service_fn(move |req| observed(svc_state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
            conn.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

async fn observed(
    s: Shared,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    match req.uri().path() {
        "/healthz" => {
            let mut res = Response::new(Full::new(Bytes::from_static(b"health\n")));
            if !s.healthy.load(Ordering::SeqCst) {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok(res)
        }
        "/wait" => {
            s.stats.in_flight.fetch_add(1, Ordering::SeqCst);
            s.stats.requests.fetch_add(1, Ordering::SeqCst);
            let _ = s.gate.clone().wait_for(|open| *open).await;
            s.stats.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(Response::new(Full::new(Bytes::from(format!(
                "{} /wait",
                s.name
            )))))
        }
        _ => handle(s.name, s.stats, req).await,
    }
}

/// A TCP port that is bound but not listening, so connects to it are refused, and that no
/// other test can take meanwhile. [`RefusingPort::listen`] brings it to life.
pub struct RefusingPort {
    pub addr: SocketAddr,
    socket: socket2::Socket,
}

impl RefusingPort {
    pub fn new() -> Self {
        let socket = tcp_socket();
        socket
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        Self { addr, socket }
    }

    /// Starts listening on the same port: the "restarted backend".
    pub fn listen(self) -> TcpListener {
        self.socket.listen(128).unwrap();
        into_tokio(self.socket)
    }
}

fn tcp_socket() -> socket2::Socket {
    use socket2::{Domain, Socket, Type};
    Socket::new(Domain::IPV4, Type::STREAM, None).unwrap()
}

fn into_tokio(socket: socket2::Socket) -> TcpListener {
    socket.set_nonblocking(true).unwrap();
    TcpListener::from_std(std::net::TcpListener::from(socket)).unwrap()
}

/// A listener whose accept queue is full and never drained, so a new connect to it hangs
/// (Linux drops the SYN). Keep it alive for as long as connects should hang.
pub struct BlackholePort {
    pub addr: SocketAddr,
    _listener: socket2::Socket,
    _filler: TcpStream,
}

impl BlackholePort {
    pub async fn new() -> Self {
        let listener = tcp_socket();
        listener
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        // A backlog of 0 holds one connection; the filler takes it.
        listener.listen(0).unwrap();
        let addr = listener.local_addr().unwrap().as_socket().unwrap();
        let filler = within("backlog filler connect", TcpStream::connect(addr))
            .await
            .unwrap();
        Self {
            addr,
            _listener: listener,
            _filler: filler,
        }
    }
}

/// What a [`RawBackend`] has seen.
#[derive(Debug, Default)]
pub struct RawStats {
    pub connections: AtomicUsize,
    /// Requests answered.
    pub answered: AtomicUsize,
    /// Connections closed on receiving a further request, without answering it.
    pub dropped: AtomicUsize,
}

/// A hand-written TCP backend for misbehaviour hyper's server would never show.
pub struct RawBackend {
    pub addr: SocketAddr,
    pub stats: Arc<RawStats>,
    task: JoinHandle<()>,
}

impl RawBackend {
    /// Answers every request head with `not http` and closes.
    pub async fn garbage() -> Self {
        Self::start(|stream, stats| async move {
            let mut stream = stream;
            read_head(&mut stream).await;
            let _ = stream.write_all(b"not http\r\n\r\n").await;
            stats.answered.fetch_add(1, Ordering::SeqCst);
        })
        .await
    }

    /// Answers the first request of each connection with a keep-alive `200 ok`, then closes
    /// the connection as soon as the next request starts arriving, without answering it: the
    /// keep-alive race where a server times a connection out just as a request is sent.
    pub async fn one_request_per_connection() -> Self {
        Self::start(|stream, stats| async move {
            let mut stream = stream;
            read_head(&mut stream).await;
            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            if stream.write_all(ok).await.is_err() {
                return;
            }
            stats.answered.fetch_add(1, Ordering::SeqCst);
            let mut byte = [0u8; 1];
            if matches!(stream.read(&mut byte).await, Ok(n) if n > 0) {
                stats.dropped.fetch_add(1, Ordering::SeqCst);
            }
        })
        .await
    }

    /// Answers every request, keeping the connection open, with a response that has both
    /// `Content-Length: 50` and a chunked body of `ok`: framing that cannot be trusted.
    pub async fn conflicting_framing() -> Self {
        Self::start(|stream, stats| async move {
            let mut stream = stream;
            let res =
                b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n\
                        2\r\nok\r\n0\r\n\r\n";
            while read_head(&mut stream).await && stream.write_all(res).await.is_ok() {
                stats.answered.fetch_add(1, Ordering::SeqCst);
            }
        })
        .await
    }

    /// Answers every request, keeping the connection open, with `200` and as its body the
    /// request target exactly as it arrived (what a route's rewrite sent).
    pub async fn echo_target() -> Self {
        Self::start(|stream, stats| async move {
            let mut stream = stream;
            while let Some(head) = read_head_bytes(&mut stream).await {
                let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
                let target = line.split(|b| *b == b' ').nth(1).unwrap_or_default();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                    target.len()
                );
                let res = [head.as_bytes(), target].concat();
                if stream.write_all(&res).await.is_err() {
                    return;
                }
                stats.answered.fetch_add(1, Ordering::SeqCst);
            }
        })
        .await
    }

    async fn start<F, Fut>(serve: F) -> Self
    where
        F: Fn(TcpStream, Arc<RawStats>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(RawStats::default());
        let s = Arc::clone(&stats);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                s.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, Arc::clone(&s)));
            }
        });
        Self { addr, stats, task }
    }

    pub fn connections(&self) -> usize {
        self.stats.connections.load(Ordering::SeqCst)
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads until the end of a request head; false on EOF first. Test requests carry small
/// heads and no bodies.
async fn read_head(stream: &mut TcpStream) -> bool {
    read_head_bytes(stream).await.is_some()
}

/// The bytes of a request head (and any that came with it); `None` on EOF first.
async fn read_head_bytes(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(buf)
}

/// Counts replies by the backend name that opens each body (`<name> <path>`).
pub fn count_by_backend<'a>(
    replies: impl IntoIterator<Item = &'a Reply>,
) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for r in replies {
        assert_eq!(r.status, 200, "{}", r.body);
        let name = r.body.split(' ').next().unwrap_or_default().to_owned();
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}
