//! A route's `cache` (RFC 9111) through a real proxy and a real upstream: request coalescing,
//! `Vary`, cache poisoning (unkeyed fields, other hosts), `no-store`, revalidation,
//! `stale-if-error` (an upstream error, the upstream down), `stale-while-revalidate` and its
//! background refresh, ranges from a stored answer, `HEAD` from a stored `GET` (and a `HEAD`
//! updating it), invalidation by an unsafe method, and its configuration's refusals; its
//! metrics, its `cache_status` in the access log, and purges through the admin API.
//! The public cache test suite runs in the test command (`scripts/cache-tests`).
#![allow(clippy::unwrap_used)]

use crate::support::{assert_refused_at, client, send, Reply, TestProxy};

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// An origin that counts the requests per path and answers by path:
/// `/fresh` `max-age=60`; `/no-store`; `/vary` by `Accept-Language`; `/host` the `Host` and
/// `X-Forwarded-Host` it was sent; `/etag` `max-age=0` with an entity tag, `304` to
/// `If-None-Match`; `/gated` `max-age=60` once the gate opens; `/sie` stale at once but
/// usable for a minute if the upstream fails, then 503 to every request after the first;
/// `/swr` stale at once but servable for a minute while revalidated, every request after
/// the first held until the gate opens; `/head` stale at once to a `GET`, fresh for a minute
/// to a `HEAD`, its count in `x-n`; `/plain` a `200` and `/moved` a `302` that state no
/// lifetime.
#[derive(Clone)]
struct Origin {
    addr: SocketAddr,
    seen: Arc<Mutex<HashMap<String, usize>>>,
    gate: watch::Sender<bool>,
}

impl Origin {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = Origin {
            addr: listener.local_addr().unwrap(),
            seen: Arc::default(),
            gate: watch::Sender::new(false),
        };
        let serving = origin.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let origin = serving.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let origin = origin.clone();
                    async move { Ok::<_, Infallible>(origin.answer(req).await) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        origin
    }

    fn seen(&self, path: &str) -> usize {
        self.seen.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_owned();
        let n = {
            let mut seen = self.seen.lock().unwrap();
            let n = seen.entry(path.clone()).or_default();
            *n += 1;
            *n
        };
        let field = |name: &str| {
            let v = req.headers().get(name);
            v.map_or("-", |v| v.to_str().unwrap()).to_owned()
        };
        let mut res = Response::builder().header("cache-control", "max-age=60");
        let body = match path.as_str() {
            "/no-store" => {
                res = Response::builder().header("cache-control", "no-store");
                format!("no-store {n}")
            }
            "/vary" => {
                res = res.header("vary", "Accept-Language");
                format!("lang {} {n}", field("accept-language"))
            }
            "/sie" if n > 1 => {
                let res = Response::builder().status(StatusCode::SERVICE_UNAVAILABLE);
                return res.body(Full::new(Bytes::from("down"))).unwrap();
            }
            "/sie" => {
                res = Response::builder().header("cache-control", "max-age=0, stale-if-error=60");
                format!("sie {n}")
            }
            "/host" => format!(
                "host {} fwd {} {n}",
                field("host"),
                field("x-forwarded-host")
            ),
            "/etag" => {
                res = Response::builder()
                    .header("cache-control", "max-age=0")
                    .header("etag", "\"v1\"");
                if field("if-none-match") == "\"v1\"" {
                    let res = res.status(StatusCode::NOT_MODIFIED);
                    return res.body(Full::default()).unwrap();
                }
                format!("etag {n}")
            }
            "/head" => {
                let head = req.method() == http::Method::HEAD;
                let cc = if head { "max-age=60" } else { "max-age=0" };
                res = Response::builder()
                    .header("cache-control", cc)
                    .header("x-n", n);
                format!("head {n}")
            }
            "/swr" => {
                res = Response::builder()
                    .header("cache-control", "max-age=0, stale-while-revalidate=60");
                if n > 1 {
                    let mut open = self.gate.subscribe();
                    open.wait_for(|o| *o).await.unwrap();
                }
                format!("swr {n}")
            }
            "/plain" => {
                res = Response::builder();
                format!("plain {n}")
            }
            "/moved" => {
                let res = Response::builder().status(StatusCode::FOUND);
                let res = res.header("location", "/plain");
                return res
                    .body(Full::new(Bytes::from(format!("moved {n}"))))
                    .unwrap();
            }
            "/gated" => {
                let mut open = self.gate.subscribe();
                open.wait_for(|o| *o).await.unwrap();
                format!("gated {n}")
            }
            _ => format!("fresh {n}"),
        };
        res.body(Full::new(Bytes::from(body))).unwrap()
    }
}

