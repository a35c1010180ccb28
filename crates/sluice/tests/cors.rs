//! A route's `cors` (issue 33, item 5): Sluice answers the route's CORS preflights itself
//! (204 with what an allowed origin may do; 403 with the reason otherwise) and puts the CORS
//! fields on every answer for an allowed origin, over the upstream's, Sluice's own errors
//! included. The test command runs these on the fast path and again with it off (the fast
//! path leaves a CORS route's requests to hyper).
#![allow(clippy::unwrap_used)]

use crate::support;

use support::{Backend, TestProxy};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn proxy(backend: &Backend, dir: &std::path::Path) -> TestProxy {
    let alice = bcrypt::hash("alice-secret", 4).unwrap();
    std::fs::write(dir.join("users.htpasswd"), format!("alice:{alice}\n")).unwrap();
    let toml = format!(
        "[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"api\"\npath_prefix = \"/headers\"\ncluster = \"backend\"\n\
         basic_auth = {{ htpasswd = \"users.htpasswd\" }}\n\
         rate_limit = {{ rate = \"1/h\", burst = 8, key = \"header:x-client\" }}\n\
         cors = {{ origins = [\"https://app.example.com\", \"https://*.example.org\"], \
         methods = [\"GET\", \"PUT\"], headers = [\"content-type\", \"authorization\"], \
         expose = [\"x-served-by\"], credentials = true, max_age = \"10m\" }}\n\
         [[route]]\nname = \"open\"\ncluster = \"backend\"\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        backend.addr
    );
    TestProxy::start_in(&toml, dir).await
}

async fn send(conn: &mut TcpStream, method: &str, fields: &str) -> String {
    let req = format!("{method} /headers HTTP/1.1\r\nHost: a\r\n{fields}\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    support::read_answer(conn).await.expect("closed")
}

/// The answer's head fields named `name` (lowercase), in order.
fn values(answer: &str, name: &str) -> Vec<String> {
    let head = answer.split("\r\n\r\n").next().unwrap_or_default();
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

fn status(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or_default()
}

const ORIGIN: &str = "Origin: https://app.example.com\r\n";

#[tokio::test]
async fn an_allowed_preflight_is_answered_here_before_any_credentials_are_asked_for() {
    let (dir, backend) = (tempfile::tempdir().unwrap(), Backend::start("b").await);
    let proxy = proxy(&backend, dir.path()).await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    let asks = format!(
        "{ORIGIN}Access-Control-Request-Method: PUT\r\nAccess-Control-Request-Headers: Content-Type, Authorization\r\n"
    );
    let answer = send(&mut conn, "OPTIONS", &asks).await;
    assert_eq!(status(&answer), "204", "{answer}");
    assert_eq!(
        values(&answer, "access-control-allow-origin"),
        ["https://app.example.com"]
    );
    assert_eq!(
        values(&answer, "access-control-allow-credentials"),
        ["true"]
    );
    assert_eq!(
        values(&answer, "access-control-allow-methods"),
        ["GET, PUT"]
    );
    assert_eq!(
        values(&answer, "access-control-allow-headers"),
        ["content-type, authorization"]
    );
    assert_eq!(values(&answer, "access-control-max-age"), ["600"]);
    let vary = values(&answer, "vary").join(", ");
    assert!(
        vary.contains("Origin") && vary.contains("Access-Control-Request-Method"),
        "{answer}"
    );
    assert_eq!(backend.requests(), 0, "a preflight reached the upstream");
}

#[tokio::test]
async fn a_preflight_outside_the_policy_is_403_with_the_reason() {
    let (dir, backend) = (tempfile::tempdir().unwrap(), Backend::start("b").await);
    let proxy = proxy(&backend, dir.path()).await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    for (fields, reason) in [
        ("Origin: https://evil.test\r\nAccess-Control-Request-Method: GET\r\n", "origin not allowed"),
        ("Origin: https://example.org\r\nAccess-Control-Request-Method: GET\r\n", "origin not allowed"),
        (&format!("{ORIGIN}Access-Control-Request-Method: DELETE\r\n")[..], "method not allowed"),
        (
            &format!("{ORIGIN}Access-Control-Request-Method: PUT\r\nAccess-Control-Request-Headers: x-secret\r\n")[..],
            "request field not allowed",
        ),
    ] {
        let answer = send(&mut conn, "OPTIONS", fields).await;
        assert_eq!(status(&answer), "403", "{fields}: {answer}");
        assert!(answer.ends_with(&format!("CORS: {reason}\n")), "{answer}");
        assert!(values(&answer, "access-control-allow-origin").is_empty(), "{answer}");
    }
    assert_eq!(backend.requests(), 0);
}

#[tokio::test]
async fn answers_to_an_allowed_origin_carry_the_fields_errors_included() {
    let (dir, backend) = (tempfile::tempdir().unwrap(), Backend::start("b").await);
    let proxy = proxy(&backend, dir.path()).await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    // Sluice's own 429 (the `x-client` bucket holds 8 requests): the page can read why.
    let limited = "x-client: greedy\r\n";
    for _ in 0..8 {
        send(&mut conn, "GET", &format!("{ORIGIN}{limited}")).await;
    }
    let refused = send(&mut conn, "GET", &format!("{ORIGIN}{limited}")).await;
    assert_eq!(status(&refused), "429", "{refused}");
    assert_eq!(
        values(&refused, "access-control-allow-origin"),
        ["https://app.example.com"]
    );
    // Sluice's own 401: the page can read why.
    let refused = send(&mut conn, "GET", ORIGIN).await;
    assert_eq!(status(&refused), "401", "{refused}");
    assert_eq!(
        values(&refused, "access-control-allow-origin"),
        ["https://app.example.com"]
    );
    // The upstream's answer, from a subdomain origin.
    let token = "Authorization: Basic YWxpY2U6YWxpY2Utc2VjcmV0\r\n";
    let sub = "Origin: https://a.b.example.org\r\n";
    let ok = send(&mut conn, "GET", &format!("{sub}{token}")).await;
    assert_eq!(status(&ok), "200", "{ok}");
    assert_eq!(
        values(&ok, "access-control-allow-origin"),
        ["https://a.b.example.org"]
    );
    assert_eq!(
        values(&ok, "access-control-expose-headers"),
        ["x-served-by"]
    );
    assert!(
        values(&ok, "vary").iter().any(|v| v.contains("Origin")),
        "{ok}"
    );
    // Another origin gets the answer without the fields (the browser keeps it from the page),
    // and one without Origin too, with Vary so that a cache keeps them apart.
    for fields in [
        format!("Origin: https://evil.test\r\n{token}"),
        token.to_owned(),
    ] {
        let plain = send(&mut conn, "GET", &fields).await;
        assert_eq!(status(&plain), "200", "{plain}");
        assert!(
            values(&plain, "access-control-allow-origin").is_empty(),
            "{plain}"
        );
        assert!(
            values(&plain, "vary").iter().any(|v| v.contains("Origin")),
            "{plain}"
        );
    }
}
