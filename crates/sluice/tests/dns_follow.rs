//! Static endpoints that follow DNS (issue 53): a cluster with `resolve` looks its endpoint
//! names up with a real DNS server the test runs on loopback (hickory-server) and changes
//! while requests flow. Two real backends listen on the same port of 127.0.0.2 and 127.0.0.3,
//! the addresses the name moves between.
#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};

use crate::support;

use support::dns::TestDns;
use support::upstream::{static_cluster, try_get, wait_until, within, ObservedBackend};
use support::{get, static_config, Backend, Client, TestProxy};
use tokio::net::TcpListener;

const HOST: &str = "api.sluice.test.";
const A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// Listeners on the same free port of 127.0.0.2 and 127.0.0.3 (a name's addresses share the
/// endpoint's port).
async fn same_port_pair() -> (TcpListener, TcpListener) {
    for _ in 0..20 {
        let a = TcpListener::bind((A, 0)).await.unwrap();
        let port = a.local_addr().unwrap().port();
        if let Ok(b) = TcpListener::bind((B, port)).await {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

/// A config whose cluster `backend` is `api.sluice.test:<port>` (and `more` endpoints) with
/// `cluster`'s keys, asking `dns`.
fn config(dns: &TestDns, port: u16, more: &[SocketAddr], cluster: &str) -> String {
    let endpoint: SocketAddr = ([0, 0, 0, 0], port).into();
    let endpoints: Vec<SocketAddr> = [endpoint].iter().chain(more).copied().collect();
    let text = static_config(&endpoints, cluster).replace(
        &format!("\"{endpoint}\""),
        &format!("\"api.sluice.test:{port}\""),
    );
    format!(
        "{text}\n[dns]\nnameservers = [\"{}\"]\ntimeout = \"500ms\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        dns.addr
    )
}

/// A proxy of [`config`] without more endpoints.
async fn proxy(dns: &TestDns, port: u16, cluster: &str) -> TestProxy {
    TestProxy::start(&config(dns, port, &[], cluster)).await
}

const FAST: &str = r#"resolve = { min_ttl = "100ms", max_ttl = "1s" }"#;

/// The value of the series `name` (the whole line up to the value), if it is there.
fn metric(proxy: &TestProxy, series: &str) -> Option<f64> {
    let text = proxy.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

fn series(kind: &str, port: u16, extra: &str) -> String {
    let labels = format!("cluster=\"backend\",name=\"api.sluice.test:{port}\"{extra}");
    format!("sluice_upstream_dns_{kind}{{{labels}}}")
}

/// Who answers a few requests now.
async fn answered_by(client: &Client, proxy: &TestProxy) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..4 {
        let reply = within("request", get(client, &proxy.url("/"))).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        names.push(reply.body.split(' ').next().unwrap_or_default().to_owned());
    }
    names
}

/// Sends requests until `backend` answers one; bounded by the hang guard.
async fn until_answered_by(client: &Client, proxy: &TestProxy, backend: &str) {
    within("the name's new address to answer", async {
        loop {
            let reply = get(client, &proxy.url("/")).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
            if reply.body.starts_with(backend) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn requests_follow_the_name_to_its_new_address_without_a_reload() {
    let dns = TestDns::start("sluice.test.").await;
    let (la, lb) = same_port_pair().await;
    let port = la.local_addr().unwrap().port();
    let a = ObservedBackend::start_on("a", la).await;
    let b = Backend::start_on("b", lb).await;
    dns.set(HOST, &[A], 0).await;
    let proxy = proxy(&dns, port, FAST).await;
    let client = support::client();
    assert_eq!(answered_by(&client, &proxy).await, ["a"; 4]);
    // A request in flight on the old address when the name moves.
    let url = proxy.url("/wait");
    let held = tokio::spawn(async move { try_get(&support::client(), &url).await });
    wait_until("a request held by a", || a.in_flight() == 1).await;

    dns.set(HOST, &[B], 0).await;
    until_answered_by(&client, &proxy, "b").await;
    assert_eq!(answered_by(&client, &proxy).await, ["b"; 4]);
    let cluster = static_cluster(&proxy);
    let addrs: Vec<_> = cluster.endpoints().iter().map(|e| e.addr()).collect();
    assert_eq!(addrs, [SocketAddr::from((B, port))]);

    // The request in flight finished on the old address; its pooled connections closed.
    a.open_gate();
    let reply = within("held request", held).await.unwrap().unwrap();
    assert_eq!(
        (reply.status.as_u16(), reply.body.as_str()),
        (200, "a /wait")
    );
    wait_until("a's connections closed", || a.open_connections() == 0).await;
    assert!(b.requests() >= 5, "{}", b.requests());
    // Counted: lookups, the change, the one address the name has now.
    assert!(metric(&proxy, &series("resolutions_total", port, ",result=\"ok\"")) >= Some(2.0));
    assert_eq!(
        metric(&proxy, &series("changes_total", port, "")),
        Some(1.0)
    );
    assert_eq!(metric(&proxy, &series("addresses", port, "")), Some(1.0));
}

#[tokio::test]
async fn a_failed_lookup_keeps_the_last_addresses_until_the_name_resolves_again() {
    let dns = TestDns::start("sluice.test.").await;
    let (la, lb) = same_port_pair().await;
    let port = la.local_addr().unwrap().port();
    let _a = Backend::start_on("a", la).await;
    let _b = Backend::start_on("b", lb).await;
    dns.set(HOST, &[A], 0).await;
    let proxy = proxy(&dns, port, FAST).await;
    let client = support::client();
    assert_eq!(answered_by(&client, &proxy).await, ["a"; 4]);

    dns.remove(HOST).await;
    let failed = series("resolutions_total", port, ",result=\"nxdomain\"");
    wait_until("two failed lookups", || {
        metric(&proxy, &failed) >= Some(2.0)
    })
    .await;
    assert_eq!(answered_by(&client, &proxy).await, ["a"; 4]);
    let names = static_cluster(&proxy).followed_names();
    assert_eq!(names.len(), 1);
    assert_eq!(names[0].addrs, [SocketAddr::from((A, port))]);
    assert!(names[0].failures >= 2, "{names:?}");
    let why = names[0].last_error.clone().unwrap_or_default();
    assert!(why.contains("NXDOMAIN"), "{why}");
    assert_eq!(metric(&proxy, &series("addresses", port, "")), Some(1.0));
    // /status (sluice ctl status) says the same.
    let url = format!("http://{}/status", proxy.admin.unwrap());
    let status: serde_json::Value = serde_json::from_str(&get(&client, &url).await.body).unwrap();
    let name = &status["clusters"][0]["names"][0];
    assert_eq!(name["name"], format!("api.sluice.test:{port}"));
    assert_eq!(
        name["addrs"],
        serde_json::json!([format!("127.0.0.2:{port}")])
    );
    assert!(name["failures"].as_u64() >= Some(2), "{name}");
    assert!(
        name["last_error"].as_str().unwrap().contains("NXDOMAIN"),
        "{name}"
    );

    dns.set(HOST, &[B], 0).await;
    until_answered_by(&client, &proxy, "b").await;
    assert_eq!(static_cluster(&proxy).followed_names()[0].failures, 0);
}

#[tokio::test]
async fn a_name_that_never_resolved_answers_503_and_the_proxy_still_starts() {
    let dns = TestDns::start("sluice.test.").await;
    let (la, _lb) = same_port_pair().await;
    let port = la.local_addr().unwrap().port();
    let _a = Backend::start_on("a", la).await;
    let proxy = proxy(&dns, port, FAST).await;
    let client = support::client();
    let reply = get(&client, &proxy.url("/")).await;
    assert_eq!(
        (reply.status.as_u16(), reply.body.as_str()),
        (503, "upstream name has not resolved\n")
    );

    dns.set(HOST, &[A], 0).await;
    within("the name to resolve", async {
        while get(&client, &proxy.url("/")).await.status != 200 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn with_health_checks_a_new_address_joins_after_its_first_passing_check() {
    let dns = TestDns::start("sluice.test.").await;
    let (la, lb) = same_port_pair().await;
    let port = la.local_addr().unwrap().port();
    let _a = Backend::start_on("a", la).await;
    let b = ObservedBackend::start_on("b", lb).await;
    b.healthy.store(false, std::sync::atomic::Ordering::SeqCst);
    dns.set(HOST, &[A], 0).await;
    let checked = format!("{FAST}\nhealth_check = {{ interval = \"50ms\" }}");
    let proxy = proxy(&dns, port, &checked).await;
    let client = support::client();
    assert_eq!(answered_by(&client, &proxy).await, ["a"; 4]);

    // The name gains B, which fails its checks: it is an endpoint, but out of rotation.
    dns.set(HOST, &[A, B], 0).await;
    let cluster = static_cluster(&proxy);
    wait_until("b added", || cluster.endpoints().len() == 2).await;
    let b_ep = SocketAddr::from((B, port));
    let checked_b = || b.connections() >= 2;
    wait_until("b checked twice", checked_b).await;
    assert_eq!(answered_by(&client, &proxy).await, ["a"; 4]);
    let b_state = cluster
        .endpoints()
        .into_iter()
        .find(|e| e.addr() == b_ep)
        .unwrap();
    assert!(!b_state.is_healthy());

    b.healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    until_answered_by(&client, &proxy, "b").await;
}

#[tokio::test]
async fn a_reload_in_place_leaves_the_addresses_dns_brought_in_to_dns() {
    let dns = TestDns::start("sluice.test.").await;
    let (la, lb) = same_port_pair().await;
    let port = la.local_addr().unwrap().port();
    let (a_addr, b_addr) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    let _a = Backend::start_on("a", la).await;
    let _b = Backend::start_on("b", lb).await;
    dns.set(HOST, &[A], 0).await;
    let parse = |text: &str| {
        let base = std::path::Path::new(".");
        sluice::config::parse_str(text, "test.toml", base).unwrap()
    };
    let proxy = sluice::Proxy::bind(&parse(&config(&dns, port, &[], FAST)))
        .await
        .unwrap();
    let (in_place, cluster) = (proxy.in_place(), proxy.cluster("backend").unwrap().clone());
    let sluice::Upstream::Static(cluster) = cluster else {
        panic!("static")
    };
    let shutdown = sluice::Shutdown::new();
    let signal = shutdown.signal();
    tokio::spawn(proxy.run_until(async move { signal.wait().await }));

    // The reload adds b's address as a configured endpoint; a's, which DNS gave, stays.
    let reloaded = parse(&config(&dns, port, &[b_addr], FAST));
    let applied = in_place.apply(&reloaded).expect("applied in place");
    assert_eq!(applied.added, [format!("backend {b_addr}")]);
    assert!(applied.removed.is_empty(), "{applied:?}");
    let addrs = || -> Vec<SocketAddr> { cluster.endpoints().iter().map(|e| e.addr()).collect() };
    assert_eq!(addrs(), [a_addr, b_addr]);
    // The name moves to b's address: a's leaves, b's stays (it is configured too).
    dns.set(HOST, &[B], 0).await;
    wait_until("a's address gone", || addrs() == [b_addr]).await;
    shutdown.trigger();
}