async fn proxy(origin: &Origin, cache: &str) -> TestProxy {
    let toml = format!(
        "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ncluster = \"o\"\ncache = {cache}\n\
         [cluster.o]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        origin.addr
    );
    TestProxy::start(&toml).await
}

async fn ask(p: &TestProxy, method: &str, path: &str, fields: &[(&str, &str)]) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(p.url(path))
        .header("host", "a.example");
    for (k, v) in fields {
        req = req.header(*k, *v);
    }
    send(&client(), req.body(Full::default()).unwrap()).await
}

fn cache_status(r: &Reply) -> &str {
    r.headers
        .get("cache-status")
        .map_or("", |v| v.to_str().unwrap())
}

#[tokio::test]
async fn concurrent_misses_of_one_key_make_one_upstream_request() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "{ lock_timeout = \"30s\" }").await;
    let p = Arc::new(p);
    let asks: Vec<_> = (0..8)
        .map(|_| {
            let p = Arc::clone(&p);
            tokio::spawn(async move { ask(&p, "GET", "/gated", &[]).await })
        })
        .collect();
    crate::support::upstream::wait_until("the first request upstream", || {
        origin.seen("/gated") == 1
    })
    .await;
    // The others reach the proxy while the first is held (their arrival is not observable
    // from here; one that came after the fill is a plain hit, which proves the same).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    origin.gate.send_replace(true);
    let mut statuses = Vec::new();
    for a in asks {
        let r = a.await.unwrap();
        assert_eq!(r.body, "gated 1");
        statuses.push(cache_status(&r).to_owned());
    }
    assert_eq!(origin.seen("/gated"), 1, "{statuses:?}");
    assert!(
        statuses.iter().any(|s| s.contains("collapsed")),
        "{statuses:?}"
    );
}

#[tokio::test]
async fn vary_keeps_one_answer_per_variant() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    let en = ask(&p, "GET", "/vary", &[("accept-language", "en")]).await;
    let fr = ask(&p, "GET", "/vary", &[("accept-language", "fr")]).await;
    let en_again = ask(&p, "GET", "/vary", &[("accept-language", "en")]).await;
    let fr_again = ask(&p, "GET", "/vary", &[("accept-language", "fr")]).await;
    let none = ask(&p, "GET", "/vary", &[]).await;
    assert_eq!(en.body, "lang en 1");
    assert_eq!(fr.body, "lang fr 2");
    assert_eq!(en_again.body, "lang en 1");
    assert_eq!(fr_again.body, "lang fr 2");
    assert_eq!(none.body, "lang - 3");
    assert!(cache_status(&en_again).contains("hit"), "{en_again:?}");
    assert_eq!(origin.seen("/vary"), 3);
}

#[tokio::test]
async fn unkeyed_fields_and_other_hosts_never_change_a_stored_answer() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    let poisoned = ask(&p, "GET", "/host", &[("x-forwarded-host", "evil.example")]).await;
    let clean = ask(&p, "GET", "/host", &[]).await;
    assert_eq!(clean.body, poisoned.body);
    assert!(!clean.body.contains("evil"), "{clean:?}");
    assert!(cache_status(&clean).contains("hit"), "{clean:?}");
    // Another host is another key: never the first host's answer.
    let mut req = Request::get(p.url("/host")).header("host", "b.example");
    req = req.header("x-forwarded-host", "a.example");
    let other = send(&client(), req.body(Full::default()).unwrap()).await;
    assert!(other.body.starts_with("host b.example"), "{other:?}");
    assert!(!cache_status(&other).contains("hit"), "{other:?}");
    // Another port is another origin; the host's case is not part of the key.
    let ported = Request::get(p.url("/host")).header("host", "a.example:8080");
    let ported = send(&client(), ported.body(Full::default()).unwrap()).await;
    assert!(ported.body.starts_with("host a.example:8080"), "{ported:?}");
    let upper = Request::get(p.url("/host")).header("host", "A.EXAMPLE");
    let upper = send(&client(), upper.body(Full::default()).unwrap()).await;
    assert_eq!(upper.body, poisoned.body);
    assert_eq!(origin.seen("/host"), 3);
}

