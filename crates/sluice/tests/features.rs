//! Every route feature, enforced on every transport (issue 49: eligibility fails closed). A
//! case per built-in [`sluice::Feature`] — the match is exhaustive, so a feature added without
//! a case does not compile — and per registered feature ([`sluice::route_feature::REGISTERED`]
//! — one registered without a case fails the test by name), each checked over HTTP/1.1 (the
//! fast path, or with `SLUICE_FAST_PATH=0` hyper's path: the test command runs both),
//! HTTP/2 on hyper's transport and on the own one (`own_http2`), and HTTP/3 (a TLS listener's
//! QUIC endpoint). A transport that does not render a
//! feature hands its requests to one that does; none may skip it.
#![allow(clippy::unwrap_used)]

use crate::support::h3::{h3_request, H3Tls};
use crate::support::{h2_connect, TestProxy};

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sluice::Feature;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that answers 2 KiB of `text/plain` (compressible; at `/cached` fresh for a
/// minute), or at `/headers` the request's fields, one `name: value` line each.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                let cached = req.uri().path() == "/cached";
                let body = match req.uri().path() {
                    "/headers" => req
                        .headers()
                        .iter()
                        .map(|(k, v)| format!("{k}: {}\n", v.to_str().unwrap_or("")))
                        .collect(),
                    path => format!("upstream {path}\n").repeat(128),
                };
                let mut res = Response::new(Full::new(Bytes::from(body)));
                res.headers_mut()
                    .insert(http::header::CONTENT_TYPE, "text/plain".parse().unwrap());
                if cached {
                    let max_age = "max-age=60".parse().unwrap();
                    res.headers_mut()
                        .insert(http::header::CACHE_CONTROL, max_age);
                }
                Ok::<_, Infallible>(res)
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    addr
}

/// What one request brought back.
#[derive(Debug)]
struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

/// A request: method, path, fields, body.
type Ask = (
    &'static str,
    &'static str,
    Vec<(&'static str, &'static str)>,
    &'static str,
);

/// How a feature is configured on the route (TOML keys), what to send (twice for a limit),
/// and what the answer to the last must show.
struct Case {
    keys: String,
    asks: Vec<Ask>,
    check: fn(&Got) -> bool,
}

