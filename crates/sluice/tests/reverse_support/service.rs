//! A test service that dials the acceptor, registers N sessions and serves HTTP/1.1 on them.
//!
//! Paths: `/delay/<ms>` works that long; `/wait` blocks until [`Service::open_gate`];
//! `/big/<n>` answers n bytes; `/wait/big/<n>` answers n bytes once the gate opens; `/hang`
//! never answers; `/collect` reads the whole request body, then answers its length;
//! `/close` answers with `Connection: close`; `/flaky` drops its
//! session without answering the first time; `/session` answers `<instance>:<session's port>`;
//! anything else answers the instance's name.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice_session::{parse_reply, Identity, Parsed, Registration, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Who registers, where, and how many sessions.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    pub service: String,
    pub slice: String,
    pub instance: String,
    pub token: Option<String>,
    pub sessions: usize,
    /// `Some(n)`: HTTP/2 sessions of `n` streams each; `None`: HTTP/1.1.
    pub streams: Option<u32>,
}

impl ServiceSpec {
    pub fn new(instance: &str, sessions: usize) -> Self {
        Self {
            service: "api".into(),
            slice: "default".into(),
            instance: instance.into(),
            token: None,
            sessions,
            streams: None,
        }
    }

    /// The same, with HTTP/2 sessions of `streams` streams each.
    pub fn h2(instance: &str, sessions: usize, streams: u32) -> Self {
        Self {
            streams: Some(streams),
            ..Self::new(instance, sessions)
        }
    }

    pub fn registration(&self) -> Registration {
        let mut identity = Identity::new(&self.service);
        identity.slice = self.slice.clone();
        identity.instance = Some(self.instance.clone());
        identity.token = self.token.clone();
        Registration {
            identity,
            capacity: Some(self.sessions as u32),
            streams: self.streams,
        }
    }
}

/// What the service counts.
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    /// Requests whose handler was dropped before it answered (over HTTP/2: a `RST_STREAM`).
    pub cancelled: AtomicUsize,
    flaky_done: AtomicBool,
}

/// A running test service.
pub struct Service {
    pub stats: Arc<Stats>,
    live: watch::Sender<usize>,
    gate: watch::Sender<bool>,
    name: String,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Asks every HTTP/2 session to shut down gracefully (`GOAWAY`, then its streams end).
    goaway: watch::Sender<bool>,
    streams: Option<u32>,
}

impl Service {
    /// Registers `spec.sessions` sessions; each must be answered 101.
    pub async fn start(acceptor: SocketAddr, spec: ServiceSpec) -> Arc<Self> {
        let svc = Arc::new(Self {
            stats: Arc::default(),
            live: watch::channel(0).0,
            gate: watch::channel(false).0,
            name: spec.instance.clone(),
            tasks: Mutex::default(),
            goaway: watch::channel(false).0,
            streams: spec.streams,
        });
        for _ in 0..spec.sessions {
            let stream = dial(acceptor, &spec.registration()).await;
            assert_eq!(stream.1, 101, "registration refused");
            svc.serve(stream.0);
        }
        svc
    }