#[tokio::test]
async fn no_store_is_never_stored() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    let first = ask(&p, "GET", "/no-store", &[]).await;
    let second = ask(&p, "GET", "/no-store", &[]).await;
    assert_eq!(
        (first.body.as_str(), second.body.as_str()),
        ("no-store 1", "no-store 2")
    );
    assert_eq!(cache_status(&second), "Sluice; fwd=miss");
    // Nor is an answer to a request that says `no-store`.
    ask(&p, "GET", "/fresh", &[("cache-control", "no-store")]).await;
    let after = ask(&p, "GET", "/fresh", &[]).await;
    assert_eq!(after.body, "fresh 2");
}

#[tokio::test]
async fn a_stale_answer_is_revalidated_and_a_304_serves_the_stored_body() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    let first = ask(&p, "GET", "/etag", &[]).await;
    let second = ask(&p, "GET", "/etag", &[]).await;
    assert_eq!(first.body, "etag 1");
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.body, "etag 1");
    assert!(
        cache_status(&second).contains("fwd-status=304"),
        "{second:?}"
    );
    // The client's own validators get a 304.
    let third = ask(&p, "GET", "/etag", &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(third.status, StatusCode::NOT_MODIFIED);
    assert_eq!(origin.seen("/etag"), 3);
}

#[tokio::test]
async fn head_is_answered_from_a_stored_get_and_post_invalidates() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 1");
    let head = ask(&p, "HEAD", "/fresh", &[]).await;
    assert!(cache_status(&head).contains("hit"), "{head:?}");
    assert_eq!(head.body, "");
    assert_eq!(origin.seen("/fresh"), 1);
    assert_eq!(ask(&p, "POST", "/fresh", &[]).await.body, "fresh 2");
    assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 3");
}

#[tokio::test]
async fn stale_if_error_serves_the_stored_answer_on_an_upstream_error() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    assert_eq!(ask(&p, "GET", "/sie", &[]).await.body, "sie 1");
    let second = ask(&p, "GET", "/sie", &[]).await;
    assert_eq!(
        (second.status, second.body.as_str()),
        (StatusCode::OK, "sie 1")
    );
    assert!(
        cache_status(&second).contains("fwd-status=503"),
        "{second:?}"
    );
    assert_eq!(origin.seen("/sie"), 2);
}

#[tokio::test]
async fn stale_if_error_serves_the_stored_answer_with_the_upstream_down() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An origin that answers once, closes, and is gone: the next request finds no one.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let once = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = vec![0; 4096];
        let _ = conn.read(&mut buf).await.unwrap();
        let answer = "HTTP/1.1 200 OK\r\ncache-control: max-age=0, stale-if-error=60\r\n\
                      content-length: 5\r\nconnection: close\r\n\r\nfirst";
        conn.write_all(answer.as_bytes()).await.unwrap();
    });
    let toml = format!(
        "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ncluster = \"o\"\ncache = true\n\
         [cluster.o]\nkind = \"static\"\nendpoints = [\"{addr}\"]\n"
    );
    let p = TestProxy::start(&toml).await;
    assert_eq!(ask(&p, "GET", "/x", &[]).await.body, "first");
    once.await.unwrap();
    let second = ask(&p, "GET", "/x", &[]).await;
    assert_eq!(
        (second.status, second.body.as_str()),
        (StatusCode::OK, "first")
    );
    assert!(
        cache_status(&second).contains("upstream-failed"),
        "{second:?}"
    );
    // With nothing stored, the failure is the client's answer (502, or 503 once the
    // endpoint is marked down).
    let third = ask(&p, "GET", "/y", &[]).await;
    assert!(third.status.is_server_error(), "{third:?}");
}

