//! `sluice ctl` as an operator uses it, against a fake admin API on 127.0.0.1:0 that serves
//! the documented replies and records every request it gets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// A request as the fake admin API saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    authorization: Option<String>,
    content_type: Option<String>,
    body: Bytes,
}

fn status_json() -> Value {
    json!({
        "version": "0.1.0", "uptime_seconds": 12.5, "node": "draining",
        "listeners": [{"name": "public", "addr": "127.0.0.1:8080", "tls": false},
                      {"name": "secure", "addr": "127.0.0.1:8443", "tls": true,
                       "certificates": [{"names": ["a.test"], "not_after": 1, "days_left": 41.6},
                                        {"names": ["b.test"], "not_after": 1, "days_left": -2.0}]}],
        "acceptor": {"addr": "127.0.0.1:7070"},
        "clusters": [
            {"name": "api", "kind": "reverse", "sessions": 12,
             "slices": [{"name": "default", "idle": 3, "queued": 0},
                        {"name": "batch", "idle": 0, "queued": 17, "sessions": 4,
                         "in_flight": 4, "oldest_wait_ms": 250, "asks_for": 17,
                         "why": "17 requests wait for a session"}],
             "instances": [{"id": "a", "sessions": 8, "upgraded": 2, "draining": false,
                            "declared": 16, "retiring": 1},
                           {"id": "b", "sessions": 4, "draining": true}]},
            {"name": "legacy", "kind": "static",
             "endpoints": [{"addr": "127.0.0.1:9001", "healthy": true, "in_flight": 2,
                            "idle_connections": 5},
                           {"addr": "127.0.0.1:9002", "healthy": false, "ejected_ms": 800,
                            "ejections": 3, "connect_failures": 4}]}
        ],
        "relays": [{"name": "edge", "addr": "127.0.0.1:7000", "accepted": 10, "active": 1,
                    "bytes_down": 2048, "bytes_up": 512, "connect_ms_avg": 1.25, "connects": 10,
                    "early_connects": 0, "pool_dead": 0, "pool_idle": 4, "pool_misses": 2,
                    "refused": 3}],
        "caches": [{"route": "pages", "entries": 7, "stored_bytes": 9000, "memory": 1048576,
                    "hits": 40, "misses": 9, "stale": 2},
                   {"route": "assets", "entries": 1, "stored_bytes": 100, "memory": 1048576,
                    "hits": 0, "misses": 1, "stale": 0,
                    "disk": {"path": "/var/cache/a", "entries": 5, "stored_bytes": 50000,
                             "max_size": 1073741824}}]
    })
}

