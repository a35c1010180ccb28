//! Route `compression` (issue 33, item 1): responses are compressed by the client's
//! `Accept-Encoding` as they stream, decode to exactly the upstream's bytes, and carry `Vary`;
//! what must not be compressed is not. The test command runs these on the fast path (which
//! hands a request that accepts an encoding to hyper) and again with it off.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use support::{client, h2_connect, Client, TestProxy};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

/// 1 MiB of text that compresses, but not to nothing: numbered lines.
fn big_text() -> Bytes {
    let mut text = String::with_capacity(1 << 20);
    let mut i = 0u64;
    while text.len() < (1 << 20) {
        text.push_str(&format!(
            "line {i} of the body, {} left\n",
            (1u64 << 20) / 30 - i
        ));
        i += 1;
    }
    text.truncate(1 << 20);
    Bytes::from(text)
}

/// A response body fed through a channel, of unknown length (chunked).
struct Channel(mpsc::Receiver<Bytes>);

impl Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d))))
    }
}

type Out = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The upstream: what each path answers (see `respond`). `/events` sends its second event
/// only once `next_event` is notified.
struct Upstream {
    addr: SocketAddr,
    next_event: Arc<Notify>,
}

impl Upstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let next_event = Arc::new(Notify::new());
        let notify = Arc::clone(&next_event);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let notify = Arc::clone(&notify);
                let svc = hyper::service::service_fn(move |req| {
                    let notify = Arc::clone(&notify);
                    async move { Ok::<_, Infallible>(respond(req, notify)) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        Self { addr, next_event }
    }
}

fn full(data: impl Into<Bytes>) -> Out {
    Full::new(data.into()).boxed()
}

fn respond(req: Request<Incoming>, notify: Arc<Notify>) -> Response<Out> {
    let path = req.uri().path().to_owned();
    let text = big_text();
    let (body, mut headers) = match path.as_str() {
        "/chunked" => {
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                for chunk in text.chunks(10_000) {
                    let _ = tx.send(Bytes::copy_from_slice(chunk)).await;
                }
            });
            (Channel(rx).boxed(), HeaderMap::new())
        }
        "/events" => {
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                let _ = tx.send(Bytes::from_static(b"data: first\n\n")).await;
                notify.notified().await;
                let _ = tx.send(Bytes::from_static(b"data: second\n\n")).await;
            });
            let mut headers = HeaderMap::new();
            headers.insert("content-type", "text/event-stream".parse().unwrap());
            (Channel(rx).boxed(), headers)
        }
        "/small" => (full(text.slice(..100)), HeaderMap::new()),
        _ => (full(text), HeaderMap::new()),
    };
    if !headers.contains_key("content-type") {
        headers.insert("content-type", "text/plain; charset=utf-8".parse().unwrap());
    }
    let mut res = Response::new(body);
    let extra: &[(&str, &str)] = match path.as_str() {
        "/image" => &[("content-type", "image/png")],
        "/encoded" => &[("content-encoding", "gzip")],
        "/no-transform" => &[("cache-control", "public, no-transform")],
        "/range" => &[("content-range", "bytes 0-1048575/2000000")],
        "/tagged" => &[("etag", "\"v1\""), ("vary", "Origin")],
        _ => &[],
    };
    for (name, value) in extra {
        headers.insert(*name, value.parse().unwrap());
    }
    *res.headers_mut() = headers;
    *res.status_mut() = match path.as_str() {
        "/range" => StatusCode::PARTIAL_CONTENT,
        "/204" => StatusCode::NO_CONTENT,
        "/304" => StatusCode::NOT_MODIFIED,
        _ => StatusCode::OK,
    };
    if matches!(path.as_str(), "/204" | "/304") {
        *res.body_mut() = full(Bytes::new());
    }
    res
}

/// A proxy whose catch-all route compresses with the defaults (zstd, br, gzip; 1 KiB), and
/// whose host `gzip-first` offers gzip before br.
async fn proxy(upstream: &Upstream) -> TestProxy {
    let toml = format!(
        r#"
[[listener]]
name = "public"
listen = "127.0.0.1:0"
[[route]]
host = "gzip-first"
compression = {{ encodings = ["gzip", "br"] }}
cluster = "backend"
[[route]]
compression = true
cluster = "backend"
[cluster.backend]
kind = "static"
endpoints = ["{}"]
"#,
        upstream.addr
    );
    TestProxy::start(&toml).await
}

