//! Runs each example binary against in-process backends and checks what its user would see.
//!
//! `cargo test -p sluice-examples` builds the examples before running this; the binaries sit
//! in `target/<profile>/examples/`, next to the `deps/` directory holding this test. Cargo
//! builds them only when it tests the whole package (not with `--test examples` alone), so a
//! binary older than its source fails the test instead of passing on stale code.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sluice::Group;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::timeout;

/// The bound on every wait: a healthy run takes milliseconds.
const WAIT: Duration = Duration::from_secs(5);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A running example and the addresses it announced.
struct Example {
    child: Child,
    addrs: HashMap<String, SocketAddr>,
}

impl Example {
    /// Starts example `name` with `args` and waits for its `listening NAME=ADDR` line for each
    /// of `listeners`.
    async fn start(name: &str, args: &[String], listeners: &[&str]) -> Self {
        let mut child = Command::new(example_path(name))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the example");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let mut addrs = HashMap::new();
        let announced = async {
            while addrs.len() < listeners.len() {
                let line = lines.next_line().await.expect("read stdout");
                let line = line.expect("the example exited before listening");
                let (listener, addr) = line
                    .strip_prefix("listening ")
                    .and_then(|rest| rest.split_once('='))
                    .expect("a `listening NAME=ADDR` line");
                addrs.insert(listener.to_owned(), addr.parse().expect("IP:PORT"));
            }
        };
        timeout(WAIT, announced).await.expect("announced in time");
        Self { child, addrs }
    }

    /// `http://ADDR` of the listener called `name`.
    fn url(&self, name: &str, path: &str) -> String {
        format!("http://{}{path}", self.addrs[name])
    }

    /// Sends SIGTERM and waits for the process to exit.
    async fn terminate(mut self) -> ExitStatus {
        let pid = self.child.id().expect("still running").to_string();
        let kill = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(kill.success(), "kill -TERM {pid}");
        let exited = timeout(WAIT, self.child.wait()).await;
        exited
            .expect("exited in time")
            .expect("wait for the example")
    }
}

/// `target/<profile>/examples/<name>`, found from this test's own path in `.../deps/`.
fn example_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    let profile_dir = exe.parent().and_then(Path::parent);
    let path = profile_dir
        .expect("target/<profile>")
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let rebuild = "run `cargo test -p sluice-examples`, which builds the examples";
    let Some(built) = modified(&path) else {
        panic!("{} is missing: {rebuild}", path.display());
    };
    let sources = Path::new(env!("CARGO_MANIFEST_DIR"));
    for source in [format!("{name}.rs"), "lib.rs".to_owned()] {
        let changed = modified(&sources.join(&source)).expect("the example's source");
        assert!(
            changed <= built,
            "{} is older than {source}: {rebuild}",
            path.display()
        );
    }
    path
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Starts one backend per name, each answering `NAME\n`; they run until the test ends.
async fn backends(names: &[&str]) -> Vec<SocketAddr> {
    let mut group = Group::new();
    let mut addrs = Vec::new();
    for name in names {
        let addr = sluice_examples::demo_backend(&mut group, name).await;
        addrs.push(addr.expect("bind a backend"));
    }
    tokio::spawn(group.run_until(std::future::pending::<()>()));
    addrs
}

/// `[--flag, ADDR]` for each address.
fn flags(flag: &str, addrs: &[SocketAddr]) -> Vec<String> {
    addrs
        .iter()
        .flat_map(|a| [flag.to_owned(), a.to_string()])
        .collect()
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends a request without a body and reads the whole response.
async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    host: Option<&str>,
) -> Response<String> {
    let mut req = Request::builder().method(method).uri(url);
    if let Some(host) = host {
        req = req.header(header::HOST, host);
    }
    let req = req.body(Empty::new()).expect("a valid request");
    let exchange = async {
        let res = client.request(req).await.expect("a response");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("the body").to_bytes();
        Response::from_parts(parts, String::from_utf8(body.to_vec()).expect("UTF-8"))
    };
    timeout(WAIT, exchange).await.expect("answered in time")
}