/// A feature of either kind.
#[derive(Debug, Clone, Copy)]
enum Any {
    BuiltIn(Feature),
    Registered(&'static str),
}

fn every_feature() -> impl Iterator<Item = Any> {
    let registered = sluice::route_feature::REGISTERED.iter();
    let registered = registered.map(|r| Any::Registered(r.key));
    Feature::ALL.into_iter().map(Any::BuiltIn).chain(registered)
}

fn case(feature: Any, dir: &std::path::Path) -> Case {
    match feature {
        Any::BuiltIn(feature) => built_in(feature),
        Any::Registered(key) => registered(key, dir),
    }
}

fn get(path: &'static str, fields: Vec<(&'static str, &'static str)>) -> Ask {
    ("GET", path, fields, "")
}

/// A registered feature's case, by its key.
fn registered(key: &str, dir: &std::path::Path) -> Case {
    match key {
        "rate_limit" => Case {
            keys: "rate_limit = { rate = \"1/m\", burst = 1, key = \"client\" }".into(),
            asks: vec![get("/", vec![]), get("/", vec![])],
            check: |g| g.status == StatusCode::TOO_MANY_REQUESTS,
        },
        "basic_auth" => {
            let hash = bcrypt::hash("secret", 4).unwrap();
            std::fs::write(dir.join("users.htpasswd"), format!("alice:{hash}\n")).unwrap();
            Case {
                keys: "basic_auth = { htpasswd = \"users.htpasswd\", realm = \"r\" }".into(),
                asks: vec![get("/", vec![])],
                check: |g| g.status == StatusCode::UNAUTHORIZED,
            }
        }
        "cors" => Case {
            keys: "cors = { origins = [\"https://app.example.com\"] }".into(),
            asks: vec![get("/", vec![("origin", "https://app.example.com")])],
            check: |g| {
                g.status == StatusCode::OK
                    && g.headers
                        .get("access-control-allow-origin")
                        .is_some_and(|v| v == "https://app.example.com")
            },
        },
        "global_rate_limit" => {
            // A service that refuses connections, asked with failure_mode "closed": a
            // transport that skipped the limit would let the request through. (Real services
            // answer in tests/globallimit.)
            let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let address = dead.local_addr().unwrap();
            drop(dead);
            Case {
                keys: format!(
                    "global_rate_limit = {{ service = \"rls\", descriptors = [[{{ from = \"client\" }}]] }}\n\
                     [rate_limit_service.rls]\naddress = \"{address}\"\ndomain = \"t\"\n\
                     timeout = \"5s\"\nfailure_mode = \"closed\"\n"
                ),
                asks: vec![get("/", vec![])],
                check: |g| {
                    g.status == StatusCode::SERVICE_UNAVAILABLE
                        && g.body.contains("rate-limit service unavailable")
                },
            }
        }
        "cache" => Case {
            keys: "cache = true".into(),
            asks: vec![get("/cached", vec![]), get("/cached", vec![])],
            check: |g| {
                g.headers
                    .get("cache-status")
                    .is_some_and(|v| v == "Sluice; hit")
                    && g.body.starts_with("upstream /cached\n")
            },
        },
        other => panic!("the registered feature {other} has no case in tests/features.rs: add one"),
    }
}

fn built_in(feature: Feature) -> Case {
    match feature {
        Feature::BodyLimit => Case {
            keys: "max_request_body = \"16B\"".into(),
            asks: vec![("POST", "/", vec![], "more than sixteen bytes")],
            check: |g| g.status == StatusCode::PAYLOAD_TOO_LARGE,
        },
        Feature::Rewrite => Case {
            keys: "rewrite = { prefix = \"/v1/\", replace = \"/\" }".into(),
            asks: vec![get("/v1/x", vec![])],
            check: |g| g.body.starts_with("upstream /x\n"),
        },
        Feature::Compression => Case {
            keys: "compression = { encodings = [\"gzip\"], min_size = \"1KiB\", types = [\"text/*\"] }".into(),
            asks: vec![get("/", vec![("accept-encoding", "gzip")])],
            check: |g| g.headers.get("content-encoding").is_some_and(|v| v == "gzip"),
        },
        Feature::HeaderEdits => Case {
            keys: "response_headers = { set = { \"x-served-by\" = \"sluice\" } }".into(),
            asks: vec![get("/", vec![])],
            check: |g| g.headers.get("x-served-by").is_some_and(|v| v == "sluice"),
        },
        Feature::FramingEdits => Case {
            keys: "request_headers = { set = { \"host\" = \"edited.example\" } }".into(),
            asks: vec![get("/headers", vec![])],
            check: |g| g.body.contains("host: edited.example\n"),
        },
    }
}

/// A proxy with one route to `upstream` with `keys`, its listener with `listener_keys`;
/// `quic` adds a TLS listener serving HTTP/3 (its certificate in `dir`).
async fn proxy(
    upstream: SocketAddr,
    (keys, listener_keys): (&str, &str),
    dir: &std::path::Path,
    quic: Option<&H3Tls>,
) -> TestProxy {
    let quic = quic.map_or(String::new(), |tls| {
        let keys = tls.listener_keys();
        format!("[[listener]]\nname = \"q\"\nlisten = \"127.0.0.1:0\"\n{keys}\n")
    });
    let toml = format!(
        "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\n{listener_keys}\n{quic}\
         [[route]]\ncluster = \"b\"\n{keys}\n\
         [cluster.b]\nkind = \"static\"\nendpoints = [\"{upstream}\"]\n"
    );
    TestProxy::start_in(&toml, dir).await
}

/// HTTP/1.1, one connection per request (`Connection: close`), read to its end.
async fn http1(addr: SocketAddr, (method, path, fields, body): &Ask) -> Got {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: t.example\r\nConnection: close\r\n");
    for (k, v) in fields {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut res = httparse::Response::new(&mut fields);
    let Ok(httparse::Status::Complete(len)) = res.parse(&raw) else {
        panic!("no answer: {:?}", String::from_utf8_lossy(&raw));
    };
    let mut headers = HeaderMap::new();
    for f in res.headers.iter() {
        headers.append(
            http::HeaderName::from_bytes(f.name.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(f.value).unwrap(),
        );
    }
    Got {
        status: StatusCode::from_u16(res.code.unwrap()).unwrap(),
        headers,
        body: String::from_utf8_lossy(&raw[len..]).into_owned(),
    }
}

/// HTTP/2 (prior knowledge), one connection per request.
async fn http2(addr: SocketAddr, (method, path, fields, body): &Ask) -> Got {
    let mut sender = h2_connect(addr).await;
    let mut req = Request::builder()
        .method(*method)
        .uri(format!("http://t.example{path}"));
    for (k, v) in fields {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// HTTP/3, one QUIC connection per request.
async fn http3(addr: SocketAddr, tls: &H3Tls, (method, path, fields, body): &Ask) -> Got {
    let mut req = Request::builder().method(*method).uri(*path);
    for (k, v) in fields {
        req = req.header(*k, *v);
    }
    if !body.is_empty() {
        req = req.header("content-length", body.len());
    }
    let req = req.body(Bytes::from_static(body.as_bytes())).unwrap();
    let got = h3_request(addr, &tls.client, req).await;
    let (parts, ()) = got.response.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&got.body).into_owned(),
    }
}

#[tokio::test]
async fn every_route_feature_is_enforced_on_every_transport() {
    let upstream = upstream().await;
    for feature in every_feature() {
        for transport in ["HTTP/1.1", "HTTP/2", "HTTP/2 (own)", "HTTP/3"] {
            let dir = tempfile::tempdir().unwrap();
            let case = case(feature, dir.path());
            let quic = (transport == "HTTP/3").then(|| H3Tls::write(dir.path()));
            let own = match transport {
                "HTTP/2" => "own_http2 = false",
                "HTTP/2 (own)" => "own_http2 = true",
                _ => "",
            };
            let p = proxy(upstream, (&case.keys, own), dir.path(), quic.as_ref()).await;
            let mut last = None;
            for ask in &case.asks {
                last = Some(match (transport, &quic) {
                    ("HTTP/1.1", _) => http1(p.addr(), ask).await,
                    (_, Some(tls)) => http3(p.http3[0].1, tls, ask).await,
                    _ => http2(p.addr(), ask).await,
                });
            }
            let got = last.unwrap();
            assert!(
                (case.check)(&got),
                "{feature:?} skipped over {transport}: {got:?}"
            );
            p.shutdown();
        }
    }
}