#[tokio::test]
async fn ranges_are_served_from_a_whole_stored_answer() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 1");
    let field = |r: &Reply, name: &str| {
        let v = r.headers.get(name);
        v.map_or(String::new(), |v| v.to_str().unwrap().to_owned())
    };
    let part = ask(&p, "GET", "/fresh", &[("range", "bytes=0-4")]).await;
    assert_eq!(
        (part.status, part.body.as_str()),
        (StatusCode::PARTIAL_CONTENT, "fresh")
    );
    assert_eq!(field(&part, "content-range"), "bytes 0-4/7");
    assert_eq!(field(&part, "content-length"), "5");
    assert!(cache_status(&part).contains("hit"), "{part:?}");
    let suffix = ask(&p, "GET", "/fresh", &[("range", "bytes=-1")]).await;
    assert_eq!(
        (suffix.status, suffix.body.as_str()),
        (StatusCode::PARTIAL_CONTENT, "1")
    );
    let past = ask(&p, "GET", "/fresh", &[("range", "bytes=7-")]).await;
    assert_eq!(past.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(field(&past, "content-range"), "bytes */7");
    // Several ranges, or an If-Range that does not match, get the whole answer.
    let several = ask(&p, "GET", "/fresh", &[("range", "bytes=0-0,2-3")]).await;
    assert_eq!(
        (several.status, several.body.as_str()),
        (StatusCode::OK, "fresh 1")
    );
    let other = [("range", "bytes=0-0"), ("if-range", "\"v9\"")];
    let other = ask(&p, "GET", "/fresh", &other).await;
    assert_eq!(
        (other.status, other.body.as_str()),
        (StatusCode::OK, "fresh 1")
    );
    assert_eq!(origin.seen("/fresh"), 1);
}

#[tokio::test]
async fn a_head_answer_updates_the_stored_get() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    assert_eq!(ask(&p, "GET", "/head", &[]).await.body, "head 1");
    let head = ask(&p, "HEAD", "/head", &[]).await;
    assert_eq!(head.headers["x-n"], "2");
    // The stored body with the HEAD's fields, fresh for their minute.
    let get = ask(&p, "GET", "/head", &[]).await;
    assert_eq!(get.body, "head 1");
    assert_eq!(get.headers["x-n"], "2");
    assert!(cache_status(&get).contains("hit"), "{get:?}");
    assert_eq!(origin.seen("/head"), 2);
}

/// Waits (bounded) until `done` holds.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..500 {
        if done().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("never: {what}");
}

#[tokio::test]
async fn stale_while_revalidate_serves_at_once_and_one_request_refreshes() {
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    assert_eq!(ask(&p, "GET", "/swr", &[]).await.body, "swr 1");
    // Stale but within its window: served at once, while the refresh waits at the gate.
    let at_once = std::time::Duration::from_secs(10);
    let second = tokio::time::timeout(at_once, ask(&p, "GET", "/swr", &[]))
        .await
        .expect("a stale-while-revalidate answer waited for the upstream");
    assert_eq!(second.body, "swr 1");
    assert!(
        cache_status(&second).contains("hit; detail=stale-while-revalidate"),
        "{second:?}"
    );
    until("the refresh reached the origin", async || {
        origin.seen("/swr") == 2
    })
    .await;
    // While it is under way, others get the stale answer too and start no refresh of their own.
    for _ in 0..4 {
        let r = tokio::time::timeout(at_once, ask(&p, "GET", "/swr", &[])).await;
        assert_eq!(r.expect("waited for the upstream").body, "swr 1");
    }
    assert_eq!(origin.seen("/swr"), 2);
    origin.gate.send_replace(true);
    until("the refreshed answer is served", async || {
        ask(&p, "GET", "/swr", &[]).await.body == "swr 2"
    })
    .await;
}

