//! Rewrites and redirects (issue 33, item 3): what the upstream receives when a route rewrites
//! the path (prefix or regex; the query kept; routes still match the path as sent), and what
//! the client gets from a redirect (status, `Location` with its host, path and query). Hostile
//! input included: dot segments plain and encoded, `;` params, a long path, a rewrite that
//! would make `//evil.com` or a dot segment, odd `Host` values. The test command runs these on
//! the fast path and again with it off (hyper); HTTP/2 goes through hyper's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use support::upstream::RawBackend;
use support::wire::read_response;
use support::{exchange, h2_connect, h2_send, TestProxy};

/// Routes that rewrite or redirect, in front of a backend that answers with the target it
/// received; anything else goes to it unchanged.
async fn proxy(backend: &RawBackend) -> TestProxy {
    let toml = format!(
        r#"
[[listener]]
name = "public"
listen = "127.0.0.1:0"

[[route]]
path_prefix = "/api/"
rewrite = {{ prefix = "/api/", replace = "/" }}
cluster = "backend"

[[route]]
path_prefix = "/u/"
rewrite = {{ regex = "^/u/(?P<id>[0-9]+)(/.*)?$", replace = "/users/${{id}}$2" }}
cluster = "backend"

[[route]]
path_prefix = "/glue/"
rewrite = {{ regex = "^/glue/([^/]*)x([^/]*)$", replace = "/$1$2" }}
cluster = "backend"

[[route]]
path_prefix = "/r/"
rewrite = {{ regex = "^/r", replace = "/" }}
cluster = "backend"

[[route]]
path_prefix = "/grow/"
rewrite = {{ regex = "a", replace = "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" }}
cluster = "backend"

[[route]]
path_prefix = "/old/"
rewrite = {{ regex = "^/old/", replace = "/new/" }}
direct_response = {{ status = 308, location = "https://{{host}}{{uri}}" }}

[[route]]
path_prefix = "/rel/"
rewrite = {{ regex = "^/rel", replace = "/" }}
direct_response = {{ status = 302, location = "{{uri}}" }}

[[route]]
host = "plain.example"
direct_response = {{ location = "https://{{host}}{{path}}" }}

[[route]]
cluster = "backend"

[cluster.backend]
kind = "static"
endpoints = ["{}"]
"#,
        backend.addr
    );
    TestProxy::start(&toml).await
}

/// What the client got: status, `Location`, body.
#[derive(Debug)]
struct Got {
    status: u16,
    location: Option<String>,
    body: String,
}

async fn send(proxy: &TestProxy, request: &str) -> Got {
    let raw = exchange(proxy.addr(), request.as_bytes()).await;
    let got = read_response(raw.as_bytes(), false);
    let location = got.fields.iter().find(|(n, _)| n == "location");
    Got {
        status: got.status,
        location: location.map(|(_, v)| String::from_utf8_lossy(v).into_owned()),
        body: String::from_utf8_lossy(&got.body.unwrap_or_default()).into_owned(),
    }
}

async fn get(proxy: &TestProxy, target: &str, host: &str) -> Got {
    let request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    send(proxy, &request).await
}

/// What the upstream received for `target`, after a 200.
async fn forwarded(proxy: &TestProxy, target: &str) -> String {
    let got = get(proxy, target, "a.example").await;
    assert_eq!(got.status, 200, "{target}: {got:?}");
    got.body
}

fn fast_path_on() -> bool {
    std::env::var("SLUICE_FAST_PATH").as_deref() != Ok("0")
}

