//! Test harness shared by the integration tests: in-process backends and proxies on
//! 127.0.0.1:0, and HTTP clients. Each test file uses the parts it needs.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::{Proxy, Shutdown};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub mod h3;

/// Counters a backend keeps, for assertions.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicUsize,
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
}

/// An HTTP/1.1 backend on 127.0.0.1:0 that answers with `name` and understands a few paths:
/// `/delay/<ms>` sleeps first, `/status/<code>` answers that status, `/close` answers with
/// `Connection: close`, `/echo` returns the request body, `/headers` lists request headers
/// (`name: value` lines), anything else answers `<name> <path>`.
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    task: JoinHandle<()>,
}

impl Backend {
    pub async fn start(name: &str) -> Self {
        Self::start_on(name, TcpListener::bind("127.0.0.1:0").await.unwrap()).await
    }

    pub async fn start_on(name: &str, listener: TcpListener) -> Self {
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(Stats::default());
        let (n, s) = (name.to_owned(), Arc::clone(&stats));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                s.connections.fetch_add(1, Ordering::SeqCst);
                let (n, s) = (n.clone(), Arc::clone(&s));
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        handle(n.clone(), Arc::clone(&s), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            name: name.to_owned(),
            addr,
            stats,
            task,
        }
    }

    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    pub fn connections(&self) -> usize {
        self.stats.connections.load(Ordering::SeqCst)
    }

    /// Stops accepting (open connections stay until their tasks end).
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    name: String,
    stats: Arc<Stats>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    stats.requests.fetch_add(1, Ordering::SeqCst);
    let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    stats.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let res = respond(&name, req).await;
    stats.in_flight.fetch_sub(1, Ordering::SeqCst);
    Ok(res)
}

async fn respond(name: &str, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    if let Some(ms) = path.strip_prefix("/delay/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
    }
    let mut res = Response::new(Full::new(Bytes::from(format!("{name} {path}"))));
    if let Some(code) = path.strip_prefix("/status/") {
        *res.status_mut() = StatusCode::from_u16(code.parse().unwrap_or(500)).unwrap();
    } else if path == "/close" {
        res.headers_mut()
            .insert(http::header::CONNECTION, "close".parse().unwrap());
    } else if path == "/headers" {
        let mut text = String::new();
        for (k, v) in req.headers() {
            text.push_str(&format!("{}: {}\n", k, v.to_str().unwrap_or("<binary>")));
        }
        *res.body_mut() = Full::new(Bytes::from(text));
    } else if path == "/echo" {
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        *res.body_mut() = Full::new(body);
    }
    res
}

/// Writes `request`, then reads until the peer closes the connection.
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_to_close(&mut stream).await
}

/// How many requests the fast path served, when it is on (the test command runs the suite
/// with it on and again with `SLUICE_FAST_PATH=0`): a test of a rule both paths apply checks
/// with it that the fast path really took its requests, and was not left to hyper.
pub fn fast_path_served(metrics: &sluice::Metrics) -> Option<u64> {
    if std::env::var("SLUICE_FAST_PATH").as_deref() == Ok("0") {
        return None;
    }
    let text = metrics.render();
    let line = text
        .lines()
        .find(|l| l.starts_with("sluice_http1_fast_path_requests_total "));
    Some(
        line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0),
    )
}

/// Reads one whole answer off a keep-alive connection (its head and a `Content-Length` body);
/// `None` when the connection closed first. Bounded: no answer in 10 s fails the test.
pub async fn read_answer(conn: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let read = async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf);
            let Some(head) = text.find("\r\n\r\n").map(|i| i + 4) else {
                continue;
            };
            let length = text[..head].lines().find_map(|l| {
                let (name, value) = l.split_once(':')?;
                let length = name.eq_ignore_ascii_case("content-length");
                length.then(|| value.trim().parse::<usize>().ok()).flatten()
            });
            if buf.len() >= head + length.unwrap_or(0) {
                return Some(text.into_owned());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no answer")
}

/// Reads until EOF (a reset also counts as closed), bounded so that a connection left open
/// fails the test instead of hanging it.
pub async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("read failed: {e}"),
            }
        }
    };
    let closed = tokio::time::timeout(Duration::from_secs(3), read).await;
    let text = String::from_utf8_lossy(&received).into_owned();
    assert!(closed.is_ok(), "connection still open; received {text:?}");
    text
}

