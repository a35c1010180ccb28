//! Routing end to end: first match wins, direct responses, 404, header edits, forwarding.
#![allow(clippy::unwrap_used)]

use crate::support;

use support::{get, Backend, TestProxy};

#[tokio::test]
async fn routes_by_host_path_and_answers_direct_and_404() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let toml = format!(
        r#"
[[listener]]
name = "test"
listen = "127.0.0.1:0"

[[route]]
path_prefix = "/healthz"
direct_response = {{ status = 200, body = "ok\n" }}

[[route]]
host = "a.example"
cluster = "a"
request_headers = {{ set = {{ "x-route" = "a" }}, remove = ["x-drop"] }}
response_headers = {{ set = {{ "x-served-by" = "sluice" }} }}

[[route]]
host = "*.b.example"
cluster = "b"

[cluster.a]
kind = "static"
endpoints = ["{}"]

[cluster.b]
kind = "static"
endpoints = ["{}"]
"#,
        a.addr, b.addr
    );
    let proxy = TestProxy::start(&toml).await;
    let client = support::client();

    let health = get(&client, &proxy.url("/healthz")).await;
    assert_eq!(
        (health.status.as_u16(), health.body.as_str()),
        (200, "ok\n")
    );

    let req = http::Request::get(proxy.url("/headers"))
        .header("host", "a.example")
        .header("x-drop", "1")
        .body(Default::default())
        .unwrap();
    let res = support::send(&client, req).await;
    assert_eq!(res.status, 200);
    assert_eq!(res.headers["x-served-by"], "sluice");
    assert!(res.body.contains("x-route: a\n"), "{}", res.body);
    assert!(!res.body.contains("x-drop"), "{}", res.body);
    assert!(
        res.body.contains("x-forwarded-for: 127.0.0.1\n"),
        "{}",
        res.body
    );
    assert!(
        res.body.contains("x-forwarded-proto: http\n"),
        "{}",
        res.body
    );
    assert!(
        res.body.contains("x-forwarded-host: a.example\n"),
        "{}",
        res.body
    );
    assert!(
        res.body
            .contains("forwarded: for=127.0.0.1;proto=http;host=a.example\n"),
        "{}",
        res.body
    );

    let req = http::Request::get(proxy.url("/x"))
        .header("host", "api.b.example:8080")
        .body(Default::default())
        .unwrap();
    let res = support::send(&client, req).await;
    assert_eq!((res.status.as_u16(), res.body.as_str()), (200, "b /x"));

    let req = http::Request::get(proxy.url("/x"))
        .header("host", "c.example")
        .body(Default::default())
        .unwrap();
    let res = support::send(&client, req).await;
    assert_eq!(res.status, 404);
    assert_eq!(res.body, "no route matches this request\n");
    assert_eq!((a.requests(), b.requests()), (1, 1));
}
