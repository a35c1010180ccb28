//! HTTP/3 to clients: a TLS listener with `http3 = true` serves the same routes over QUIC,
//! and its HTTP/1.1 and HTTP/2 answers offer it with `Alt-Svc`. (Independent clients,
//! aioquic and quic-go, to static clusters and dial-in sessions: tests/http3.)
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, StatusCode};

use crate::support::h3::{h3_request, try_h3_request, H3Tls};
use crate::support::{Backend, TestProxy};

async fn proxy(backend: &Backend, tls: &H3Tls, extra_listener: &str, route: &str) -> TestProxy {
    let toml = format!(
        "[runtime]\nshutdown_grace = \"5s\"\n\
         [[listener]]\nname = \"q\"\nlisten = \"127.0.0.1:0\"\n{}{extra_listener}\n\
         [[route]]\ncluster = \"backend\"\n{route}\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        tls.listener_keys(),
        backend.addr
    );
    TestProxy::start(&toml).await
}

fn req(method: &str, path: &str, body: &'static str) -> Request<Bytes> {
    let mut req = Request::builder().method(method).uri(path);
    if !body.is_empty() {
        req = req.header("content-length", body.len());
    }
    req.body(Bytes::from_static(body.as_bytes())).unwrap()
}

/// GET and POST (with a body of several QUIC packets) reach a static cluster over HTTP/3; the
/// request went upstream as HTTP/1.1 with its `Host` from `:authority`, and the handshake and
/// the requests are counted.
#[tokio::test]
async fn get_and_post_reach_a_static_cluster_over_http3() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let tls = H3Tls::write(dir.path());
    let p = proxy(&backend, &tls, "", "").await;
    let udp = p.http3[0].1;
    assert_eq!(
        udp.port(),
        p.addr().port(),
        "UDP on the listener's own port"
    );

    let got = h3_request(udp, &tls.client, req("GET", "/a?x=1", "")).await;
    assert_eq!(got.response.status(), StatusCode::OK);
    assert_eq!(got.response.version(), http::Version::HTTP_3);
    assert_eq!(got.body, "b /a");

    let big: &'static str = Box::leak("0123456789abcdef".repeat(1024).into_boxed_str());
    let got = h3_request(udp, &tls.client, req("POST", "/echo", big)).await;
    assert_eq!(got.response.status(), StatusCode::OK);
    assert_eq!(got.body.len(), big.len());
    assert_eq!(got.body, big.as_bytes());

    let got = h3_request(udp, &tls.client, req("GET", "/headers", "")).await;
    let text = String::from_utf8_lossy(&got.body).into_owned();
    assert!(
        text.contains(&format!("host: localhost:{}\n", udp.port())),
        "{text}"
    );
    assert!(text.contains("x-forwarded-proto: https\n"), "{text}");
    assert!(
        !text.contains("transfer-encoding"),
        "a GET without a body went chunked: {text}"
    );

    let metrics = p.metrics.render();
    assert!(
        metrics.contains("sluice_quic_handshakes_total{listener=\"q\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_http3_requests_total{listener=\"q\"} 3"),
        "{metrics}"
    );
    p.shutdown();
}

/// The listener's HTTP/1.1 and HTTP/2 answers (over TLS) carry `Alt-Svc` naming the UDP port,
/// replacing one the upstream sent.
#[tokio::test]
async fn tcp_answers_offer_http3_with_alt_svc() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let tls = H3Tls::write(dir.path());
    let route = "response_headers = { set = { \"alt-svc\" = \"h3=\\\":1\\\"\" } }";
    let p = proxy(&backend, &tls, "", route).await;
    let want = format!("h3=\":{}\"; ma=86400", p.http3[0].1.port());
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let head = tls_get(p.addr(), &tls, alpn, "/x").await;
        assert!(
            head.contains(&format!("alt-svc: {want}")),
            "{alpn:?}: {head}"
        );
    }
    p.shutdown();
}

