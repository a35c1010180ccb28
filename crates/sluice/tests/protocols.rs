//! Client protocols end to end: h2c with prior knowledge, TLS with ALPN `h2` and `http/1.1`,
//! and listeners with HTTP/2 turned off. Upstreams always get HTTP/1.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use support::TestProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Barrier;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// An HTTP/1 backend that answers `<version> <path> host=<host> proto=<x-forwarded-proto>`,
/// holding each request until `together` requests are in flight at once. Streams forwarded
/// one after another would therefore never complete.
async fn probe_backend(together: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let barrier = Arc::new(Barrier::new(together));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let barrier = Arc::clone(&barrier);
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let barrier = Arc::clone(&barrier);
                async move {
                    barrier.wait().await;
                    let header = |name: &str| {
                        req.headers()
                            .get(name)
                            .map(|v| v.to_str().unwrap().to_owned())
                            .unwrap_or_default()
                    };
                    let text = format!(
                        "{:?} {} host={} proto={}",
                        req.version(),
                        req.uri(),
                        header("host"),
                        header("x-forwarded-proto")
                    );
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(text))))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    addr
}

/// One listener (`listener_extra` goes inside it) routing everything to `backend`.
fn config(backend: SocketAddr, listener_extra: &str) -> String {
    format!(
        r#"
[[listener]]
name = "test"
listen = "127.0.0.1:0"
{listener_extra}

[[route]]
cluster = "backend"

[cluster.backend]
kind = "static"
endpoints = ["{backend}"]
"#
    )
}

/// Status, version and whole body of a response.
async fn read(res: Response<Incoming>) -> (StatusCode, Version, String) {
    let (status, version) = (res.status(), res.version());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, version, String::from_utf8(body.to_vec()).unwrap())
}

fn get(uri: &str) -> Request<Full<Bytes>> {
    Request::get(uri).body(Full::default()).unwrap()
}

#[tokio::test]
async fn h2c_streams_run_concurrently_and_reach_the_upstream_as_http1() {
    const STREAMS: usize = 6;
    let backend = probe_backend(STREAMS).await;
    let proxy = TestProxy::start(&config(backend, "")).await;
    let sender = support::h2_connect(proxy.addr()).await;
    let mut streams = tokio::task::JoinSet::new();
    for i in 0..STREAMS {
        let mut sender = sender.clone();
        streams.spawn(async move {
            let req = get(&format!("http://app.example:8080/s/{i}"));
            let reply = support::h2_send(&mut sender, req).await;
            (i, reply)
        });
    }
    let all = tokio::time::timeout(Duration::from_secs(3), streams.join_all())
        .await
        .expect("streams did not run concurrently");
    for (i, reply) in all {
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.body,
            format!("HTTP/1.1 /s/{i} host=app.example:8080 proto=http")
        );
    }
}

#[tokio::test]
async fn h2c_preface_is_refused_when_http2_is_off() {
    let backend = probe_backend(1).await;
    let proxy = TestProxy::start(&config(backend, "http2 = false")).await;
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // hyper's HTTP/1 parser recognises the preface and closes without a response.
    let mut received = Vec::new();
    let read_all = stream.read_to_end(&mut received);
    tokio::time::timeout(Duration::from_secs(3), read_all)
        .await
        .expect("connection left open")
        .unwrap();
    assert_eq!(received, b"");

    let client = support::client();
    let reply = support::get(&client, &proxy.url("/h1")).await;
    assert_eq!(
        reply.body,
        format!("HTTP/1.1 /h1 host={} proto=http", proxy.addr())
    );
}

/// A TLS listener with a fresh self-signed `localhost` certificate; keep the directory for
/// the test's length.
async fn tls_proxy(
    backend: SocketAddr,
    http2: bool,
) -> (tempfile::TempDir, TestProxy, CertificateDer<'static>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cert.pem"), certified.cert.pem()).unwrap();
    std::fs::write(
        dir.path().join("key.pem"),
        certified.signing_key.serialize_pem(),
    )
    .unwrap();
    let extra = format!("tls = {{ cert = \"cert.pem\", key = \"key.pem\" }}\nhttp2 = {http2}");
    let proxy = TestProxy::start_in(&config(backend, &extra), dir.path()).await;
    (dir, proxy, certified.cert.der().clone())
}

/// Connects over TLS trusting only `cert`, offering `alpn`.
async fn tls_connect(
    addr: SocketAddr,
    cert: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Sends one HTTP/1.1 request for `path` over `tls`.
async fn h1_over(tls: TlsStream<TcpStream>, path: &str) -> (StatusCode, Version, String) {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "localhost")
        .body(Full::<Bytes>::default())
        .unwrap();
    read(sender.send_request(req).await.unwrap()).await
}

#[tokio::test]
async fn tls_alpn_http1_is_served_and_forwarded_as_https() {
    let backend = probe_backend(1).await;
    let (_dir, proxy, cert) = tls_proxy(backend, true).await;
    let tls = tls_connect(proxy.addr(), &cert, &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (status, version, body) = h1_over(tls, "/h1").await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_11));
    assert_eq!(body, "HTTP/1.1 /h1 host=localhost proto=https");
}

#[tokio::test]
async fn tls_alpn_h2_is_served_as_http2() {
    let backend = probe_backend(1).await;
    let (_dir, proxy, cert) = tls_proxy(backend, true).await;
    let tls = tls_connect(proxy.addr(), &cert, &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let res = sender
        .send_request(get("https://localhost/h2"))
        .await
        .unwrap();
    let (status, version, body) = read(res).await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_2));
    assert_eq!(body, "HTTP/1.1 /h2 host=localhost proto=https");
}

#[tokio::test]
async fn tls_listener_without_http2_negotiates_http1() {
    let backend = probe_backend(1).await;
    let (_dir, proxy, cert) = tls_proxy(backend, false).await;
    let tls = tls_connect(proxy.addr(), &cert, &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (status, version, body) = h1_over(tls, "/h1").await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_11));
    assert_eq!(body, "HTTP/1.1 /h1 host=localhost proto=https");

    // A client that insists on h2 gets no common protocol: rustls fails the handshake.
    let refused = tls_connect(proxy.addr(), &cert, &[b"h2"]).await;
    let error = refused.expect_err("handshake should fail").to_string();
    assert!(error.contains("NoApplicationProtocol"), "{error}");
}

#[tokio::test]
async fn h2_cookie_fields_reach_an_http1_upstream_as_one_header() {
    let backend = support::Backend::start("b").await;
    let proxy = TestProxy::start(&support::static_config(&[backend.addr], "")).await;
    let mut h2 = support::h2_connect(proxy.addr()).await;
    let req = http::Request::get("http://app.example/headers")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .body(Default::default())
        .unwrap();
    let res = support::h2_send(&mut h2, req).await;
    assert_eq!(res.status, 200);
    assert!(res.body.contains("cookie: a=1; b=2\n"), "{}", res.body);
    assert_eq!(res.body.matches("cookie:").count(), 1, "{}", res.body);
}