/// Sends `n` GETs to `url` and counts the responses by body (the backend's name).
async fn spread(client: &HttpClient, url: &str, n: usize) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n {
        let res = send(client, Method::GET, url, None).await;
        assert_eq!(res.status(), StatusCode::OK, "{}", res.body());
        *counts.entry(res.into_body()).or_default() += 1;
    }
    counts
}

fn counts<const N: usize>(pairs: [(&str, usize); N]) -> HashMap<String, usize> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

#[tokio::test]
async fn load_balance_spreads_evenly_runs_the_hook_and_exits_cleanly() {
    let upstreams = backends(&["a", "b", "c"]).await;
    let mut args = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
    args.extend(flags("--upstream", &upstreams));
    let example = Example::start("load_balance", &args, &["proxy"]).await;
    let client = client();

    let mut seen = HashMap::new();
    for _ in 0..30 {
        let res = send(&client, Method::GET, &example.url("proxy", "/"), None).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-proxied-by"], "sluice-example");
        *seen.entry(res.into_body()).or_default() += 1;
    }
    assert_eq!(seen, counts([("a\n", 10), ("b\n", 10), ("c\n", 10)]));

    drop(client);
    let status = example.terminate().await;
    assert!(
        status.success(),
        "SIGTERM should drain and exit 0, got {status}"
    );
}

#[tokio::test]
async fn host_routing_picks_the_upstream_by_host_and_404s_the_rest() {
    let upstreams = backends(&["a", "b"]).await;
    let mut args = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
    args.extend(flags("--a-upstream", &upstreams[..1]));
    args.extend(flags("--b-upstream", &upstreams[1..]));
    let example = Example::start("host_routing", &args, &["proxy"]).await;
    let (client, url) = (client(), example.url("proxy", "/"));

    let get = |host: &'static str| send(&client, Method::GET, &url, Some(host));
    let a = get("a.example").await;
    assert_eq!((a.status(), a.body().as_str()), (StatusCode::OK, "a\n"));
    // The router sees the host lowercased and without the port.
    let b = get("B.Example:8080").await;
    assert_eq!((b.status(), b.body().as_str()), (StatusCode::OK, "b\n"));
    assert_eq!(get("c.example").await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn dynamic_upstreams_follow_the_control_endpoint() {
    let upstreams = backends(&["a", "b"]).await;
    let (a, b) = (upstreams[0], upstreams[1]);
    let mut args = ["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"]
        .map(String::from)
        .to_vec();
    args.extend(flags("--upstream", &[a]));
    let example = Example::start("dynamic_upstreams", &args, &["proxy", "control"]).await;
    let client = client();
    let proxy = example.url("proxy", "/");
    let control = |method: Method, query: String| {
        let url = example.url("control", &format!("/upstreams{query}"));
        let client = &client;
        async move {
            let res = send(client, method, &url, None).await;
            (res.status(), res.into_body())
        }
    };
    let added = |addr: SocketAddr| format!("?addr={addr}");

    assert_eq!(spread(&client, &proxy, 4).await, counts([("a\n", 4)]));

    assert_eq!(control(Method::POST, added(b)).await.0, StatusCode::CREATED);
    assert_eq!(control(Method::POST, added(b)).await.0, StatusCode::OK);
    assert_eq!(
        control(Method::GET, String::new()).await,
        (StatusCode::OK, format!("{a}\n{b}\n"))
    );
    assert_eq!(
        spread(&client, &proxy, 4).await,
        counts([("a\n", 2), ("b\n", 2)])
    );

    assert_eq!(control(Method::DELETE, added(a)).await.0, StatusCode::OK);
    assert_eq!(
        control(Method::DELETE, added(a)).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(spread(&client, &proxy, 4).await, counts([("b\n", 4)]));

    let bad = control(Method::POST, "?addr=not-an-addr".to_owned()).await;
    assert_eq!(
        bad,
        (StatusCode::BAD_REQUEST, "addr is not IP:PORT\n".to_owned())
    );
    let missing = control(Method::POST, String::new()).await;
    assert_eq!(missing.0, StatusCode::BAD_REQUEST);
    assert_eq!(
        control(Method::GET, String::new()).await.1,
        format!("{b}\n")
    );

    // With no upstream left the proxy says so instead of hanging.
    assert_eq!(control(Method::DELETE, added(b)).await.0, StatusCode::OK);
    let res = send(&client, Method::GET, &proxy, None).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
}