/// The value of a metric line that starts with `series` (0 when there is none).
fn counter(proxy: &TestProxy, series: &str) -> u64 {
    let text = proxy.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_prefix_is_replaced_and_the_query_kept_on_either_path() {
    let backend = RawBackend::echo_target().await;
    let proxy = proxy(&backend).await;
    let cases = [
        ("/api/users?id=1&x=%20y", "/users?id=1&x=%20y"),
        ("/api/", "/"),
        // `;params` are matched past, as the route matched them; those of the stripped
        // segment go with it.
        ("/api;v=1/users", "/users"),
        ("/api/a;b=c/d", "/a;b=c/d"),
        // Not under the prefix: forwarded as sent.
        ("/apiary?x", "/apiary?x"),
    ];
    for (sent, want) in cases {
        assert_eq!(forwarded(&proxy, sent).await, want, "{sent}");
    }
    let fast = if fast_path_on() {
        cases.len() as u64
    } else {
        0
    };
    assert_eq!(
        counter(&proxy, "sluice_http1_fast_path_requests_total"),
        fast
    );
}

#[tokio::test]
async fn a_regex_rewrites_with_its_groups() {
    let backend = RawBackend::echo_target().await;
    let proxy = proxy(&backend).await;
    let got = forwarded(&proxy, "/u/42/posts?sort=new").await;
    assert_eq!(got, "/users/42/posts?sort=new");
    assert_eq!(forwarded(&proxy, "/u/42").await, "/users/42");
    // The route matched, the regex did not: forwarded as sent.
    assert_eq!(forwarded(&proxy, "/u/me?x=1").await, "/u/me?x=1");
}

#[tokio::test]
async fn dot_segments_plain_or_encoded_never_reach_the_upstream() {
    let backend = RawBackend::echo_target().await;
    let proxy = proxy(&backend).await;
    for sent in [
        "/api/../admin",
        "/api/%2e%2e/admin",
        "/api/.%2E/admin",
        "/api/..;/admin",
    ] {
        let got = get(&proxy, sent, "a.example").await;
        assert_eq!(got.status, 400, "{sent}: {got:?}");
    }
    // Two harmless segments the rule glues into `..`: the rule's fault, 500.
    let got = get(&proxy, "/glue/.x.", "a.example").await;
    assert_eq!(got.status, 500, "{got:?}");
    assert_eq!(got.body, "invalid rewrite: dot-segments in the path\n");
    assert_eq!(
        backend
            .stats
            .answered
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[tokio::test]
async fn a_rewrite_to_a_double_slash_stays_an_origin_form_path() {
    let backend = RawBackend::echo_target().await;
    let proxy = proxy(&backend).await;
    // `^/r` → `/` would make `//evil.com/x`, a network-path reference; slashes merge.
    assert_eq!(forwarded(&proxy, "/r/evil.com/x?y").await, "/evil.com/x?y");
    // The client's own doubled slashes were merged before routing.
    assert_eq!(forwarded(&proxy, "//api//x").await, "/x");
}

#[tokio::test]
async fn a_long_path_is_rewritten_but_not_grown_without_bound() {
    let backend = RawBackend::echo_target().await;
    let proxy = proxy(&backend).await;
    let long = "b".repeat(8000);
    assert_eq!(
        forwarded(&proxy, &format!("/api/{long}")).await,
        format!("/{long}")
    );
    let got = get(&proxy, &format!("/grow/{}", "a".repeat(1000)), "a.example").await;
    assert_eq!(got.status, 500, "{got:?}");
    assert_eq!(
        got.body,
        "invalid rewrite: the rewritten path is too long\n"
    );
}

#[tokio::test]
async fn a_redirect_keeps_the_host_path_and_query() {
    let backend = RawBackend::echo_target().await;
    let proxy = proxy(&backend).await;
    let got = get(&proxy, "/old/a/b?c=d&e", "Example.COM.:8080").await;
    assert_eq!(got.status, 308, "{got:?}");
    assert_eq!(
        got.location.as_deref(),
        Some("https://example.com/new/a/b?c=d&e")
    );
    // The default status; `{path}` leaves the query out.
    let got = get(&proxy, "/x/y?q=1", "plain.example").await;
    assert_eq!(got.status, 301, "{got:?}");
    assert_eq!(got.location.as_deref(), Some("https://plain.example/x/y"));
    assert_eq!(
        backend
            .stats
            .answered
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[tokio::test]
async fn a_redirect_cannot_be_turned_to_another_site() {
    let backend = RawBackend::echo_target().await;
    let proxy = proxy(&backend).await;
    // A rewrite that would make the path `//evil.com`: the location stays a path.
    let got = get(&proxy, "/rel/evil.com/x?y", "a.example").await;
    assert_eq!(got.status, 302, "{got:?}");
    assert_eq!(got.location.as_deref(), Some("/evil.com/x?y"));
    // A Host that is not a host is refused before any route sees it.
    for host in [
        "evil.com/x",
        "a.example@evil.com",
        "a.example, evil.com",
        "a.example\tx",
        "a.example:80:80",
        "\"a.example\"",
    ] {
        let got = get(&proxy, "/old/x", host).await;
        assert_eq!(got.status, 400, "{host:?}: {got:?}");
        assert_eq!(got.location, None, "{host:?}");
    }
    // A request that names no host has none to be sent to.
    let got = send(&proxy, "GET /old/x HTTP/1.0\r\n\r\n").await;
    assert_eq!(got.status, 400, "{got:?}");
    assert_eq!(got.body, "no Host to redirect to\n");
}

/// A listener that keeps raw backslashes (`escaped_slashes = "keep"`): `/rel/\evil.com` would
/// make `Location: /\evil.com`, which browsers follow to evil.com; it goes out as `%5C`.
#[tokio::test]
async fn a_kept_backslash_cannot_make_a_redirect_another_host() {
    let toml = "[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\nescaped_slashes = \"keep\"\n\
                [[route]]\npath_prefix = \"/rel/\"\nrewrite = { regex = \"^/rel\", replace = \"/\" }\n\
                direct_response = { status = 302, location = \"{uri}\" }\n";
    let proxy = TestProxy::start(toml).await;
    let got = get(&proxy, "/rel/\\evil.com/x", "a.example").await;
    assert_eq!(got.status, 302, "{got:?}");
    assert_eq!(got.location.as_deref(), Some("/%5Cevil.com/x"));
}

#[tokio::test]
async fn http2_requests_are_rewritten_and_redirected_alike() {
    let backend = RawBackend::echo_target().await;
    let proxy = proxy(&backend).await;
    let mut h2 = h2_connect(proxy.addr()).await;
    let request = |uri: &str| {
        Request::get(format!("http://A.example:8080{uri}"))
            .version(http::Version::HTTP_2)
            .body(Full::<Bytes>::default())
            .unwrap()
    };
    let got = h2_send(&mut h2, request("/api/v?x=1")).await;
    assert_eq!(got.body, "/v?x=1");
    let got = h2_send(&mut h2, request("/old/v?x=1")).await;
    assert_eq!(got.status, 308);
    let location = got.headers.get(http::header::LOCATION).unwrap();
    assert_eq!(location, "https://a.example/new/v?x=1");
}
