//! Routing judges the request the upstream will see (issue 12's probe findings): encoded and
//! doubled-slash paths, trailing-dot hosts, invalid Host values, the asterisk-form, HTTP/1.0
//! without Host, header names with `_`, and forwarding chains from untrusted clients. Over
//! HTTP/1.1 on raw sockets and over HTTP/2, against a real proxy and backend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Version};
use http_body_util::Full;
use support::{exchange, h2_connect, h2_send, Backend, TestProxy};

/// Three listeners with different rules in front of one backend, behind routes that refuse
/// `/admin`, `secret.example` and `*.internal.example`.
async fn start() -> (Backend, TestProxy) {
    let backend = Backend::start("b").await;
    let toml = format!(
        r#"
[[listener]]
name = "strict"
listen = "127.0.0.1:0"
request_header_timeout = "300ms"

[[listener]]
name = "lenient"
listen = "127.0.0.1:0"
escaped_slashes = "unescape"
underscores_in_headers = "allow"

[[listener]]
name = "behind-lb"
listen = "127.0.0.1:0"
trusted_proxies = ["127.0.0.0/8"]
escaped_slashes = "keep"
underscores_in_headers = "reject"

[[route]]
path_prefix = "/admin"
direct_response = {{ status = 403, body = "admin is closed" }}

[[route]]
host = ["secret.example", "*.internal.example"]
direct_response = {{ status = 403, body = "secret is closed" }}

[[route]]
path_prefix = "/internal/"
client_cidr = ["10.0.0.0/8"]
cluster = "backend"

[[route]]
path_prefix = "/internal/"
direct_response = {{ status = 403, body = "internal only" }}

[[route]]
path_prefix = "/private/"
case_insensitive = true
direct_response = {{ status = 403, body = "private" }}

[[route]]
cluster = "backend"

[cluster.backend]
kind = "static"
endpoints = ["{}"]
"#,
        backend.addr
    );
    (backend, TestProxy::start(&toml).await)
}

fn listener(proxy: &TestProxy, name: &str) -> SocketAddr {
    proxy
        .addrs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, a)| *a)
        .unwrap()
}