/// A response with its body as raw bytes.
struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn vary(&self) -> Vec<&str> {
        let all = self.headers.get_all("vary").iter();
        all.map(|v| v.to_str().unwrap()).collect()
    }

    /// The body, decoded as its `Content-Encoding` says.
    fn decoded(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self.header("content-encoding") {
            None => out.extend_from_slice(&self.body),
            Some("gzip") => {
                let mut d = flate2::read::GzDecoder::new(&self.body[..]);
                d.read_to_end(&mut out).unwrap();
            }
            Some("br") => {
                let mut d = brotli::Decompressor::new(&self.body[..], 4096);
                d.read_to_end(&mut out).unwrap();
            }
            Some("zstd") => out = zstd::stream::decode_all(&self.body[..]).unwrap(),
            Some(other) => panic!("unexpected encoding {other}"),
        }
        out
    }
}

async fn fetch(client: &Client, req: Request<Full<Bytes>>) -> Got {
    let res = client.request(req).await.expect("request failed");
    let (parts, body) = res.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

fn request(proxy: &TestProxy, path: &str, accept: Option<&str>) -> Request<Full<Bytes>> {
    let mut req = Request::get(proxy.url(path));
    if let Some(accept) = accept {
        req = req.header("accept-encoding", accept);
    }
    req.body(Full::default()).unwrap()
}

async fn get(proxy: &TestProxy, path: &str, accept: Option<&str>) -> Got {
    fetch(&client(), request(proxy, path, accept)).await
}

#[tokio::test]
async fn each_encoding_decodes_to_the_upstreams_bytes() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    for path in ["/big", "/chunked"] {
        for encoding in ["gzip", "br", "zstd"] {
            let got = get(&proxy, path, Some(encoding)).await;
            assert_eq!(got.status, StatusCode::OK);
            assert_eq!(got.header("content-encoding"), Some(encoding), "{path}");
            assert_eq!(got.header("content-length"), None, "{path} {encoding}");
            assert!(
                got.body.len() < (1 << 20) / 3,
                "{path} {encoding}: {}",
                got.body.len()
            );
            assert!(
                got.decoded() == big_text(),
                "{path} {encoding} decodes otherwise"
            );
            assert_eq!(got.vary(), ["accept-encoding"]);
        }
    }
}

#[tokio::test]
async fn q_values_choose_and_the_servers_order_breaks_ties() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let cases = [
        ("gzip, br, zstd", Some("zstd")),
        ("gzip, br;q=0.9", Some("gzip")),
        ("gzip;q=0, br;q=0.1", Some("br")),
        ("*", Some("zstd")),
        ("*;q=0.5, zstd;q=0", Some("br")),
        ("gzip;q=0, br;q=0, zstd;q=0", None),
        ("gzip;q=0.5, identity", None),
        ("deflate, compress", None),
    ];
    for (accept, expected) in cases {
        let got = get(&proxy, "/big", Some(accept)).await;
        assert_eq!(got.header("content-encoding"), expected, "{accept}");
        assert!(got.decoded() == big_text(), "{accept}");
    }
    let mut req = request(&proxy, "/big", Some("br, gzip"));
    req.headers_mut()
        .insert("host", "gzip-first".parse().unwrap());
    let got = fetch(&client(), req).await;
    assert_eq!(got.header("content-encoding"), Some("gzip"));
}