/// A proxy started from TOML text, serving until dropped or shut down.
pub struct TestProxy {
    pub addrs: Vec<(String, SocketAddr)>,
    /// Each HTTP/3 endpoint's listener name and UDP address.
    pub http3: Vec<(String, SocketAddr)>,
    pub proxy_clusters: Vec<(String, sluice::Upstream)>,
    pub metrics: std::sync::Arc<sluice::Metrics>,
    /// The admin API's address, when the config has `[admin]`.
    pub admin: Option<SocketAddr>,
    shutdown: Shutdown,
    pub task: JoinHandle<()>,
}

impl TestProxy {
    /// Parses `toml` (relative paths resolve against `base_dir`), binds and runs it.
    pub async fn start_in(toml: &str, base_dir: &std::path::Path) -> Self {
        let config = sluice::config::parse_str(toml, "test.toml", base_dir)
            .unwrap_or_else(|e| panic!("{e}"));
        let proxy = Proxy::bind(&config).await.unwrap();
        let addrs = proxy.local_addrs();
        let http3 = proxy.http3_addrs();
        let proxy_clusters = config
            .clusters
            .keys()
            .map(|k| (k.clone(), proxy.cluster(k).unwrap().clone()))
            .collect();
        let metrics = std::sync::Arc::clone(proxy.metrics());
        let admin = proxy.admin_addr();
        let shutdown = Shutdown::new();
        let signal = shutdown.signal();
        let task = tokio::spawn(proxy.run_until(async move { signal.wait().await }));
        Self {
            addrs,
            http3,
            proxy_clusters,
            metrics,
            admin,
            shutdown,
            task,
        }
    }

    pub async fn start(toml: &str) -> Self {
        Self::start_in(toml, &std::env::temp_dir()).await
    }

    /// The first listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0].1
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr(), path)
    }

    /// Triggers graceful shutdown; await `task` to see it finish.
    pub fn shutdown(&self) {
        self.shutdown.trigger();
    }
}

/// `[[listener]]` on port 0 plus a static cluster `backend` of `endpoints` and a catch-all
/// route to it; `extra` is appended inside the cluster table (e.g. `lb = "round_robin"`).
pub fn static_config(endpoints: &[SocketAddr], extra: &str) -> String {
    let eps: Vec<String> = endpoints.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        r#"
[runtime]
shutdown_grace = "5s"

[[listener]]
name = "test"
listen = "127.0.0.1:0"

[[route]]
cluster = "backend"

[cluster.backend]
kind = "static"
endpoints = [{}]
{extra}
"#,
        eps.join(", ")
    )
}

/// Asserts that `text` does not load, with an error that says `message` at the line `line`
/// (a line of `text`, whole) — what a user sees for a malformed key.
pub fn assert_refused_at(text: &str, line: &str, message: &str) {
    let err = sluice::config::parse_str(text, "t.toml", std::path::Path::new("."))
        .unwrap_err()
        .to_string();
    let number = text
        .lines()
        .position(|l| l == line)
        .expect("the line is in the text")
        + 1;
    let at = format!("t.toml:{number}:");
    assert!(err.contains(message), "{line}: {err}");
    assert!(err.contains(&at), "{line}: {err} (not at {at})");
}

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: String,
}

/// A pooling HTTP/1.1 client (hyper-util's), like a browser or load generator would use.
pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

pub fn client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http()
}

pub async fn get(client: &Client, url: &str) -> Reply {
    send(client, Request::get(url).body(Full::default()).unwrap()).await
}

pub async fn send(client: &Client, req: Request<Full<Bytes>>) -> Reply {
    read_reply(client.request(req).await.expect("request failed")).await
}

/// Reads a whole response.
pub async fn read_reply(res: Response<Incoming>) -> Reply {
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body failed").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// One HTTP/2 (prior knowledge) connection to `addr`.
pub async fn h2_connect(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    h2_connect_with(addr).await
}

/// [`h2_connect`] with request bodies of type `B` (a channel, for calls that stream).
pub async fn h2_connect_with<B>(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// Reads a whole response from an HTTP/2 sender.
pub async fn h2_send(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Reply {
    read_reply(sender.send_request(req).await.expect("h2 request failed")).await
}

/// Static-cluster helpers: observed backends, raw-TCP backends, refusing ports, waiting.
pub mod dns;
pub mod upstream;
pub mod wire;