/// The fake admin API: the spec's replies for cluster `api` (reverse, instance `a`) and
/// `legacy` (static, endpoint 127.0.0.1:9001); `token`, if set, is required.
struct FakeAdmin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeAdmin {
    fn start(token: Option<&str>) -> Self {
        // Bound here, so the listener accepts before `start` returns: no wait for readiness.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (record, token) = (seen.clone(), token.map(|t| format!("Bearer {t}")));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(serve(listener, record, token));
        });
        Self { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(
    listener: std::net::TcpListener,
    seen: Arc<Mutex<Vec<Seen>>>,
    token: Option<String>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        let (seen, token) = (seen.clone(), token.clone());
        let service = service_fn(move |req| {
            let (seen, token) = (seen.clone(), token.clone());
            async move { Ok::<_, Infallible>(handle(req, &seen, token.as_deref()).await) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    seen: &Mutex<Vec<Seen>>,
    token: Option<&str>,
) -> Response<Full<Bytes>> {
    let header = |name| {
        req.headers()
            .get(name)
            .map(|v: &http::HeaderValue| v.to_str().unwrap().to_owned())
    };
    let request = Seen {
        method: req.method().clone(),
        path: req.uri().path().to_owned(),
        authorization: header(http::header::AUTHORIZATION),
        content_type: header(http::header::CONTENT_TYPE),
        body: Bytes::new(),
    };
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let request = Seen { body, ..request };
    seen.lock().unwrap().push(request.clone());
    if token.is_some() && request.authorization.as_deref() != token {
        return reply(401, json!({"error": "missing or invalid bearer token"}));
    }
    route(&request)
}

fn route(req: &Seen) -> Response<Full<Bytes>> {
    let segments: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
    match (req.method.as_str(), segments.as_slice()) {
        ("GET", ["status"]) => reply(200, status_json()),
        ("POST", ["drain"]) => reply(200, json!({"node": "draining"})),
        ("POST", ["resume"]) => reply(200, json!({"node": "ready"})),
        ("GET", ["routes"]) => reply(
            200,
            json!({"routes": [{"name": "api", "cluster": "api", "hosts": ["api.example"]}]}),
        ),
        ("POST", ["clusters", "api", "instances", "a", "drain"]) => reply(
            200,
            json!({"cluster": "api", "instance": "a", "draining": true}),
        ),
        ("POST", ["clusters", "api", "instances", "a", "resume"]) => reply(
            200,
            json!({"cluster": "api", "instance": "a", "draining": false}),
        ),
        ("POST", ["clusters", c, "instances", i, "drain"]) => reply(
            404,
            json!({"error": format!("no instance `{i}` in cluster `{c}`")}),
        ),
        ("POST", ["clusters", "legacy", "endpoints"]) => {
            let body: Value = serde_json::from_slice(&req.body).unwrap();
            let added = body["addr"] != "127.0.0.1:9001";
            let code = if added { 201 } else { 200 };
            reply(
                code,
                json!({"cluster": "legacy", "addr": body["addr"], "added": added}),
            )
        }
        ("POST", ["routes", "c", "cache", "purge"]) => {
            let body: Value = serde_json::from_slice(&req.body).unwrap();
            let purged = if body.get("prefix").is_some() { 2 } else { 1 };
            reply(200, json!({"route": "c", "purged": purged}))
        }
        ("DELETE", ["clusters", "legacy", "endpoints", "127.0.0.1:9001"]) => reply(
            200,
            json!({"cluster": "legacy", "addr": "127.0.0.1:9001", "removed": true}),
        ),
        _ => reply(404, json!({"error": "not found"})),
    }
}

fn reply(status: u16, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// `sluice ctl` with none of the operator's own SLUICE_ADMIN* settings.
fn ctl() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("ctl")
        .env_remove("SLUICE_ADMIN")
        .env_remove("SLUICE_ADMIN_TOKEN")
        .env_remove("SLUICE_LOG_FORMAT");
    cmd
}

fn run(cmd: &mut Command) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (status.code(), text(stdout), text(stderr))
}

/// Each line's words, so that assertions do not depend on column widths.
fn rows(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[test]
fn status_shows_listeners_clusters_slices_instances_and_endpoints() {
    let admin = FakeAdmin::start(None);
    let (code, stdout, stderr) = run(ctl().args(["--admin", &admin.url(), "status"]));
    assert_eq!(code, Some(0), "{stderr}");
    let rows = rows(&stdout);
    for expected in [
        vec!["public", "127.0.0.1:8080", "no", "-"],
        vec![
            "secure",
            "127.0.0.1:8443",
            "yes",
            "a.test:42d,b.test:EXPIRED",
        ],
        vec!["acceptor:", "127.0.0.1:7070"],
        vec!["api", "reverse", "12"],
        vec!["legacy", "static", "-"],
        vec![
            "SLICE",
            "SESSIONS",
            "IDLE",
            "IN-FLIGHT",
            "QUEUED",
            "OLDEST-WAIT",
            "ASKS-FOR",
            "WHY",
        ],
        vec!["default", "0", "3", "0", "0", "0ms", "0"],
        vec![
            "batch", "4", "0", "4", "17", "250ms", "17", "17", "requests", "wait", "for", "a",
            "session",
        ],
        vec![
            "INSTANCE", "SESSIONS", "DECLARED", "RETIRING", "UPGRADED", "DRAINING",
        ],
        vec!["a", "8", "16", "1", "2", "no"],
        vec!["b", "4", "-", "0", "0", "yes"],
        vec![
            "ENDPOINT",
            "HEALTHY",
            "EJECTED",
            "EJECTIONS",
            "CONNECT-FAILS",
            "IN-FLIGHT",
            "IDLE-CONNS",
        ],
        vec!["127.0.0.1:9001", "yes", "no", "0", "0", "2", "5"],
        vec!["127.0.0.1:9002", "no", "800ms", "3", "4", "0", "0"],
        vec![
            "edge",
            "127.0.0.1:7000",
            "1",
            "10",
            "3",
            "4",
            "2",
            "1.2",
            "512",
            "2048",
            "-",
        ],
        vec![
            "CACHE",
            "ENTRIES",
            "BYTES",
            "HITS",
            "MISSES",
            "STALE",
            "DISK-ENTRIES",
            "DISK-BYTES",
        ],
        vec!["pages", "7", "9000", "40", "9", "2", "-", "-"],
        vec!["assets", "1", "100", "0", "1", "0", "5", "50000"],
    ] {
        assert!(rows.contains(&expected), "no row {expected:?} in\n{stdout}");
    }
    let seen = admin.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/status")
    );
    assert_eq!(seen[0].authorization, None);
}

#[test]
fn drain_node_posts_to_drain_and_says_what_follows() {
    let admin = FakeAdmin::start(None);
    let (code, stdout, stderr) =
        run(ctl().args(["--admin", &admin.url(), "drain-node", "--wait", "0s"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("node draining: /ready answers 503"),
        "{stdout}"
    );
    let seen = admin.seen();
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("POST", "/drain")
    );
}

#[test]
fn status_json_prints_the_servers_json() {
    let admin = FakeAdmin::start(None);
    let (code, stdout, stderr) = run(ctl().args(["--admin", &admin.url(), "--json", "status"]));
    assert_eq!(code, Some(0), "{stderr}");
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(printed, status_json());
}

#[test]
fn drain_posts_with_the_token_from_the_environment() {
    let admin = FakeAdmin::start(Some("s3cret"));
    let (code, stdout, stderr) = run(ctl()
        .env("SLUICE_ADMIN", admin.url())
        .env("SLUICE_ADMIN_TOKEN", "s3cret")
        .args(["drain", "api", "a"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout,
        "draining instance a of cluster api; it stays out until `sluice ctl resume api a`\n"
    );
    let seen = admin.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, Method::POST);
    assert_eq!(seen[0].path, "/clusters/api/instances/a/drain");
    assert_eq!(seen[0].authorization.as_deref(), Some("Bearer s3cret"));
}

#[test]
fn resume_posts_to_the_instances_resume() {
    let admin = FakeAdmin::start(None);
    let (code, stdout, stderr) = run(ctl().args(["--admin", &admin.url(), "resume", "api", "a"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout,
        "resumed instance a of cluster api: its SDKs register again at their next probe (within 30 s by default), or at once when restarted\n"
    );
    let seen = admin.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, Method::POST);
    assert_eq!(seen[0].path, "/clusters/api/instances/a/resume");
}

#[test]
fn endpoints_add_sends_the_address_as_json() {
    let admin = FakeAdmin::start(None);
    let (code, stdout, stderr) = run(ctl().args([
        "--admin",
        &admin.url(),
        "endpoints",
        "add",
        "legacy",
        "127.0.0.1:9003",
    ]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "added endpoint 127.0.0.1:9003 to cluster legacy\n");
    let seen = admin.seen();
    assert_eq!(seen[0].method, Method::POST);
    assert_eq!(seen[0].path, "/clusters/legacy/endpoints");
    assert_eq!(seen[0].content_type.as_deref(), Some("application/json"));
    let body: Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(body, json!({"addr": "127.0.0.1:9003"}));
}

#[test]
fn endpoints_add_of_a_present_address_says_nothing_changed() {
    let admin = FakeAdmin::start(None);
    let url = admin.url();
    let args = [
        "--admin",
        &url,
        "endpoints",
        "add",
        "legacy",
        "127.0.0.1:9001",
    ];
    let (code, stdout, _) = run(ctl().args(args));
    assert_eq!(code, Some(0));
    assert_eq!(
        stdout,
        "endpoint 127.0.0.1:9001 was already in cluster legacy: nothing changed\n"
    );
}

#[test]
fn endpoints_del_deletes_and_json_prints_the_reply() {
    let admin = FakeAdmin::start(None);
    let url = admin.url();
    let args = [
        "--admin",
        &url,
        "endpoints",
        "del",
        "legacy",
        "127.0.0.1:9001",
    ];
    let (code, stdout, stderr) = run(ctl().args(args));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout,
        "removed endpoint 127.0.0.1:9001 from cluster legacy\n"
    );
    let (code, stdout, _) = run(ctl().args(args).arg("--json"));
    assert_eq!(code, Some(0));
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(printed["removed"], json!(true));
    let seen = admin.seen();
    assert_eq!(seen[0].method, Method::DELETE);
    assert_eq!(seen[0].path, "/clusters/legacy/endpoints/127.0.0.1:9001");
}

#[test]
fn a_missing_token_is_named_and_exits_1() {
    let admin = FakeAdmin::start(Some("s3cret"));
    let (code, stdout, stderr) = run(ctl().args(["--admin", &admin.url(), "status"]));
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.starts_with("sluice ctl: ")
            && stderr.contains("wants a bearer token: set SLUICE_ADMIN_TOKEN"),
        "{stderr}"
    );
}

#[test]
fn a_wrong_token_is_refused_and_exits_1() {
    let admin = FakeAdmin::start(Some("s3cret"));
    let (code, _, stderr) =
        run(ctl()
            .env("SLUICE_ADMIN_TOKEN", "guess")
            .args(["--admin", &admin.url(), "status"]));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("refused the bearer token"), "{stderr}");
    assert!(!stderr.contains("guess"), "the token was printed: {stderr}");
}

#[test]
fn a_dead_port_gives_the_reachability_hint_and_exits_1() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{dead}");
    let (code, stdout, stderr) = run(ctl().args(["--admin", &url, "status"]));
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    assert!(
        stderr.starts_with(&format!("sluice ctl: cannot reach the admin API at {url}")),
        "{stderr}"
    );
    assert!(stderr.contains("set --admin or SLUICE_ADMIN"), "{stderr}");
}

#[test]
fn a_404_shows_the_servers_error_and_exits_1() {
    let admin = FakeAdmin::start(None);
    let (code, stdout, stderr) = run(ctl().args(["--admin", &admin.url(), "drain", "api", "zz"]));
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    let mut lines = stderr.lines();
    assert_eq!(
        lines.next(),
        Some("sluice ctl: the admin API answered 404 Not Found: no instance `zz` in cluster `api`")
    );
    let hint = lines.next().unwrap_or_default();
    assert!(hint.contains(&admin.url()), "{stderr}");
    assert!(hint.contains("from --admin"), "{stderr}");
    for way in ["--admin URL", "SLUICE_ADMIN", "-c FILE"] {
        assert!(hint.contains(way), "{stderr}");
    }
}

/// A proxy's config file in `dir` whose `[admin]` is `admin`, with `admin_keys` besides
/// `listen`.
fn config_naming(admin: &FakeAdmin, admin_keys: &str, dir: &std::path::Path) -> PathBuf {
    let config = dir.join("sluice.toml");
    let addr = admin.url().trim_start_matches("http://").to_owned();
    std::fs::write(
        &config,
        format!(
            "[admin]\nlisten = \"{addr}\"\n{admin_keys}\
             [[listener]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\n\
             [[route]]\ndirect_response = {{ status = 200 }}\n"
        ),
    )
    .unwrap();
    config
}

#[test]
fn an_error_names_the_config_file_that_chose_the_admin_api() {
    let admin = FakeAdmin::start(None);
    let dir = tempfile::tempdir().unwrap();
    let config = config_naming(&admin, "", dir.path());
    let (code, _, stderr) = run(ctl().arg("-c").arg(&config).args(["drain", "api", "zz"]));
    assert_eq!(code, Some(1));
    let expected = format!(
        "(admin API {}, from the [admin] of {};",
        admin.url(),
        config.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn https_is_a_usage_error() {
    let (code, _, stderr) = run(ctl().args(["--admin", "https://127.0.0.1:9901", "status"]));
    assert_eq!(code, Some(2));
    assert!(stderr.contains("use http://"), "{stderr}");
}

#[test]
fn routes_without_a_subcommand_lists_them() {
    let admin = FakeAdmin::start(None);
    let (code, stdout, stderr) = run(ctl().args(["--admin", &admin.url(), "routes"]));
    assert_eq!(code, Some(0), "{stderr}");
    let rows = rows(&stdout);
    assert!(rows.contains(&vec!["ROUTE", "MATCH", "TARGET"]), "{stdout}");
    assert!(
        rows.contains(&vec!["api", "host=api.example", "api"]),
        "{stdout}"
    );
    assert_eq!(admin.seen()[0].path, "/routes");
}

#[test]
fn the_config_file_says_where_the_admin_api_is() {
    let admin = FakeAdmin::start(Some("from-the-file"));
    let dir = tempfile::tempdir().unwrap();
    let config = config_naming(&admin, "token = \"from-the-file\"\n", dir.path());
    let (code, _, stderr) = run(ctl()
        .env_remove("SLUICE_ADMIN")
        .env_remove("SLUICE_ADMIN_TOKEN")
        .arg("-c")
        .arg(&config)
        .arg("status"));
    assert_eq!(code, Some(0), "{stderr}");
    let seen = admin.seen();
    assert_eq!(seen[0].path, "/status");
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some("Bearer from-the-file")
    );
}

#[test]
fn resume_node_posts_to_resume_and_says_the_node_is_ready_again() {
    let admin = FakeAdmin::start(None);
    let (code, stdout, stderr) = run(ctl().args(["--admin", &admin.url(), "resume-node"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "node ready: /ready answers as before the drain\n");
    let seen = admin.seen();
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("POST", "/resume")
    );
}

#[test]
fn purge_posts_a_key_or_a_prefix_with_the_token() {
    let admin = FakeAdmin::start(Some("s3cret"));
    let purge = |what: &str, url: &str| {
        run(ctl()
            .env("SLUICE_ADMIN", admin.url())
            .env("SLUICE_ADMIN_TOKEN", "s3cret")
            .args(["purge", "c", what, url]))
    };
    let (code, stdout, stderr) = purge("--key", "http://a.example/x?y=1");
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "purged 1 key(s) from the cache of route c\n");
    let (code, stdout, stderr) = purge("--prefix", "http://a.example/img/");
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "purged 2 key(s) from the cache of route c\n");
    let seen = admin.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(
            (&s.method, s.path.as_str()),
            (&Method::POST, "/routes/c/cache/purge")
        );
        assert_eq!(s.authorization.as_deref(), Some("Bearer s3cret"));
    }
    let body = |i: usize| serde_json::from_slice::<Value>(&seen[i].body).unwrap();
    assert_eq!(body(0), json!({"key": "http://a.example/x?y=1"}));
    assert_eq!(body(1), json!({"prefix": "http://a.example/img/"}));
}

#[test]
fn purge_needs_one_of_key_and_prefix() {
    let admin = FakeAdmin::start(None);
    let url = admin.url();
    for args in [
        vec!["purge", "c"],
        vec!["purge", "c", "--key", "http://a/x", "--prefix", "http://a/"],
    ] {
        let (code, _, stderr) = run(ctl().args(["--admin", &url]).args(&args));
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("--key") || stderr.contains("--prefix"),
            "{stderr}"
        );
    }
    assert!(admin.seen().is_empty());
}