#[tokio::test]
async fn what_must_not_be_compressed_is_sent_as_it_is() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    for path in [
        "/small",
        "/image",
        "/encoded",
        "/no-transform",
        "/range",
        "/204",
        "/304",
    ] {
        let got = get(&proxy, path, Some("gzip, br, zstd")).await;
        let encoding = got.header("content-encoding");
        let expected = (path == "/encoded").then_some("gzip");
        assert_eq!(encoding, expected, "{path}");
        // Not compressed whoever asks: no Vary for it.
        assert!(got.vary().is_empty(), "{path}: {:?}", got.vary());
        let expected_len = match path {
            "/small" => 100,
            "/204" | "/304" => 0,
            _ => 1 << 20,
        };
        assert_eq!(got.body.len(), expected_len, "{path}");
    }
    let head = Request::head(proxy.url("/big"))
        .header("accept-encoding", "gzip")
        .body(Full::default())
        .unwrap();
    let got = fetch(&client(), head).await;
    assert_eq!(got.header("content-encoding"), None);
    assert_eq!(got.header("content-length"), Some("1048576"));
}

#[tokio::test]
async fn vary_is_added_to_what_a_client_could_have_had_compressed_and_etags_weaken() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    // Not compressed because of Accept-Encoding alone: caches must still key on it.
    for accept in [None, Some("identity"), Some("gzip;q=0")] {
        let got = get(&proxy, "/big", accept).await;
        assert_eq!(got.header("content-encoding"), None, "{accept:?}");
        assert_eq!(got.header("content-length"), Some("1048576"));
        assert_eq!(got.vary(), ["accept-encoding"], "{accept:?}");
        assert!(got.body == big_text());
    }
    let tagged = get(&proxy, "/tagged", Some("gzip")).await;
    assert_eq!(tagged.header("etag"), Some("W/\"v1\""));
    assert_eq!(tagged.vary(), ["Origin", "accept-encoding"]);
    let plain = get(&proxy, "/tagged", None).await;
    assert_eq!(plain.header("etag"), Some("\"v1\""));
    assert_eq!(plain.vary(), ["Origin", "accept-encoding"]);
}

/// The first event is readable, decompressed, before the upstream sends the second.
#[tokio::test]
async fn an_event_stream_arrives_event_by_event() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let res = client()
        .request(request(&proxy, "/events", Some("gzip")))
        .await
        .unwrap();
    assert_eq!(res.headers()["content-encoding"], "gzip");
    let mut body = res.into_body();
    let mut decoder = flate2::write::GzDecoder::new(Vec::new());
    let wait = std::time::Duration::from_secs(10);
    while !decoder.get_ref().ends_with(b"data: first\n\n") {
        let frame = tokio::time::timeout(wait, body.frame()).await;
        let frame = frame
            .expect("the first event did not come")
            .unwrap()
            .unwrap();
        std::io::Write::write_all(&mut decoder, &frame.into_data().unwrap()).unwrap();
        std::io::Write::flush(&mut decoder).unwrap();
    }
    upstream.next_event.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    std::io::Write::write_all(&mut decoder, &rest).unwrap();
    let all = decoder.finish().unwrap();
    assert_eq!(all, b"data: first\n\ndata: second\n\n");
}

#[tokio::test]
async fn http2_clients_get_it_too() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    let mut h2 = h2_connect(proxy.addr()).await;
    let req = Request::get(proxy.url("/big"))
        .version(http::Version::HTTP_2)
        .header("accept-encoding", "br")
        .body(Full::default())
        .unwrap();
    let res = h2.send_request(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let got = Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    };
    assert_eq!(got.header("content-encoding"), Some("br"));
    assert!(got.decoded() == big_text());
}

#[tokio::test]
async fn a_hostile_accept_encoding_costs_little_and_breaks_nothing() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream).await;
    // Thousands of entries (within the 16 KiB head): past the first few none is read.
    let many = format!("{}gzip", "x;q=0.1,".repeat(1_500));
    let got = get(&proxy, "/big", Some(&many)).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.header("content-encoding"), None);
    assert!(got.body == big_text());
    let junk = [
        "gzip;q=0.5, ;;;=,,;q=,q=1.5,*;q=abc",
        "gzip;q=99999999999999999999",
        ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,",
        "gzip;q=1.0001, br;q=0.0000",
    ];
    for accept in junk {
        let got = get(&proxy, "/big", Some(accept)).await;
        assert_eq!(got.status, StatusCode::OK, "{accept}");
        assert!(got.decoded() == big_text(), "{accept}");
    }
    let first = get(&proxy, "/big", Some(junk[0])).await;
    assert_eq!(first.header("content-encoding"), Some("gzip"));
}
