//! The admin API on a real socket: token checks, status that follows the sessions, drain,
//! static endpoints, and a `/metrics` scrape that parses as Prometheus text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::net::SocketAddr;
use std::path::Path;

use http::StatusCode;
use reverse_support::{get, Service, ServiceSpec};
use sluice::{Proxy, ReverseCluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "admin-s3cret";

struct Running {
    http: SocketAddr,
    acceptor: SocketAddr,
    admin: SocketAddr,
    cluster: ReverseCluster,
    stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Running {
    start_with(&format!("token = \"{TOKEN}\"\n")).await
}

/// A proxy as [`start`] makes it, with a service of two sessions registered and idle.
async fn start_serving() -> (Running, std::sync::Arc<Service>) {
    let p = start().await;
    let svc = Service::start(p.acceptor, ServiceSpec::new("a", 2)).await;
    p.cluster
        .wait_until(|c| c.idle_sessions("default") == 2)
        .await;
    (p, svc)
}

/// A proxy whose `[admin]` table has `admin_keys` besides `listen`.
async fn start_with(admin_keys: &str) -> Running {
    start_full(admin_keys, "startup_wait = \"0s\"\n").await
}

/// [`start_with`], with `cluster_keys` in `[cluster.api]`.
async fn start_full(admin_keys: &str, cluster_keys: &str) -> Running {
    let text = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n{admin_keys}\
         [acceptor]\nlisten = \"127.0.0.1:0\"\nhandshakes_per_second = 0\n\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"legacy\"\npath_prefix = \"/legacy\"\ncluster = \"legacy\"\n\
         [[route]]\nname = \"api\"\ncluster = \"api\"\n\
         [cluster.api]\nkind = \"reverse\"\nno_sessions_wait = \"1h\"\n{cluster_keys}\
         [cluster.legacy]\nkind = \"static\"\nendpoints = [\"127.0.0.1:9\"]\n"
    );
    let config = sluice::config::parse_str(&text, "admin.toml", Path::new(".")).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = Running {
        http: proxy.local_addrs()[0].1,
        acceptor: proxy.acceptor_addr().unwrap(),
        admin: proxy.admin_addr().unwrap(),
        cluster: proxy.reverse_cluster("api").unwrap().clone(),
        stop,
    };
    tokio::spawn(proxy.run_until(async move {
        let _ = stopped.await;
    }));
    running
}

/// One HTTP/1.1 exchange (Connection: close): the status and the body.
async fn call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    call_with(admin, method, path, &format!("Host: admin\r\n{auth}"), body).await
}

/// [`call`] with the `Host` and any other header lines given in `headers`.
async fn call_with(
    admin: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(admin).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\n{headers}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

async fn json(admin: SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, text) = call(admin, method, path, Some(TOKEN), body).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test]
async fn every_call_needs_the_token() {
    let p = start().await;
    for (method, path) in [
        ("GET", "/status"),
        ("GET", "/metrics"),
        ("POST", "/clusters/api/instances/a/drain"),
        ("POST", "/clusters/api/instances/a/resume"),
    ] {
        assert_eq!(call(p.admin, method, path, None, "").await.0, 401, "{path}");
        assert_eq!(
            call(p.admin, method, path, Some("wrong"), "").await.0,
            401,
            "{path}"
        );
    }
    let _ = p.stop.send(());
}