    /// Starts serving HTTP/1.1 (or HTTP/2, for HTTP/2 sessions) on a registered stream.
    fn serve(self: &Arc<Self>, stream: TcpStream) {
        let this = Arc::clone(self);
        self.live.send_modify(|n| *n += 1);
        let port = stream.local_addr().map_or(0, |a| a.port());
        let mut goaway = self.goaway.subscribe();
        let streams = self.streams;
        let task = tokio::spawn(async move {
            let svc = hyper::service::service_fn(|req| Arc::clone(&this).handle(req, port));
            match streams {
                None => {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                }
                Some(n) => {
                    let conn = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .max_concurrent_streams(n)
                    .serve_connection(TokioIo::new(stream), svc);
                    tokio::pin!(conn);
                    let asked = tokio::select! {
                        _ = conn.as_mut() => false,
                        asked = goaway.wait_for(|g| *g) => asked.is_ok(),
                    };
                    if asked {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
            }
            this.live.send_modify(|n| *n -= 1);
        });
        self.tasks.lock().unwrap().push(task);
    }

    /// Sessions still connected, as the service sees them.
    pub fn live(&self) -> usize {
        *self.live.borrow()
    }

    /// Waits until exactly `n` sessions are connected.
    pub async fn wait_live(&self, n: usize) {
        let mut rx = self.live.subscribe();
        rx.wait_for(|live| *live == n).await.unwrap();
    }

    /// Sends `GOAWAY` on every HTTP/2 session: they take no new streams, and close once the
    /// streams in flight have answered.
    pub fn goaway(&self) {
        self.goaway.send_replace(true);
    }

    /// Requests dropped unanswered (their stream reset).
    pub fn cancelled(&self) -> usize {
        self.stats.cancelled.load(Ordering::SeqCst)
    }

    /// Lets every `/wait` request answer.
    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    /// Kills the whole instance: every session closes at once, mid-request or not.
    pub fn kill(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// Kills one session (the first still registered).
    pub fn kill_one(&self) {
        let mut tasks = self.tasks.lock().unwrap();
        if !tasks.is_empty() {
            tasks.remove(0).abort();
        }
    }

    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    pub fn max_in_flight(&self) -> usize {
        self.stats.max_in_flight.load(Ordering::SeqCst)
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        port: u16,
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let s = &self.stats;
        let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        s.max_in_flight.fetch_max(now, Ordering::SeqCst);
        // Counts the request cancelled if the handler is dropped before it answers.
        let mut guard = Cancelled(Some(Arc::clone(&self.stats)));
        let res = if req.uri().path() == "/session" {
            Ok(Response::new(Full::new(Bytes::from(format!(
                "{}:{port}",
                self.name
            )))))
        } else if req.uri().path() == "/collect" {
            use http_body_util::BodyExt;
            let body = req.into_body().collect().await;
            let len = body.map_or(0, |b| b.to_bytes().len());
            Ok(Response::new(Full::new(Bytes::from(len.to_string()))))
        } else {
            self.respond(req.uri().path()).await
        };
        guard.0 = None;
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
        s.requests.fetch_add(1, Ordering::SeqCst);
        res
    }

    async fn respond(&self, path: &str) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let mut res = Response::new(Full::new(Bytes::from(self.name.clone())));
        if let Some(ms) = path.strip_prefix("/delay/") {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
        } else if let Some(n) = path.strip_prefix("/big/") {
            res = Response::new(Full::new(Bytes::from(vec![b'x'; n.parse().unwrap()])));
        } else if let Some(n) = path.strip_prefix("/wait/big/") {
            let _ = self.gate.subscribe().wait_for(|open| *open).await;
            res = Response::new(Full::new(Bytes::from(vec![b'x'; n.parse().unwrap()])));
        } else if path == "/wait" {
            let _ = self.gate.subscribe().wait_for(|open| *open).await;
        } else if path == "/hang" {
            std::future::pending::<()>().await;
        } else if path == "/close" {
            res.headers_mut()
                .insert("connection", "close".parse().unwrap());
        } else if path == "/flaky" && !self.stats.flaky_done.swap(true, Ordering::SeqCst) {
            // An error makes hyper drop the session without a response byte.
            return Err(std::io::Error::other("flaky: dropping the session"));
        }
        Ok(res)
    }
}

/// Counts a request's handler dropped unfinished, and leaves the in-flight count.
struct Cancelled(Option<Arc<Stats>>);

impl Drop for Cancelled {
    fn drop(&mut self) {
        if let Some(stats) = self.0.take() {
            stats.cancelled.fetch_add(1, Ordering::SeqCst);
            stats.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Dials the acceptor, sends `reg`, and returns the stream and the reply's status.
pub async fn dial(acceptor: SocketAddr, reg: &Registration) -> (TcpStream, u16) {
    dial_raw(acceptor, &reg.encode()).await
}

/// Sends raw handshake bytes and returns the stream and the reply's status.
pub async fn dial_raw(acceptor: SocketAddr, bytes: &[u8]) -> (TcpStream, u16) {
    let mut stream = TcpStream::connect(acceptor).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 1];
        // One byte at a time, so nothing after the head is consumed.
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "acceptor closed without a reply");
        buf.push(chunk[0]);
        if let Parsed::Complete(reply, _) = parse_reply(&buf).unwrap() {
            let status = match reply {
                Reply::Switched | Reply::SwitchedH2 | Reply::Control => 101,
                Reply::Drained => 200,
                Reply::Refused(code) => code,
            };
            return (stream, status);
        }
    }
}
