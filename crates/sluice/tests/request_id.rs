//! `[request_id]`: every request gets an ID (issue 32, item 2): the one a trusted client sent,
//! else a new one; it goes upstream once, into the access log and into Sluice's own error
//! answers. The test command runs these on the fast path and again with it off (hyper).
#![allow(clippy::unwrap_used)]

use crate::support;

use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::Full;
use support::upstream::RefusingPort;
use support::{send, Backend, Reply, TestProxy};

/// A proxy with an untrusted listener (`public`) and a trusted one (`internal`), both routing
/// `/dead` to a port that refuses connections and everything else to `backend`.
async fn proxy(backend: &Backend, dead: &RefusingPort, dir: &std::path::Path) -> TestProxy {
    let toml = format!(
        r#"
[request_id]
[access_log]
format = "{{request_id}} {{status}}"
path = "access.log"
[[listener]]
name = "public"
listen = "127.0.0.1:0"
[[listener]]
name = "internal"
listen = "127.0.0.1:0"
trusted_proxies = ["127.0.0.0/8"]
[[route]]
path_prefix = "/dead"
cluster = "dead"
[[route]]
cluster = "backend"
[cluster.backend]
kind = "static"
endpoints = ["{}"]
[cluster.dead]
kind = "static"
endpoints = ["{}"]
"#,
        backend.addr, dead.addr
    );
    TestProxy::start_in(&toml, dir).await
}

async fn get(proxy: &TestProxy, listener: usize, path: &str, id: Option<&str>) -> Reply {
    let url = format!("http://{}{path}", proxy.addrs[listener].1);
    let mut req = Request::get(url);
    if let Some(id) = id {
        req = req.header("x-request-id", id);
    }
    let req = req.body(Full::default()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), send(&support::client(), req))
        .await
        .expect("no answer")
}

/// The IDs the backend saw, from its `/headers` listing.
fn seen(reply: &Reply) -> Vec<String> {
    reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("x-request-id: "))
        .map(str::to_owned)
        .collect()
}

fn is_uuid(id: &str) -> bool {
    let groups: Vec<usize> = id.split('-').map(str::len).collect();
    groups == [8, 4, 4, 4, 12] && id.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
}

#[tokio::test]
async fn a_request_without_an_id_gets_a_new_one_upstream() {
    let (backend, dead, dir) = (Backend::start("b").await, RefusingPort::new(), tempdir());
    let proxy = proxy(&backend, &dead, dir.path()).await;
    let first = seen(&get(&proxy, 0, "/headers", None).await);
    let second = seen(&get(&proxy, 0, "/headers", None).await);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(is_uuid(&first[0]), "{first:?}");
    assert_ne!(first, second);
}

#[tokio::test]
async fn an_untrusted_clients_id_is_replaced_and_a_trusted_ones_kept() {
    let (backend, dead, dir) = (Backend::start("b").await, RefusingPort::new(), tempdir());
    let proxy = proxy(&backend, &dead, dir.path()).await;
    let public = seen(&get(&proxy, 0, "/headers", Some("chosen-by-client")).await);
    assert_eq!(public.len(), 1, "{public:?}");
    assert!(is_uuid(&public[0]), "{public:?}");
    let internal = seen(&get(&proxy, 1, "/headers", Some("from-the-edge-7")).await);
    assert_eq!(internal, ["from-the-edge-7"]);
}

#[tokio::test]
async fn sluices_own_error_answers_and_the_access_log_carry_the_id() {
    let (backend, dead, dir) = (Backend::start("b").await, RefusingPort::new(), tempdir());
    let proxy = proxy(&backend, &dead, dir.path()).await;
    let failed = get(&proxy, 1, "/dead", Some("edge-42")).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
    assert_eq!(failed.headers["x-request-id"], "edge-42");
    // The endpoint is ejected by now: 503 from Sluice itself, again with the ID.
    let generated = get(&proxy, 0, "/dead", None).await;
    assert_eq!(generated.status, StatusCode::SERVICE_UNAVAILABLE);
    let id = generated.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(is_uuid(&id), "{id}");
    let served = seen(&get(&proxy, 0, "/headers", None).await).remove(0);
    let log = dir.path().join("access.log");
    let want = [
        "edge-42 502".to_owned(),
        format!("{id} 503"),
        format!("{served} 200"),
    ];
    for _ in 0..500 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 3 {
            assert_eq!(text.lines().collect::<Vec<_>>(), want);
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the access log never got its 3 lines");
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}