#[tokio::test]
async fn status_follows_the_sessions_and_drain_empties_an_instance() {
    let (p, _svc) = start_serving().await;
    let (status, body) = json(p.admin, "GET", "/status", "").await;
    assert_eq!(status, 200);
    assert_eq!(body["listeners"][0]["addr"], p.http.to_string());
    assert_eq!(body["acceptor"]["addr"], p.acceptor.to_string());
    let api = &body["clusters"][0];
    assert_eq!(
        (api["name"].as_str(), api["kind"].as_str()),
        (Some("api"), Some("reverse"))
    );
    assert_eq!(api["slices"][0]["idle"], 2);
    assert_eq!(api["instances"][0]["id"], "a");
    assert_eq!(api["instances"][0]["sessions"], 2);
    assert_eq!(body["clusters"][1]["endpoints"][0]["addr"], "127.0.0.1:9");

    let (status, body) = json(p.admin, "POST", "/clusters/api/instances/a/drain", "").await;
    assert_eq!((status, body["draining"].as_bool()), (200, Some(true)));
    p.cluster.wait_until(|c| c.sessions() == 0).await;
    // Drained, it stays listed and out until resumed; draining it again changes nothing.
    assert_eq!(
        json(p.admin, "POST", "/clusters/api/instances/a/drain", "")
            .await
            .0,
        200
    );
    assert_eq!(
        json(p.admin, "POST", "/clusters/api/instances/zz/drain", "")
            .await
            .0,
        404
    );
    assert_eq!(
        json(p.admin, "POST", "/clusters/nope/instances/a/drain", "")
            .await
            .0,
        404
    );
    assert_eq!(
        json(p.admin, "POST", "/clusters/legacy/instances/a/drain", "")
            .await
            .0,
        409
    );
    let _ = p.stop.send(());
}

#[tokio::test]
async fn a_drained_instance_is_refused_with_410_until_it_is_resumed() {
    use reverse_support::service::dial_raw;
    let p = start().await;
    let spec = ServiceSpec::new("a", 1);
    let _svc = Service::start(p.acceptor, spec.clone()).await;
    p.cluster.wait_until(|c| c.sessions() == 1).await;
    let (status, _) = json(p.admin, "POST", "/clusters/api/instances/a/drain", "").await;
    assert_eq!(status, 200);
    p.cluster.wait_until(|c| c.sessions() == 0).await;

    // The SDK re-dials at once with the same instance id: refused, saying why and what to do.
    let hello = spec.registration().encode();
    let (mut refused, status) = dial_raw(p.acceptor, &hello).await;
    assert_eq!(status, 410);
    let mut answer = String::new();
    refused.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.contains(
            "instance \"a\" of service \"api\" is drained; resume it with sluice ctl resume"
        ),
        "{answer}"
    );
    let (_, body) = json(p.admin, "GET", "/status", "").await;
    let a = &body["clusters"][0]["instances"][0];
    assert_eq!(
        (a["id"].as_str(), a["sessions"].as_u64()),
        (Some("a"), Some(0))
    );
    assert_eq!(a["draining"], true);
    // Another instance id is not held.
    let other = ServiceSpec::new("b", 1).registration().encode();
    assert_eq!(dial_raw(p.acceptor, &other).await.1, 101);

    let (status, body) = json(p.admin, "POST", "/clusters/api/instances/a/resume", "").await;
    assert_eq!((status, body["draining"].as_bool()), (200, Some(false)));
    let (_session, status) = dial_raw(p.acceptor, &hello).await;
    assert_eq!(status, 101);
    let (status, body) = json(p.admin, "POST", "/clusters/api/instances/a/resume", "").await;
    assert_eq!(status, 404, "{body}");
    let _ = p.stop.send(());
}