#[tokio::test]
async fn valid_gives_answers_that_state_no_lifetime_one() {
    // Without `valid`, an answer with no lifetime (nor `Last-Modified`) is stale at once.
    let origin = Origin::start().await;
    let p = proxy(&origin, "true").await;
    for _ in 0..2 {
        assert_eq!(
            ask(&p, "GET", "/plain", &[]).await.body.get(..5),
            Some("plain")
        );
        assert_eq!(
            ask(&p, "GET", "/moved", &[]).await.status,
            StatusCode::FOUND
        );
    }
    assert_eq!((origin.seen("/plain"), origin.seen("/moved")), (2, 2));
    let origin = Origin::start().await;
    let p = proxy(&origin, r#"{ valid = { "200" = "1m", "302" = "1m" } }"#).await;
    for _ in 0..2 {
        let plain = ask(&p, "GET", "/plain", &[]).await;
        assert_eq!(plain.body, "plain 1");
        let moved = ask(&p, "GET", "/moved", &[]).await;
        assert_eq!(
            (moved.status, moved.body.as_str()),
            (StatusCode::FOUND, "moved 1")
        );
    }
    assert_eq!((origin.seen("/plain"), origin.seen("/moved")), (1, 1));
    // The answer's own lifetime wins: `max-age=0` is revalidated every time.
    for _ in 0..2 {
        ask(&p, "GET", "/etag", &[]).await;
    }
    assert_eq!(origin.seen("/etag"), 2);
}

#[test]
fn bad_cache_settings_are_refused_where_they_are() {
    let text = |cache: &str| {
        format!(
            "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n\
             [[route]]\ncluster = \"o\"\n{cache}\n\
             [cluster.o]\nkind = \"static\"\nendpoints = [\"127.0.0.1:1\"]\n"
        )
    };
    for (line, message) in [
        (
            "cache = { memory = \"1MiB\", max_object = \"2MiB\" }",
            "`max_object` must be between",
        ),
        ("cache = { memory = 0 }", "`memory` is 0"),
        (
            "cache = { lock_timeout = \"2m\" }",
            "`lock_timeout` is at most 60s",
        ),
        ("cache = { size = 1 }", "unknown field `size`"),
        (
            "cache = { valid = { \"20x\" = \"1m\" } }",
            "a status from 200 to 599",
        ),
        (
            "cache = { valid = { \"304\" = \"1m\" } }",
            "a status from 200 to 599",
        ),
        ("cache = { valid = { any = \"0s\" } }", "gives `any` 0s"),
    ] {
        assert_refused_at(&text(line), line, message);
    }
}

/// The value of the series `name` (with its labels) in `p`'s `/metrics`.
fn metric(p: &TestProxy, name: &str) -> Option<f64> {
    let text = p.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
}

/// A proxy whose cached route is named `route` (the cache's series are labelled by it).
async fn named_proxy(origin: &Origin, route: &str, cache: &str) -> TestProxy {
    let toml = format!(
        "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"{route}\"\ncluster = \"o\"\ncache = {cache}\n\
         [cluster.o]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        origin.addr
    );
    TestProxy::start(&toml).await
}

#[tokio::test]
async fn hits_misses_stale_answers_and_coalesced_waits_are_counted() {
    let origin = Origin::start().await;
    let p = Arc::new(named_proxy(&origin, "counted", "{ lock_timeout = \"30s\" }").await);
    let series = |name: &str, result: &str| {
        let labels = match result {
            "" => "route=\"counted\"".to_owned(),
            r => format!("route=\"counted\",result=\"{r}\""),
        };
        metric(&p, &format!("sluice_cache_{name}{{{labels}}}"))
    };
    assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 1");
    assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 1");
    ask(&p, "GET", "/no-store", &[]).await;
    ask(&p, "GET", "/sie", &[]).await;
    assert_eq!(ask(&p, "GET", "/sie", &[]).await.body, "sie 1");
    // One request fetches `/gated`; a second waits for it (seen in the counter) and is
    // answered from what it stored.
    let first = tokio::spawn({
        let p = Arc::clone(&p);
        async move { ask(&p, "GET", "/gated", &[]).await }
    });
    crate::support::upstream::wait_until("the first request upstream", || {
        origin.seen("/gated") == 1
    })
    .await;
    let second = tokio::spawn({
        let p = Arc::clone(&p);
        async move { ask(&p, "GET", "/gated", &[]).await }
    });
    crate::support::upstream::wait_until("the second request waiting", || {
        series("coalesced_waits_total", "") == Some(1.0)
    })
    .await;
    origin.gate.send_replace(true);
    assert_eq!(first.await.unwrap().body, "gated 1");
    let second = second.await.unwrap();
    assert!(cache_status(&second).contains("collapsed"), "{second:?}");
    assert_eq!(series("lookups_total", "hit"), Some(2.0));
    assert_eq!(series("lookups_total", "miss"), Some(5.0));
    assert_eq!(series("stale_served_total", ""), Some(1.0));
    assert_eq!(series("coalesced_waits_total", ""), Some(1.0));
    assert_eq!(series("evictions_total", ""), Some(0.0));
    let bytes = series("stored_bytes", "").unwrap();
    assert!(bytes > 0.0, "{bytes}");
}

#[tokio::test]
async fn evictions_keep_the_stored_bytes_within_memory() {
    let origin = Origin::start().await;
    let p = named_proxy(&origin, "evicting", "{ memory = \"1KiB\" }").await;
    for path in ["/a", "/b", "/c", "/d", "/e"] {
        assert_eq!(ask(&p, "GET", path, &[]).await.status, StatusCode::OK);
    }
    let evictions = metric(&p, "sluice_cache_evictions_total{route=\"evicting\"}").unwrap();
    assert!(evictions >= 1.0, "{evictions}");
    let bytes = metric(&p, "sluice_cache_stored_bytes{route=\"evicting\"}").unwrap();
    assert!(bytes > 0.0 && bytes <= 1024.0, "{bytes}");
}

#[tokio::test]
async fn the_access_log_says_what_the_cache_did() {
    let origin = Origin::start().await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[access_log]\nformat = \"json\"\npath = \"access.log\"\n\
         [[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\ncluster = \"o\"\ncache = true\n\
         [cluster.o]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        origin.addr
    );
    let p = TestProxy::start_in(&toml, dir.path()).await;
    for _ in 0..2 {
        assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 1");
    }
    let path = dir.path().join("access.log");
    let mut lines = Vec::new();
    crate::support::upstream::wait_until("two lines in the access log", || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        lines = text.lines().map(str::to_owned).collect();
        lines.len() >= 2
    })
    .await;
    let status = |line: &str| {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        v["cache_status"].as_str().map(str::to_owned)
    };
    assert_eq!(
        status(&lines[0]).as_deref(),
        Some("Sluice; fwd=miss; stored")
    );
    assert_eq!(status(&lines[1]).as_deref(), Some("Sluice; hit"));
}

