//! Harness of the reverse-session tests: a proxy with an acceptor on 127.0.0.1:0, test
//! services that dial in and register sessions, and a one-request HTTP client.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod service;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sluice::{Proxy, ReverseCluster};
use tokio::net::TcpSocket;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[allow(unused_imports)]
pub use service::{Service, ServiceSpec};

/// A running proxy with one reverse cluster named `api`.
pub struct TestProxy {
    pub http: SocketAddr,
    pub acceptor: SocketAddr,
    pub cluster: ReverseCluster,
    pub metrics: std::sync::Arc<sluice::Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Starts a proxy; `cluster` holds extra keys of `[cluster.api]`, `routes` the `[[route]]`s.
pub async fn start_proxy(cluster: &str, routes: &str) -> TestProxy {
    start_proxy_with("", cluster, routes).await
}

/// [`start_proxy`] with extra keys of the `[[listener]]`.
pub async fn start_proxy_with(listener: &str, cluster: &str, routes: &str) -> TestProxy {
    start_proxy_full("", listener, cluster, routes).await
}

/// [`start_proxy_with`] with extra keys of the `[acceptor]`.
pub async fn start_proxy_full(
    acceptor: &str,
    listener: &str,
    cluster: &str,
    routes: &str,
) -> TestProxy {
    // No start-up window unless a test asks for one: most check what a running node does.
    let startup = match cluster.contains("startup_wait") {
        true => "",
        false => "startup_wait = \"0s\"\n",
    };
    let text = format!(
        "[acceptor]\nlisten = \"127.0.0.1:0\"\nhandshakes_per_second = 0\n{acceptor}\n\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n{listener}\n\
         {routes}\n[cluster.api]\nkind = \"reverse\"\n{startup}{cluster}\n"
    );
    let config = sluice::config::parse_str(&text, "test.toml", Path::new(".")).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let http = proxy.local_addrs()[0].1;
    let acceptor = proxy.acceptor_addr().unwrap();
    let cluster = proxy.reverse_cluster("api").unwrap().clone();
    let metrics = std::sync::Arc::clone(proxy.metrics());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run_until(async move {
        let _ = stopped.await;
    }));
    TestProxy {
        http,
        acceptor,
        cluster,
        metrics,
        stop: Some(stop),
        task,
    }
}

/// One route to `api`.
pub const DEFAULT_ROUTE: &str = "[[route]]\ncluster = \"api\"\n";

impl TestProxy {
    /// Waits until `slice` has `n` idle sessions.
    pub async fn idle(&self, slice: &str, n: usize) {
        let slice = slice.to_owned();
        self.cluster
            .wait_until(|c| c.idle_sessions(&slice) == n)
            .await;
    }

    /// Stops the proxy and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
    }
}

/// A response as the client saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a fresh connection from 127.0.0.1.
pub async fn send(addr: SocketAddr, method: Method, path: &str) -> Reply {
    send_from([127, 0, 0, 1].into(), addr, method, path).await
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, Method::GET, path).await
}

/// Sends one request on a fresh connection whose local address is `from`.
pub async fn send_from(from: IpAddr, addr: SocketAddr, method: Method, path: &str) -> Reply {
    send_full(from, addr, method, path, Bytes::new()).await
}

/// Sends one request with a body (Content-Length) from 127.0.0.1.
pub async fn send_body(addr: SocketAddr, method: Method, path: &str, body: &'static str) -> Reply {
    send_full([127, 0, 0, 1].into(), addr, method, path, Bytes::from(body)).await
}

/// Sends one request with extra header fields from 127.0.0.1.
pub async fn send_with_headers(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let from = [127, 0, 0, 1].into();
    send_fields(from, addr, method, path, Bytes::new(), headers).await
}

async fn send_full(
    from: IpAddr,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Bytes,
) -> Reply {
    send_fields(from, addr, method, path, body, &[]).await
}

async fn send_fields(
    from: IpAddr,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Bytes,
    headers: &[(&str, &str)],
) -> Reply {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body)).unwrap();
    let res = sender.send_request(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}
pub mod custom;