/// On a listener that offers HTTP/3 the HTTP/1 fast path still serves HTTP/1.1 over TLS, and
/// every answer it writes — an upstream's, a route's own, its error — carries the listener's
/// `Alt-Svc` in place of any other, as hyper's path's answers do.
#[tokio::test]
async fn the_fast_path_serves_http1_on_an_http3_listener_and_offers_http3() {
    let backend = Backend::start("b").await;
    let refusing = crate::support::upstream::RefusingPort::new();
    let dir = tempfile::tempdir().unwrap();
    let tls = H3Tls::write(dir.path());
    let theirs = "alt-svc = \"h3=\\\":1\\\"\"";
    let toml = format!(
        "[[listener]]\nname = \"q\"\nlisten = \"127.0.0.1:0\"\n{}\n\
         [[route]]\npath_prefix = \"/own\"\n\
         direct_response = {{ status = 200, body = \"own\", headers = {{ {theirs} }} }}\n\
         [[route]]\npath_prefix = \"/gone\"\ncluster = \"gone\"\n\
         [[route]]\ncluster = \"backend\"\nresponse_headers = {{ set = {{ {theirs} }} }}\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n\
         [cluster.gone]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        tls.listener_keys(),
        backend.addr,
        refusing.addr,
    );
    let p = TestProxy::start(&toml).await;
    let want = format!("alt-svc: h3=\":{}\"; ma=86400", p.http3[0].1.port());
    for (path, status) in [("/x", "200"), ("/own", "200"), ("/gone", "502")] {
        let head = tls_get(p.addr(), &tls, b"http/1.1", path).await;
        assert!(head.contains(status), "{path}: {head}");
        assert!(head.contains(&want), "{path}: {head}");
        assert_eq!(head.matches("alt-svc").count(), 1, "{path}: {head}");
    }
    // The test command runs this a second time with `SLUICE_FAST_PATH=0`: hyper's path then
    // writes all three, and the fast path counts none.
    let on = std::env::var("SLUICE_FAST_PATH").as_deref() != Ok("0");
    let served = p.metrics.render();
    let fast: Option<u64> = served.lines().find_map(|l| {
        l.strip_prefix("sluice_http1_fast_path_requests_total ")?
            .parse()
            .ok()
    });
    assert_eq!(fast.unwrap_or(0), if on { 3 } else { 0 }, "{served}");
    p.shutdown();
}

/// One GET of `path` over TLS with `alpn`, the answer's head as text (`name: value` lines).
async fn tls_get(addr: std::net::SocketAddr, tls: &H3Tls, alpn: &[u8], path: &str) -> String {
    let mut config = (*tls.client).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let res = if alpn == b"h2" {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = Request::get(format!("https://localhost{path}"))
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let req = Request::get(path)
            .header("host", "localhost")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        send.send_request(req).await.unwrap()
    };
    let mut head = format!("{:?} {}\n", res.version(), res.status());
    for (k, v) in res.headers() {
        head.push_str(&format!("{k}: {}\n", v.to_str().unwrap()));
    }
    head
}

/// A limit of the route applies over HTTP/3 as over TCP: a body over `max_request_body` gets
/// 413, declared or not.
#[tokio::test]
async fn a_routes_body_limit_applies_over_http3() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let tls = H3Tls::write(dir.path());
    let p = proxy(&backend, &tls, "", "max_request_body = \"16B\"").await;
    let udp = p.http3[0].1;
    let got = h3_request(
        udp,
        &tls.client,
        req("POST", "/echo", "more than sixteen bytes"),
    )
    .await;
    assert_eq!(got.response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let mut undeclared = Request::post("/echo")
        .body(Bytes::from_static(b"more than sixteen bytes"))
        .unwrap();
    undeclared.headers_mut().remove("content-length");
    let got = h3_request(udp, &tls.client, undeclared).await;
    assert_eq!(got.response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    p.shutdown();
}

/// `http3_listen` puts the endpoint on an address of its own (port 0 here: one the kernel
/// picks), which `Alt-Svc` names.
#[tokio::test]
async fn http3_listen_binds_its_own_address() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let tls = H3Tls::write(dir.path());
    let listen = "http3_listen = \"127.0.0.1:0\"\nhttp3_retry = true\n";
    let p = proxy(&backend, &tls, listen, "").await;
    let port = p.http3[0].1.port();
    let head = tls_get(p.addr(), &tls, b"http/1.1", "/x").await;
    assert!(head.contains(&format!("alt-svc: h3=\":{port}\"")), "{head}");
    // With Retry on, the client's address is validated first: one round trip more, the same
    // answer.
    let got = h3_request(p.http3[0].1, &tls.client, req("GET", "/r", "")).await;
    assert_eq!(got.body, "b /r");
    p.shutdown();
}