/// One request with `Connection: close`; returns the status line's code and the body.
async fn http1(addr: SocketAddr, head: &str) -> (u16, String) {
    let request = format!("{head}Connection: close\r\n\r\n");
    let raw = exchange(addr, request.as_bytes()).await;
    let status = raw
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {raw:?}"));
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

async fn get(addr: SocketAddr, target: &str, host: &str) -> (u16, String) {
    http1(addr, &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n")).await
}

#[tokio::test]
async fn encoded_and_doubled_slash_paths_cannot_bypass_a_path_route() {
    let (backend, proxy) = start().await;
    let strict = listener(&proxy, "strict");
    for target in ["/%61dmin", "//admin", "/%61%64%6D%69%6E/x", "///admin//"] {
        assert_eq!(get(strict, target, "x").await.0, 403, "{target}");
    }
    for target in ["/%2fadmin", "/%2Fadmin", "/%5cadmin", "/x%2f..%2fadmin"] {
        assert_eq!(get(strict, target, "x").await.0, 400, "{target}");
    }
    // Configured to unescape, an encoded slash is a slash: routed like one.
    let lenient = listener(&proxy, "lenient");
    assert_eq!(get(lenient, "/%2fadmin", "x").await.0, 403);
    assert_eq!(backend.requests(), 0);
}

/// Issue 29's probe: Tomcat, Jetty and Spring read `..;` as `..` and drop `;params`, IIS
/// reads `\` as `/`; each of these reached the catch-all backend before.
const PARAMETER_BYPASSES: [&str; 7] = [
    "/x/..;/admin",
    "/..;/admin",
    "/x/%2e%2e;/admin",
    "/;/admin",
    "/.;/admin",
    "/;x=y/admin",
    "/\\admin",
];

#[tokio::test]
async fn path_parameters_and_backslashes_cannot_bypass_a_path_route() {
    let (backend, proxy) = start().await;
    let strict = listener(&proxy, "strict");
    for target in PARAMETER_BYPASSES {
        assert_eq!(get(strict, target, "x").await.0, 400, "{target}");
    }
    // Routes match the path without its parameters: `/internal;/x` is `/internal/x`.
    for target in [
        "/internal;/x",
        "/internal;jsessionid=1/x",
        "/internal/x;v=1",
    ] {
        assert_eq!(
            get(strict, target, "x").await,
            (403, "internal only".into()),
            "{target}"
        );
    }
    // Unescaped, a backslash is a slash, and routed like one.
    assert_eq!(
        get(listener(&proxy, "lenient"), "/\\admin", "x").await.0,
        403
    );
    assert_eq!(backend.requests(), 0);
    // Parameters that change nothing pass, as sent.
    let (status, body) = get(strict, "/a;v=1/b", "x").await;
    assert_eq!((status, body.as_str()), (200, "b /a;v=1/b"));
}

#[tokio::test]
async fn a_case_insensitive_route_matches_any_case() {
    let (backend, proxy) = start().await;
    let strict = listener(&proxy, "strict");
    for target in ["/PRIVATE/x", "/Private/", "/pRiVaTe/a;b"] {
        assert_eq!(get(strict, target, "x").await.0, 403, "{target}");
    }
    assert_eq!(backend.requests(), 0);
    // Prefixes are case-sensitive unless the route says otherwise.
    assert_eq!(get(strict, "/ADMIN", "x").await.0, 200);
}

#[tokio::test]
async fn authority_form_and_foreign_schemes_are_400() {
    let (backend, proxy) = start().await;
    let strict = listener(&proxy, "strict");
    assert_eq!(get(strict, "admin", "admin").await.0, 400);
    assert_eq!(get(strict, "foo://secret.example/", "x").await.0, 400);
    assert_eq!(backend.requests(), 0);
    assert_eq!(get(strict, "http://x/a", "x").await.0, 200);
}

#[tokio::test]
async fn a_clients_sluice_client_addr_never_reaches_a_static_upstream() {
    let (_backend, proxy) = start().await;
    let head = "GET /headers HTTP/1.1\r\nHost: x\r\nSluice-Client-Addr: 6.6.6.6:666\r\n";
    for name in ["strict", "behind-lb"] {
        let (status, body) = http1(listener(&proxy, name), head).await;
        assert_eq!(status, 200);
        assert!(
            !body.to_ascii_lowercase().contains("sluice-client-addr"),
            "{name}: {body:?}"
        );
    }
    let mut h2 = h2_connect(listener(&proxy, "strict")).await;
    let req = Request::get("http://x/headers")
        .header("sluice-client-addr", "6.6.6.6:666")
        .body(Full::<Bytes>::default())
        .unwrap();
    let reply = h2_send(&mut h2, req).await;
    assert!(!reply.body.contains("6.6.6.6"), "{reply:?}");
}

#[tokio::test]
async fn the_upstream_gets_the_path_that_was_routed() {
    let (_backend, proxy) = start().await;
    let (status, body) = get(listener(&proxy, "strict"), "/a//b/%7e%75?q=%2f", "x").await;
    assert_eq!((status, body.as_str()), (200, "b /a/b/~u"));
    let lenient = listener(&proxy, "lenient");
    assert_eq!(get(lenient, "/a%2Fb", "x").await.1, "b /a/b");
    let keep = listener(&proxy, "behind-lb");
    assert_eq!(get(keep, "/a%2fb", "x").await.1, "b /a%2Fb");
}

#[tokio::test]
async fn http2_paths_and_authorities_are_normalised_too() {
    let (backend, proxy) = start().await;
    let mut h2 = h2_connect(listener(&proxy, "strict")).await;
    let cases = [
        ("http://x/%61dmin", 403),
        ("http://x//admin", 403),
        ("http://x/%2fadmin", 400),
        ("http://secret.example./", 403),
        ("http://SECRET.example.:80/", 403),
        ("http://a.internal.example./", 403),
    ];
    for (uri, status) in cases {
        let req = Request::get(uri).body(Full::<Bytes>::default()).unwrap();
        assert_eq!(h2_send(&mut h2, req).await.status, status, "{uri}");
    }
    for path in PARAMETER_BYPASSES {
        let req = Request::get(format!("http://x{path}")).body(Full::<Bytes>::default());
        let Ok(req) = req else { continue }; // `http` refuses a raw `\` itself
        assert_eq!(h2_send(&mut h2, req).await.status, 400, "{path}");
    }
    let req = Request::get("http://x/internal;/x")
        .body(Full::<Bytes>::default())
        .unwrap();
    assert_eq!(h2_send(&mut h2, req).await.status, 403);
    assert_eq!(backend.requests(), 0);
}

#[tokio::test]
async fn a_trailing_dot_or_case_cannot_bypass_a_host_route() {
    let (backend, proxy) = start().await;
    let strict = listener(&proxy, "strict");
    for host in [
        "secret.example.",
        "secret.example.:80",
        "SECRET.Example",
        "a.internal.example.",
        "A.internal.example.:8080",
    ] {
        assert_eq!(get(strict, "/", host).await.0, 403, "{host}");
    }
    assert_eq!(backend.requests(), 0);
}

#[tokio::test]
async fn invalid_hosts_are_400_and_never_forwarded() {
    let (backend, proxy) = start().await;
    let strict = listener(&proxy, "strict");
    for host in [
        "a b",
        "a,b",
        "a/b",
        "a@b",
        "x\";for=6.6.6.6;by=\"y",
        "a..b",
        "a:b:c",
    ] {
        assert_eq!(get(strict, "/", host).await.0, 400, "{host}");
    }
    assert_eq!(get(strict, "http://u:p@evil.example/", "x").await.0, 400);
    assert_eq!(backend.requests(), 0);
}

#[tokio::test]
async fn asterisk_form_is_400_unless_options() {
    let (backend, proxy) = start().await;
    let strict = listener(&proxy, "strict");
    assert_eq!(get(strict, "*", "x").await.0, 400);
    assert_eq!(backend.requests(), 0);
}

#[tokio::test]
async fn an_http10_request_without_host_is_forwarded_with_the_endpoints_authority() {
    let (backend, proxy) = start().await;
    let (status, body) = http1(listener(&proxy, "strict"), "GET /headers HTTP/1.0\r\n").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(&format!("host: {}\n", backend.addr)),
        "{body:?}"
    );
}

#[tokio::test]
async fn header_names_with_underscores_are_dropped_allowed_or_refused_by_listener() {
    let (_backend, proxy) = start().await;
    let head = "GET /headers HTTP/1.1\r\nHost: x\r\nTransfer_Encoding: chunked\r\nX-Kept: 1\r\n";
    let (status, body) = http1(listener(&proxy, "strict"), head).await;
    assert_eq!(status, 200);
    assert!(!body.contains("transfer_encoding"), "{body:?}");
    assert!(body.contains("x-kept: 1\n"), "{body:?}");
    let (_, body) = http1(listener(&proxy, "lenient"), head).await;
    assert!(body.contains("transfer_encoding: chunked\n"), "{body:?}");
    assert_eq!(http1(listener(&proxy, "behind-lb"), head).await.0, 400);
}

#[tokio::test]
async fn forwarding_chains_are_kept_only_from_trusted_proxies() {
    let (_backend, proxy) = start().await;
    let head = "GET /headers HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 6.6.6.6\r\n\
                Forwarded: for=6.6.6.6\r\nX-Forwarded-Proto: https\r\n";
    let (_, body) = http1(listener(&proxy, "strict"), head).await;
    assert!(body.contains("x-forwarded-for: 127.0.0.1\n"), "{body:?}");
    assert!(body.contains("forwarded: for=127.0.0.1;"), "{body:?}");
    assert!(body.contains("x-forwarded-proto: http\n"), "{body:?}");
    assert!(!body.contains("6.6.6.6"), "{body:?}");
    let (_, body) = http1(listener(&proxy, "behind-lb"), head).await;
    assert!(
        body.contains("x-forwarded-for: 6.6.6.6, 127.0.0.1\n"),
        "{body:?}"
    );
    assert!(
        body.contains("forwarded: for=6.6.6.6, for=127.0.0.1;"),
        "{body:?}"
    );
    assert!(body.contains("x-forwarded-proto: https\n"), "{body:?}");
}

#[tokio::test]
async fn http2_requests_get_the_same_forwarding_rules() {
    let (_backend, proxy) = start().await;
    let mut h2 = h2_connect(listener(&proxy, "strict")).await;
    let req = Request::get("http://x/headers")
        .version(Version::HTTP_2)
        .header("x-forwarded-for", "6.6.6.6")
        .header("x_secret", "1")
        .body(Full::<Bytes>::default())
        .unwrap();
    let reply = h2_send(&mut h2, req).await;
    assert!(
        reply.body.contains("x-forwarded-for: 127.0.0.1\n"),
        "{reply:?}"
    );
    assert!(!reply.body.contains("x_secret"), "{reply:?}");
}