#[tokio::test]
async fn static_endpoints_are_added_and_removed_with_clear_errors() {
    let p = start().await;
    let add = |body: &'static str| json(p.admin, "POST", "/clusters/legacy/endpoints", body);
    assert_eq!(add(r#"{"addr": "127.0.0.1:9002"}"#).await.0, 201);
    assert_eq!(add(r#"{"addr": "127.0.0.1:9002"}"#).await.0, 200);
    let (status, refused) = add(r#"{"addr": "not an address"}"#).await;
    assert_eq!(status, 400);
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or("")
            .contains("host:port"),
        "{refused}"
    );
    assert_eq!(add("not json").await.0, 400);
    let (_, status) = json(p.admin, "GET", "/status", "").await;
    assert_eq!(
        status["clusters"][1]["endpoints"].as_array().unwrap().len(),
        2
    );
    let del = |path: &'static str| json(p.admin, "DELETE", path, "");
    assert_eq!(
        del("/clusters/legacy/endpoints/127.0.0.1:9002").await.0,
        200
    );
    assert_eq!(
        del("/clusters/legacy/endpoints/127.0.0.1:9002").await.0,
        404
    );
    assert_eq!(del("/clusters/api/endpoints/127.0.0.1:9002").await.0, 409);
    assert_eq!(
        json(
            p.admin,
            "POST",
            "/clusters/api/endpoints",
            r#"{"addr": "127.0.0.1:1"}"#
        )
        .await
        .0,
        409
    );
    let _ = p.stop.send(());
}

/// A static endpoint that refuses connections shows as ejected, with its failures counted.
#[tokio::test]
async fn status_shows_a_static_endpoints_health_and_ejection() {
    let p = start().await;
    let (_, body) = json(p.admin, "GET", "/status", "").await;
    let endpoint = &body["clusters"][1]["endpoints"][0];
    assert_eq!(endpoint["healthy"], true, "{endpoint}");
    assert_eq!(
        (
            endpoint["ejections"].as_u64(),
            endpoint["ejected_ms"].as_u64()
        ),
        (Some(0), Some(0)),
        "{endpoint}"
    );
    assert_eq!(get(p.http, "/legacy").await.status, StatusCode::BAD_GATEWAY);
    let (_, body) = json(p.admin, "GET", "/status", "").await;
    let legacy = &body["clusters"][1];
    assert_eq!(legacy["health_check"], false, "{legacy}");
    let endpoint = &legacy["endpoints"][0];
    assert_eq!(endpoint["ejections"], 1, "{endpoint}");
    assert_eq!(endpoint["connect_failures"], 1, "{endpoint}");
    assert!(endpoint["ejected_ms"].as_u64().unwrap() > 0, "{endpoint}");
    assert_eq!(endpoint["in_flight"], 0, "{endpoint}");
    let _ = p.stop.send(());
}

/// `localhost:PORT` is accepted as the configuration accepts it: every address of the name.
#[tokio::test]
async fn static_endpoints_may_be_named_by_host_and_port() {
    let p = start().await;
    let (status, added) = json(
        p.admin,
        "POST",
        "/clusters/legacy/endpoints",
        r#"{"addr": "localhost:19004"}"#,
    )
    .await;
    assert_eq!(status, 201, "{added}");
    assert_eq!(added["addr"], "localhost:19004");
    let (_, status) = json(p.admin, "GET", "/status", "").await;
    let listed: Vec<_> = status["clusters"][1]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["addr"].as_str().unwrap().to_owned())
        .collect();
    assert!(listed.contains(&"127.0.0.1:19004".to_owned()), "{listed:?}");
    let (status, removed) = json(
        p.admin,
        "DELETE",
        "/clusters/legacy/endpoints/localhost:19004",
        "",
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    let (_, status) = json(p.admin, "GET", "/status", "").await;
    assert_eq!(
        status["clusters"][1]["endpoints"].as_array().unwrap().len(),
        1
    );
    let _ = p.stop.send(());
}

/// The requests of one keep-alive connection are counted by the route and status each of them
/// had, also when the connection moves between routes and statuses (the fast path keeps the
/// last route's counters per connection).
#[tokio::test]
async fn metrics_count_each_request_of_a_connection_by_its_route_and_status() {
    let (p, _svc) = start_serving().await;
    let paths = ["/x", "/legacy", "/y", "/legacy/a", "/z", "/w"];
    let mut pipelined = String::new();
    for (i, path) in paths.iter().enumerate() {
        let close = if i + 1 == paths.len() {
            "Connection: close\r\n"
        } else {
            ""
        };
        pipelined.push_str(&format!(
            "GET {path} HTTP/1.1\r\nHost: a.test\r\n{close}\r\n"
        ));
    }
    let mut conn = TcpStream::connect(p.http).await.unwrap();
    conn.write_all(pipelined.as_bytes()).await.unwrap();
    let mut answers = String::new();
    conn.read_to_string(&mut answers).await.unwrap();
    let statuses: Vec<&str> = answers
        .split("HTTP/1.1 ")
        .skip(1)
        .map(|a| &a[..3])
        .collect();
    assert_eq!(statuses.len(), paths.len(), "{answers}");
    // The dead endpoint answers 502, then 503 once it is ejected: a connection whose requests
    // move between two routes and three statuses.
    assert!(statuses[1] == "502" && statuses[0] == "200", "{answers}");
    let (_, text) = call(p.admin, "GET", "/metrics", Some(TOKEN), "").await;
    let samples = parse(&text);
    let value = |name: &str| samples.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let route = |path: &str| {
        if path.starts_with("/legacy") {
            "legacy"
        } else {
            "api"
        }
    };
    for (path, status) in paths.iter().zip(&statuses) {
        let seen = paths
            .iter()
            .zip(&statuses)
            .filter(|(p, s)| route(p) == route(path) && s == &status)
            .count();
        let name = format!(
            "sluice_requests_total{{route=\"{}\",status=\"{status}\"}}",
            route(path)
        );
        assert_eq!(value(&name), Some(seen as f64), "{name}");
    }
    assert_eq!(
        value("sluice_request_duration_seconds_count{route=\"api\"}"),
        Some(4.0)
    );
    assert_eq!(
        value("sluice_request_duration_seconds_count{route=\"legacy\"}"),
        Some(2.0)
    );
    let _ = p.stop.send(());
}

#[tokio::test]
async fn metrics_count_requests_handshakes_and_sessions() {
    let (p, _svc) = start_serving().await;
    assert_eq!(get(p.http, "/x").await.status, StatusCode::OK);
    assert_eq!(get(p.http, "/y").await.status, StatusCode::OK);
    assert_eq!(get(p.http, "/legacy").await.status, StatusCode::BAD_GATEWAY);
    let (status, text) = call(p.admin, "GET", "/metrics", Some(TOKEN), "").await;
    assert_eq!(status, 200);
    let samples = parse(&text);
    let value = |name: &str| samples.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    assert_eq!(
        value("sluice_requests_total{route=\"api\",status=\"200\"}"),
        Some(2.0)
    );
    assert_eq!(
        value("sluice_requests_total{route=\"legacy\",status=\"502\"}"),
        Some(1.0)
    );
    assert_eq!(
        value("sluice_request_duration_seconds_count{route=\"api\"}"),
        Some(2.0)
    );
    assert_eq!(
        value("sluice_acceptor_handshakes_total{result=\"registered\"}"),
        Some(2.0)
    );
    assert_eq!(
        value("sluice_idle_sessions{cluster=\"api\",slice=\"default\"}"),
        Some(2.0)
    );
    assert_eq!(
        value("sluice_admission_queue_depth{cluster=\"api\",slice=\"default\"}"),
        Some(0.0)
    );
    assert_eq!(
        value("sluice_sessions{cluster=\"api\",instance=\"a\",state=\"active\"}"),
        Some(2.0)
    );
    let refused = value("sluice_upstream_connects_total{cluster=\"legacy\",result=\"error\"}");
    assert!(refused.is_some_and(|n| n >= 1.0), "{text}");
    let received = value("sluice_client_received_bytes_total{listener=\"public\"}").unwrap();
    let sent = value("sluice_client_sent_bytes_total{listener=\"public\"}").unwrap();
    // Three small requests in, three responses out.
    assert!(received > 50.0 && sent > 150.0, "{received} {sent}");
    let _ = p.stop.send(());
}

/// `/metrics` answers each scraper in the format it asks for, with that format's content type:
/// in the Prometheus text format (the default) a counter family is named as its `_total`
/// samples, as Prometheus' parser needs to read it as a counter; OpenMetrics (which Prometheus
/// asks for first) keeps the family's bare name and ends with `# EOF`.
#[tokio::test]
async fn metrics_answer_each_accept_in_its_own_format() {
    let (p, _svc) = start_serving().await;
    assert_eq!(get(p.http, "/x").await.status, StatusCode::OK);
    let scrape = |accept: &'static str| async move {
        let mut stream = TcpStream::connect(p.admin).await.unwrap();
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\
             Authorization: Bearer {TOKEN}\r\n{accept}\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let content_type = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-type")
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_default();
        (content_type, body.to_owned())
    };
    let prometheus_2 = "Accept: application/openmetrics-text;version=1.0.0,\
        application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,\
        */*;q=0.1\r\n";
    for accept in ["", "Accept: text/plain;version=0.0.4;q=0.2,*/*;q=0.1\r\n"] {
        let (content_type, text) = scrape(accept).await;
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
        assert!(
            text.contains("# TYPE sluice_requests_total counter\n"),
            "{text}"
        );
        assert!(!text.contains("# TYPE sluice_requests counter"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
        assert!(!text.contains("# UNIT"), "{text}");
        let samples = parse(&text);
        assert!(samples
            .iter()
            .any(|(n, v)| n == "sluice_requests_total{route=\"api\",status=\"200\"}" && *v == 1.0));
    }
    let (content_type, text) = scrape(prometheus_2).await;
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(text.contains("# TYPE sluice_requests counter\n"), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    let _ = p.stop.send(());
}

/// Every sample line as (name with labels, value); fails on a line that is neither a sample
/// nor a `#` comment, so the exposition must parse as Prometheus text.
fn parse(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("not a sample: {l:?}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("not a number: {l:?}"));
            (name.to_owned(), value)
        })
        .collect()
}

#[tokio::test]
async fn routes_change_at_runtime_including_client_cidr_slices() {
    let p = start().await;
    let _a = Service::start(p.acceptor, ServiceSpec::new("a", 1)).await;
    let mut mobile = ServiceSpec::new("m", 1);
    mobile.slice = "mobile".into();
    let _m = Service::start(p.acceptor, mobile).await;
    p.cluster
        .wait_until(|c| c.idle_sessions("default") == 1 && c.idle_sessions("mobile") == 1)
        .await;

    let (_, listed) = json(p.admin, "GET", "/routes", "").await;
    let names: Vec<_> = listed["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].clone())
        .collect();
    assert_eq!(names, ["legacy", "api"]);
    assert_eq!(get(p.http, "/x").await.text(), "a");

    // The seed paper's `acceptor_cli add 127.0.0.1 32`: this client class gets its own slice.
    let rule = r#"{"name": "slow-clients", "client_cidr": ["127.0.0.1/32"], "cluster": "api", "slice": "mobile"}"#;
    assert_eq!(json(p.admin, "POST", "/routes", rule).await.0, 201);
    assert_eq!(get(p.http, "/x").await.text(), "m");
    assert_eq!(
        json(p.admin, "POST", "/routes", rule).await.0,
        409,
        "the name is taken"
    );
    let (_, listed) = json(p.admin, "GET", "/routes", "").await;
    assert_eq!(listed["routes"][0]["client_cidr"][0], "127.0.0.1/32");

    assert_eq!(
        json(p.admin, "DELETE", "/routes/slow-clients", "").await.0,
        200
    );
    assert_eq!(get(p.http, "/x").await.text(), "a");
    assert_eq!(
        json(p.admin, "DELETE", "/routes/slow-clients", "").await.0,
        404
    );

    for bad in [
        r#"{"name": "x", "client_cidr": ["not-a-net"], "cluster": "api"}"#,
        r#"{"name": "x", "cluster": "nope"}"#,
        r#"{"name": "x", "cluster": "legacy", "slice": "mobile"}"#,
        r#"{"name": "x", "path_prefix": "no-slash", "cluster": "api"}"#,
        r#"{"name": "x", "cluster": "api", "colour": "blue"}"#,
        // The configuration file's own rules: methods are case-sensitive, hosts have no port.
        r#"{"name": "x", "cluster": "api", "methods": ["get"]}"#,
        r#"{"name": "x", "cluster": "api", "hosts": ["api.example.com:8080"]}"#,
        r#"{"cluster": "api"}"#,
    ] {
        assert_eq!(json(p.admin, "POST", "/routes", bad).await.0, 400, "{bad}");
    }
    let _ = p.stop.send(());
}

/// DNS rebinding: a page at attacker.example whose name now resolves to 127.0.0.1 sends the
/// browser's requests with `Host: attacker.example:PORT`; a cross-site form or fetch carries
/// its own `Origin`. Without a token (loopback only), neither may read or change anything.
#[tokio::test]
async fn without_a_token_only_loopback_hosts_and_same_origin_changes_are_served() {
    let p = start_with("").await;
    let port = p.admin.port();
    let rule = r#"{"name": "evil", "cluster": "api"}"#;
    let rebound = format!("Host: attacker.example:{port}\r\n");
    assert_eq!(
        call_with(p.admin, "POST", "/routes", &rebound, rule)
            .await
            .0,
        403
    );
    assert_eq!(
        call_with(p.admin, "GET", "/status", &rebound, "").await.0,
        403
    );
    let cross_site =
        format!("Host: 127.0.0.1:{port}\r\nOrigin: http://attacker.example:{port}\r\n");
    assert_eq!(
        call_with(p.admin, "POST", "/routes", &cross_site, rule)
            .await
            .0,
        403
    );
    assert_eq!(
        call_with(p.admin, "DELETE", "/routes/api", &cross_site, "")
            .await
            .0,
        403
    );
    let (_, listed) = call_with(
        p.admin,
        "GET",
        "/routes",
        &format!("Host: localhost:{port}\r\n"),
        "",
    )
    .await;
    assert!(!listed.contains("evil"), "{listed}");
    assert!(listed.contains("\"api\""), "{listed}");

    // Loopback names and the API's own origin still work: curl, sluice ctl, the dashboard.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "[::1]".to_owned(),
    ] {
        let h = format!("Host: {host}\r\n");
        assert_eq!(
            call_with(p.admin, "GET", "/status", &h, "").await.0,
            200,
            "{host}"
        );
    }
    let own = format!("Host: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n");
    assert_eq!(
        call_with(p.admin, "POST", "/routes", &own, rule).await.0,
        201
    );
    let _ = p.stop.send(());
}

/// `/ready` is what an L4 balancer or Kubernetes probes: 200 while the node serves, 503 once
/// its operator drains it (a `preStop`), with no token needed; `/status` says which.
#[tokio::test]
async fn ready_turns_503_when_the_node_is_drained() {
    let p = start().await;
    assert_eq!(
        call(p.admin, "GET", "/ready", None, "").await,
        (200, "ready\n".into())
    );
    assert_eq!(call(p.admin, "POST", "/drain", None, "").await.0, 401);
    let (status, body) = json(p.admin, "POST", "/drain", "").await;
    assert_eq!((status, body["node"].as_str()), (200, Some("draining")));
    assert_eq!(
        call(p.admin, "GET", "/ready", None, "").await,
        (503, "draining\n".into())
    );
    let (_, status) = json(p.admin, "GET", "/status", "").await;
    assert_eq!(status["node"], "draining");
    assert_eq!(call(p.admin, "GET", "/healthz", None, "").await.0, 200);
    // Issue 46: a drain could not be undone. `POST /resume` (`sluice ctl resume-node`) does.
    assert_eq!(call(p.admin, "POST", "/resume", None, "").await.0, 401);
    let (status, body) = json(p.admin, "POST", "/resume", "").await;
    assert_eq!((status, body["node"].as_str()), (200, Some("ready")));
    assert_eq!(
        call(p.admin, "GET", "/ready", None, "").await,
        (200, "ready\n".into())
    );
    let _ = p.stop.send(());
}

/// Issue 29's probe: the rules judged the first of several `Host`/`Origin` fields, and let a
/// request without `Host` or in absolute form through. Each is 400 now, token or not.
#[tokio::test]
async fn requests_the_host_and_origin_rules_cannot_judge_are_400() {
    let p = start_with("").await;
    let port = p.admin.port();
    let rule = r#"{"name": "evil", "cluster": "api"}"#;
    let two_hosts = format!("Host: 127.0.0.1:{port}\r\nHost: attacker.example\r\n");
    let two_origins = format!(
        "Host: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\nOrigin: http://attacker.example\r\n"
    );
    for (method, path, headers) in [
        ("GET", "/status", two_hosts.as_str()),
        ("POST", "/routes", two_origins.as_str()),
        ("GET", "/status", ""),
        ("POST", "/routes", ""),
    ] {
        let (status, body) = call_with(p.admin, method, path, headers, rule).await;
        assert_eq!(status, 400, "{method} {path} {headers:?}: {body}");
    }
    let absolute = format!("http://127.0.0.1:{port}/status");
    let host = format!("Host: 127.0.0.1:{port}\r\n");
    assert_eq!(call_with(p.admin, "GET", &absolute, &host, "").await.0, 400);
    let (_, listed) = call_with(p.admin, "GET", "/routes", &host, "").await;
    assert!(!listed.contains("evil"), "{listed}");
    let _ = p.stop.send(());
}

#[tokio::test]
async fn with_a_token_any_host_is_served_but_foreign_origins_still_cannot_change_anything() {
    let p = start().await;
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let named = format!("Host: admin.internal.example\r\n{auth}");
    assert_eq!(
        call_with(p.admin, "GET", "/status", &named, "").await.0,
        200
    );
    let cross_site = format!("{named}Origin: https://attacker.example\r\n");
    let rule = r#"{"name": "evil", "cluster": "api"}"#;
    assert_eq!(
        call_with(p.admin, "POST", "/routes", &cross_site, rule)
            .await
            .0,
        403
    );
    let _ = p.stop.send(());
}

#[tokio::test]
async fn every_documented_operation_reaches_a_handler() {
    let p = start().await;
    let (status, doc) = call(p.admin, "GET", "/openapi.json", None, "").await;
    assert_eq!(status, 200, "the document is served without the token");
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 10);
    for (path, ops) in paths {
        let concrete = path
            .replace("{cluster}", "api")
            .replace("{instance}", "a")
            .replace("{name}", "nope")
            .replace("{addr}", "127.0.0.1:1");
        for method in ops.as_object().unwrap().keys() {
            let method = method.to_ascii_uppercase();
            let (status, body) = call(p.admin, &method, &concrete, Some(TOKEN), "{}").await;
            assert_ne!(status, 405, "{method} {path} is documented but not routed");
            assert!(
                !body.contains("no such admin resource"),
                "{method} {path}: {body}"
            );
        }
    }
    let _ = p.stop.send(());
}

#[tokio::test]
async fn status_shows_how_long_the_oldest_request_has_waited() {
    let p = start().await;
    // No session yet, and `no_sessions_wait`: the request waits in the default slice's queue.
    let http = p.http;
    let waiting = tokio::spawn(async move { get(http, "/x").await });
    p.cluster.wait_until(|c| c.queued("default") == 1).await;
    let (_, body) = json(p.admin, "GET", "/status", "").await;
    let slice = &body["clusters"][0]["slices"][0];
    assert_eq!(slice["queued"], 1);
    assert!(slice["oldest_wait_ms"].as_u64().is_some(), "{slice}");
    let _svc = Service::start(p.acceptor, ServiceSpec::new("a", 1)).await;
    assert_eq!(waiting.await.unwrap().status, StatusCode::OK);
    let _ = p.stop.send(());
}

/// Issue 47's probe: a tokenless admin API took a `Host` with a byte that is not UTF-8, as
/// the loopback rule could not read it and let it by. Such a Host is 400 now.
#[tokio::test]
async fn a_host_the_loopback_rule_cannot_read_is_400() {
    let p = start_with("").await;
    let rule = r#"{"name": "evil", "cluster": "api"}"#;
    let mut request =
        b"POST /routes HTTP/1.1\r\nConnection: close\r\nHost: attacker.example\xff\r\n".to_vec();
    request.extend_from_slice(
        format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{rule}",
            rule.len()
        )
        .as_bytes(),
    );
    let mut stream = TcpStream::connect(p.admin).await.unwrap();
    stream.write_all(&request).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    assert!(
        raw.starts_with(b"HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    let host = format!("Host: 127.0.0.1:{}\r\n", p.admin.port());
    let (_, listed) = call_with(p.admin, "GET", "/routes", &host, "").await;
    assert!(!listed.contains("evil"), "{listed}");
    let _ = p.stop.send(());
}

/// What the OCI image ships: `read_only` serves every read (the probes, status, metrics) and
/// refuses every change with 403, whoever asks.
#[tokio::test]
async fn a_read_only_admin_api_serves_reads_and_refuses_every_change() {
    let p = start_with("read_only = true\n").await;
    let host = format!("Host: 127.0.0.1:{}\r\n", p.admin.port());
    for path in ["/healthz", "/ready", "/status", "/metrics", "/routes"] {
        assert_eq!(
            call_with(p.admin, "GET", path, &host, "").await.0,
            200,
            "{path}"
        );
    }
    let rule = r#"{"name": "hijack", "cluster": "legacy", "position": 0}"#;
    for (method, path, body) in [
        ("POST", "/routes", rule),
        ("DELETE", "/routes/api", ""),
        (
            "POST",
            "/clusters/legacy/endpoints",
            r#"{"addr": "127.0.0.1:1"}"#,
        ),
        ("POST", "/clusters/api/instances/a/drain", ""),
        ("POST", "/drain", ""),
        ("POST", "/reload", ""),
    ] {
        let (status, body) = call_with(p.admin, method, path, &host, body).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert!(body.contains("read_only"), "{body}");
    }
    let (_, listed) = call_with(p.admin, "GET", "/routes", &host, "").await;
    assert!(
        !listed.contains("hijack") && listed.contains("\"api\""),
        "{listed}"
    );
    assert_eq!(call_with(p.admin, "GET", "/ready", &host, "").await.0, 200);
    let _ = p.stop.send(());
}

/// Issue 46: a restarted node said ready, and answered every client 503 "no sessions" until
/// its services found it (seconds: their re-resolution). Now, for `startup_wait`, `/ready`
/// says why it is not ready yet, and a request that comes meanwhile is held (beyond
/// `queue_timeout`) for the first session rather than refused.
#[tokio::test]
async fn a_starting_node_holds_requests_for_its_first_session_and_is_ready_only_then() {
    let p = start_full("", "startup_wait = \"60s\"\nqueue_timeout = \"100ms\"\n").await;
    let host = format!("Host: 127.0.0.1:{}\r\n", p.admin.port());
    let (status, body) = call_with(p.admin, "GET", "/ready", &host, "").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("starting: no session of cluster api"),
        "{body}"
    );
    let addr = p.http;
    let held = tokio::spawn(async move { get(addr, "/").await });
    p.cluster.wait_until(|c| c.queued("default") == 1).await;
    // Five queue timeouts pass: the request is still held, not refused.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !held.is_finished(),
        "the request was answered before any session came"
    );
    let _svc = Service::start(p.acceptor, ServiceSpec::new("a", 1)).await;
    assert_eq!(held.await.unwrap().status, 200);
    assert_eq!(
        call_with(p.admin, "GET", "/ready", &host, "").await,
        (200, "ready\n".to_owned())
    );
    let _ = p.stop.send(());
}