/// A hot restart hands the UDP socket over with the TCP listener: the successor serves
/// HTTP/3 on the same port (it would fail to bind it otherwise), and the old process's run
/// ends.
#[tokio::test]
async fn a_hot_restarts_successor_serves_http3_on_the_same_socket() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let tls = H3Tls::write(dir.path());
    let text = format!(
        "[runtime]\nupgrade_socket = \"upgrade.sock\"\nshutdown_grace = \"5s\"\n\
         [[listener]]\nname = \"q\"\nlisten = \"127.0.0.1:0\"\n{}\n\
         [[route]]\ncluster = \"backend\"\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        tls.listener_keys(),
        backend.addr
    );
    let origin = dir.path().join("test.toml").display().to_string();
    let cfg = sluice::config::parse_str(&text, &origin, dir.path()).unwrap();
    let old = sluice::Proxy::bind(&cfg).await.unwrap();
    let udp = old.http3_addrs()[0].1;
    let old_run = tokio::spawn(old.run_until(std::future::pending()));
    let got = h3_request(udp, &tls.client, req("GET", "/before", "")).await;
    assert_eq!(got.body, "b /before");

    let upgrade = dir.path().join("upgrade.sock");
    let inherited = sluice::Inherited::take_over(&upgrade).await.unwrap();
    let new = sluice::Proxy::bind_inheriting(&cfg, Some(inherited))
        .await
        .unwrap();
    assert_eq!(new.http3_addrs()[0].1, udp, "the same UDP socket");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let new_run = tokio::spawn(new.run_until(async move {
        let _ = stopped.await;
    }));
    old_run.await.unwrap();
    let got = h3_request(udp, &tls.client, req("GET", "/after", "")).await;
    assert_eq!(got.body, "b /after");
    let _ = stop.send(());
    new_run.await.unwrap();
}

/// Today's behaviour, kept honest: a hot restart fails an HTTP/3 request in flight on the old
/// process. The successor takes the UDP socket, so the old process closes its QUIC
/// connections at the hand-over (`H3_NO_ERROR`) rather than reading packets
/// meant for the successor's clients; the next request reaches the successor. Issue 51 asks
/// for no lost request: docs/reloads.md "HTTP/3 across a hot restart" designs it, and this
/// test's first expectation turns into "answered by the old process" when it is built.
#[tokio::test]
async fn a_hot_restart_fails_an_http3_request_in_flight_today() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let tls = H3Tls::write(dir.path());
    let text = format!(
        "[runtime]\nupgrade_socket = \"upgrade.sock\"\nshutdown_grace = \"10s\"\n\
         [[listener]]\nname = \"q\"\nlisten = \"127.0.0.1:0\"\n{}\n\
         [[route]]\ncluster = \"backend\"\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        tls.listener_keys(),
        backend.addr
    );
    let origin = dir.path().join("test.toml").display().to_string();
    let cfg = sluice::config::parse_str(&text, &origin, dir.path()).unwrap();
    let old = sluice::Proxy::bind(&cfg).await.unwrap();
    let udp = old.http3_addrs()[0].1;
    let old_run = tokio::spawn(old.run_until(std::future::pending()));
    let client = Arc::clone(&tls.client);
    let in_flight =
        tokio::spawn(
            async move { try_h3_request(udp, &client, req("GET", "/delay/2000", "")).await },
        );
    let began = async {
        while backend
            .stats
            .in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), began)
        .await
        .unwrap();

    let upgrade = dir.path().join("upgrade.sock");
    let inherited = sluice::Inherited::take_over(&upgrade).await.unwrap();
    let new = sluice::Proxy::bind_inheriting(&cfg, Some(inherited))
        .await
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let new_run = tokio::spawn(new.run_until(async move {
        let _ = stopped.await;
    }));
    old_run.await.unwrap();
    let lost = tokio::time::timeout(std::time::Duration::from_secs(10), in_flight)
        .await
        .unwrap()
        .unwrap();
    let said = lost.expect_err("today the old process closes its QUIC connections");
    assert!(
        said.contains("Remote error: ApplicationClose: H3_NO_ERROR"),
        "the old process closed the connection at the hand-over: {said}"
    );
    let got = h3_request(udp, &tls.client, req("GET", "/after", "")).await;
    assert_eq!(got.body, "b /after");
    let _ = stop.send(());
    new_run.await.unwrap();
}

/// A shutdown lets an HTTP/3 request in flight finish (the connection gets GOAWAY, not a
/// close), then the proxy's run ends.
#[tokio::test]
async fn a_shutdown_lets_an_http3_request_in_flight_finish() {
    let backend = Backend::start("b").await;
    let dir = tempfile::tempdir().unwrap();
    let tls = H3Tls::write(dir.path());
    let p = proxy(&backend, &tls, "", "").await;
    let (udp, client) = (p.http3[0].1, Arc::clone(&tls.client));
    let slow =
        tokio::spawn(async move { h3_request(udp, &client, req("GET", "/delay/300", "")).await });
    let began = async {
        while backend
            .stats
            .in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), began)
        .await
        .unwrap();
    p.shutdown();
    let got = slow.await.unwrap();
    assert_eq!(got.response.status(), StatusCode::OK);
    assert_eq!(got.body, "b /delay/300");
    tokio::time::timeout(std::time::Duration::from_secs(10), p.task)
        .await
        .unwrap()
        .unwrap();
}