/// `POST /routes/{name}/cache/purge` on `p`'s admin API with `token`; the status and body.
async fn purge(p: &TestProxy, route: &str, token: Option<&str>, body: &str) -> Reply {
    let admin = p.admin.unwrap();
    let mut req = Request::builder()
        .method("POST")
        .uri(format!("http://{admin}/routes/{route}/cache/purge"))
        .header("content-type", "application/json");
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let body = Full::new(Bytes::from(body.to_owned()));
    send(&client(), req.body(body).unwrap()).await
}

#[tokio::test]
async fn the_admin_api_purges_a_key_or_a_prefix_with_the_token() {
    let origin = Origin::start().await;
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"purge-s3cret\"\n\
         [[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"c\"\ncluster = \"o\"\ncache = true\n\
         [cluster.o]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        origin.addr
    );
    let p = TestProxy::start(&toml).await;
    for path in ["/fresh", "/img/a", "/img/b", "/fresh"] {
        assert_eq!(ask(&p, "GET", path, &[]).await.body, "fresh 1", "{path}");
    }
    let token = Some("purge-s3cret");
    let key = r#"{"key": "http://a.example/fresh"}"#;
    assert_eq!(purge(&p, "c", None, key).await.status, 401);
    assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 1");
    let purged = purge(&p, "c", token, key).await;
    assert_eq!(purged.status, StatusCode::OK, "{purged:?}");
    assert!(purged.body.contains("\"purged\":1"), "{purged:?}");
    assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 2");
    assert_eq!(ask(&p, "GET", "/img/a", &[]).await.body, "fresh 1");
    let prefix = r#"{"prefix": "http://a.example/img/"}"#;
    let purged = purge(&p, "c", token, prefix).await;
    assert!(purged.body.contains("\"purged\":2"), "{purged:?}");
    assert_eq!(ask(&p, "GET", "/img/a", &[]).await.body, "fresh 2");
    assert_eq!(ask(&p, "GET", "/img/b", &[]).await.body, "fresh 2");
    assert_eq!(ask(&p, "GET", "/fresh", &[]).await.body, "fresh 2");
    // `/status` says what the cache holds and counted: 4 hits, 6 misses so far.
    let admin = p.admin.unwrap();
    let req = Request::get(format!("http://{admin}/status"))
        .header("authorization", "Bearer purge-s3cret");
    let status = send(&client(), req.body(Full::default()).unwrap()).await;
    let status: serde_json::Value = serde_json::from_str(&status.body).unwrap();
    let cache = &status["caches"][0];
    assert_eq!(cache["route"], "c", "{status}");
    assert_eq!(
        (cache["entries"].as_u64(), cache["hits"].as_u64()),
        (Some(3), Some(4))
    );
    assert_eq!(cache["misses"].as_u64(), Some(6), "{status}");
    assert!(cache["stored_bytes"].as_u64() > Some(0), "{status}");
    assert!(cache.get("disk").is_none(), "{status}");
    for (route, body, status) in [
        ("c", r#"{"key": "a", "prefix": "b"}"#, 400),
        ("c", r#"{"key": ""}"#, 400),
        ("c", "not json", 400),
        ("nope", key, 404),
    ] {
        let r = purge(&p, route, token, body).await;
        assert_eq!(r.status.as_u16(), status, "{route} {body}: {r:?}");
        assert!(r.body.contains("error"), "{r:?}");
    }
}
