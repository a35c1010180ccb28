//! TLS beyond one certificate on a listener: HTTPS upstreams (pooled, resumed, verified with a
//! reason for each failed check, mTLS, health checks), certificates chosen by SNI, resumption
//! for clients, and certificates replaced by a reload while connections stay open.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, HandshakeKind};
use sluice::{Proxy, Shutdown};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use support::{client, get, static_config, TestProxy};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate and its key, in PEM and DER.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

impl Leaf {
    fn write(&self, dir: &Path, name: &str) {
        std::fs::write(dir.join(format!("{name}.pem")), &self.cert_pem).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), &self.key_pem).unwrap();
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        use rustls::pki_types::pem::PemObject;
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).unwrap()
    }
}

/// A test CA that signs leaves; its PEM is written as `ca.pem` in `dir`.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Self {
            der: cert.der().clone(),
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `names`, valid now unless `expired`.
    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose, expired: bool) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![usage];
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    fn server(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ServerAuth, false)
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der.clone()).unwrap();
        roots
    }

    /// An HTTP/1.1 client's TLS config (a session cache of its own) that trusts this CA.
    fn client(&self) -> Arc<rustls::ClientConfig> {
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(self.roots())
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// What an HTTPS backend saw.
#[derive(Default)]
struct Seen {
    handshakes: AtomicUsize,
    resumed: AtomicUsize,
    requests: AtomicUsize,
    paths: Mutex<Vec<String>>,
    client_certs: AtomicUsize,
}

/// An HTTPS/1.1 backend answering `tls <path>` to every request.
async fn https_backend(config: rustls::ServerConfig) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    https_backend_on(listener, config).await
}

/// [`https_backend`] on `listener`.
async fn https_backend_on(
    listener: TcpListener,
    config: rustls::ServerConfig,
) -> (SocketAddr, Arc<Seen>) {
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let shared = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, seen) = (acceptor.clone(), Arc::clone(&shared));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (_, conn) = tls.get_ref();
                seen.handshakes.fetch_add(1, Ordering::SeqCst);
                if conn.handshake_kind() == Some(HandshakeKind::Resumed) {
                    seen.resumed.fetch_add(1, Ordering::SeqCst);
                }
                if conn.peer_certificates().is_some() {
                    seen.client_certs.fetch_add(1, Ordering::SeqCst);
                }
                let svc = service_fn(move |req: Request<Incoming>| {
                    let seen = Arc::clone(&seen);
                    async move {
                        seen.requests.fetch_add(1, Ordering::SeqCst);
                        let path = req.uri().path().to_owned();
                        seen.paths.lock().unwrap().push(path.clone());
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(format!(
                            "tls {path}"
                        )))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn server_config(leaf: &Leaf) -> rustls::ServerConfig {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der.clone()], leaf.key())
        .unwrap();
    config.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
    config
}

/// A temp dir holding `ca.pem`, the CA that signs the HTTPS backends' certificates.
fn upstream_ca() -> (TempDir, Ca) {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("upstream CA");
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    (dir, ca)
}

/// The cluster's `tls` for a backend whose certificate `upstream_ca` signed for `backend.test`.
const VERIFIED: &str = r#"ca = "ca.pem", sni = "backend.test""#;

/// A proxy whose cluster `backend` reaches `backend` with `tls = { <tls> }`, its files in `dir`.
async fn proxy_to(dir: &Path, backend: SocketAddr, tls: &str, extra: &str) -> TestProxy {
    let cluster = format!("tls = {{ {tls} }}\n{extra}");
    TestProxy::start_in(&static_config(&[backend], &cluster), dir).await
}

#[tokio::test]
async fn requests_reach_an_https_backend_on_pooled_connections() {
    let (dir, ca) = upstream_ca();
    let (backend, seen) = https_backend(server_config(&ca.server("backend.test"))).await;
    let proxy = proxy_to(dir.path(), backend, VERIFIED, "").await;
    let client = client();
    for i in 0..5 {
        let reply = get(&client, &proxy.url(&format!("/r{i}"))).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, format!("tls /r{i}"));
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 5);
    assert_eq!(
        seen.handshakes.load(Ordering::SeqCst),
        1,
        "five requests in a row share one pooled TLS connection"
    );
}

#[tokio::test]
async fn a_cluster_that_follows_dns_sends_and_verifies_the_name_whatever_its_address() {
    let (dir, ca) = upstream_ca();
    let dns = support::dns::TestDns::start("sluice.test.").await;
    // The certificate names the DNS name only; the name resolves to 127.0.0.2.
    let listener = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let leaf = server_config(&ca.server("api.sluice.test"));
    let (_, seen) = https_backend_on(listener, leaf).await;
    dns.set(
        "api.sluice.test.",
        &[std::net::Ipv4Addr::new(127, 0, 0, 2)],
        0,
    )
    .await;
    let stand_in: SocketAddr = ([0, 0, 0, 0], port).into();
    let cluster = "tls = { ca = \"ca.pem\" }\nresolve = true";
    let text = static_config(&[stand_in], cluster).replace(
        &format!("\"{stand_in}\""),
        &format!("\"api.sluice.test:{port}\""),
    );
    let text = format!("{text}\n[dns]\nnameservers = [\"{}\"]\n", dns.addr);
    let proxy = TestProxy::start_in(&text, dir.path()).await;
    let reply = get(&client(), &proxy.url("/x")).await;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (StatusCode::OK, "tls /x")
    );
    assert_eq!(seen.handshakes.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn new_connections_to_an_https_backend_resume_the_session() {
    let (dir, ca) = upstream_ca();
    let (backend, seen) = https_backend(server_config(&ca.server("backend.test"))).await;
    // One request per connection: every request needs a handshake.
    let pool = "pool = { max_requests_per_connection = 1 }";
    let proxy = proxy_to(dir.path(), backend, VERIFIED, pool).await;
    let client = client();
    for _ in 0..4 {
        assert_eq!(get(&client, &proxy.url("/")).await.status, StatusCode::OK);
    }
    assert_eq!(seen.handshakes.load(Ordering::SeqCst), 4);
    assert!(
        seen.resumed.load(Ordering::SeqCst) >= 2,
        "later handshakes resume: {} of 4 resumed",
        seen.resumed.load(Ordering::SeqCst)
    );
}

/// Each failed certificate check is a 502 whose body says which check failed.
#[tokio::test]
async fn a_wrong_ca_a_wrong_name_and_an_expired_certificate_each_get_502_with_the_reason() {
    let (dir, ca) = upstream_ca();
    let other = Ca::new("some other CA");
    std::fs::write(dir.path().join("other-ca.pem"), &other.pem).unwrap();
    let good = server_config(&ca.server("backend.test"));
    let expired = ca.leaf(&["backend.test"], ExtendedKeyUsagePurpose::ServerAuth, true);
    let cases = [
        (
            good.clone(),
            r#"ca = "other-ca.pem", sni = "backend.test""#,
            "certificate not signed by a trusted CA",
        ),
        (
            good,
            r#"ca = "ca.pem", sni = "elsewhere.test""#,
            "certificate not valid for the server name",
        ),
        (server_config(&expired), VERIFIED, "certificate expired"),
    ];
    for (config, tls, reason) in cases {
        let (backend, seen) = https_backend(config).await;
        let proxy = proxy_to(dir.path(), backend, tls, "").await;
        let reply = get(&client(), &proxy.url("/")).await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{tls}");
        assert_eq!(
            reply.body,
            format!("upstream TLS handshake failed: {reason}\n"),
            "{tls}"
        );
        assert_eq!(seen.requests.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test]
async fn a_backend_that_requires_client_certificates_gets_the_clusters() {
    let (dir, ca) = upstream_ca();
    ca.leaf(&["sluice.test"], ExtendedKeyUsagePurpose::ClientAuth, false)
        .write(dir.path(), "client");
    let leaf = ca.server("backend.test");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(ca.roots()),
        provider(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![leaf.der.clone()], leaf.key())
        .unwrap();
    let (backend, seen) = https_backend(config).await;

    let mtls = r#"ca = "ca.pem", sni = "backend.test", cert = "client.pem", key = "client.key""#;
    let proxy = proxy_to(dir.path(), backend, mtls, "").await;
    let reply = get(&client(), &proxy.url("/mtls")).await;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (StatusCode::OK, "tls /mtls")
    );
    assert_eq!(seen.client_certs.load(Ordering::SeqCst), 1);

    let without = proxy_to(
        dir.path(),
        backend,
        r#"ca = "ca.pem", sni = "backend.test""#,
        "",
    )
    .await;
    let reply = get(&client(), &without.url("/mtls")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        seen.requests.load(Ordering::SeqCst),
        1,
        "no request without a certificate"
    );
}

#[tokio::test]
async fn health_checks_of_an_https_cluster_speak_tls() {
    let (dir, ca) = upstream_ca();
    let (backend, seen) = https_backend(server_config(&ca.server("backend.test"))).await;
    let check = r#"health_check = { path = "/healthz", interval = "50ms" }"#;
    let _proxy = proxy_to(dir.path(), backend, VERIFIED, check).await;
    support::upstream::wait_until("a health check over TLS", || {
        seen.paths.lock().unwrap().iter().any(|p| p == "/healthz")
    })
    .await;
}

/// Accepts any server certificate and remembers the one presented.
#[derive(Debug, Default)]
struct Capture(Mutex<Option<CertificateDer<'static>>>);

impl ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.0.lock().unwrap() = Some(end_entity.clone().into_owned());
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &provider().signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &provider().signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The certificate `addr` presents to a client sending `sni` (`None`: no SNI).
async fn presented(addr: SocketAddr, sni: Option<&str>) -> CertificateDer<'static> {
    let capture = Arc::new(Capture::default());
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::clone(&capture) as Arc<dyn ServerCertVerifier>)
        .with_no_client_auth();
    // rustls sends no SNI for an IP address.
    let name = match sni {
        Some(name) => ServerName::try_from(name.to_owned()).unwrap(),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let cert = capture.0.lock().unwrap().take();
    cert.expect("a certificate was presented")
}

/// A proxy whose TLS listener serves `listener_tls` (its files in `dir`), and its backend.
async fn tls_listener(dir: &Path, listener_tls: &str) -> (TestProxy, support::Backend) {
    let backend = support::Backend::start("plain").await;
    let text = static_config(&[backend.addr], "").replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:0\"\ntls = {listener_tls}"),
    );
    (TestProxy::start_in(&text, dir).await, backend)
}

#[tokio::test]
async fn sni_picks_the_certificate_carrying_the_name_and_the_first_serves_the_rest() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("listener CA");
    let a = ca.server("a.test");
    let b = ca.leaf(
        &["b.test", "*.wild.test"],
        ExtendedKeyUsagePurpose::ServerAuth,
        false,
    );
    a.write(dir.path(), "a");
    b.write(dir.path(), "b");
    let tls = r#"[{ cert = "a.pem", key = "a.key" }, { cert = "b.pem", key = "b.key" }]"#;
    let (proxy, _backend) = tls_listener(dir.path(), tls).await;
    let addr = proxy.addr();
    assert_eq!(presented(addr, Some("a.test")).await, a.der);
    assert_eq!(presented(addr, Some("b.test")).await, b.der);
    assert_eq!(presented(addr, Some("x.wild.test")).await, b.der);
    assert_eq!(
        presented(addr, Some("y.x.wild.test")).await,
        a.der,
        "a wildcard is one label"
    );
    assert_eq!(presented(addr, Some("unknown.test")).await, a.der);
    assert_eq!(presented(addr, None).await, a.der);
}

/// A client TLS connection to `addr` for `a.test`, made with `config`.
async fn connect_a_test(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("a.test").unwrap();
    TlsConnector::from(config).connect(name, tcp).await.unwrap()
}

/// An HTTP/1.1 request over a client TLS connection made with `config`; how the handshake went.
async fn tls_get(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    path: &str,
) -> (StatusCode, Option<HandshakeKind>) {
    let tls = connect_a_test(addr, Arc::clone(config)).await;
    let kind = tls.get_ref().1.handshake_kind();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "a.test")
        .body(Full::<Bytes>::default())
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    let status = res.status();
    res.into_body().collect().await.unwrap();
    (status, kind)
}

#[tokio::test]
async fn a_returning_client_resumes_its_tls_session() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("listener CA");
    ca.server("a.test").write(dir.path(), "a");
    let (proxy, _backend) = tls_listener(dir.path(), r#"{ cert = "a.pem", key = "a.key" }"#).await;
    let config = ca.client();
    let first = tls_get(proxy.addr(), &config, "/").await;
    assert_eq!(first, (StatusCode::OK, Some(HandshakeKind::Full)));
    let second = tls_get(proxy.addr(), &config, "/").await;
    assert_eq!(second, (StatusCode::OK, Some(HandshakeKind::Resumed)));
}

/// HTTP/1.1 over TLS takes the fast path as plain HTTP/1.1 does (unless the test command's
/// second run turned it off), the upstream is told the client came over TLS, and a connection
/// the proxy ends gets TLS's `close_notify` first: a client reading to the close sees a clean
/// end, not a truncation.
#[tokio::test]
async fn https_requests_take_the_fast_path_and_end_with_close_notify() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("listener CA");
    ca.server("a.test").write(dir.path(), "a");
    let (proxy, backend) = tls_listener(dir.path(), r#"{ cert = "a.pem", key = "a.key" }"#).await;
    let mut tls = connect_a_test(proxy.addr(), ca.client()).await;
    tls.write_all(
        b"GET /headers HTTP/1.1\r\nHost: a.test\r\n\r\n\
          GET /two HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    read.expect("the proxy closed the connection")
        .unwrap_or_else(|e| panic!("not a clean TLS close ({e}); received {text:?}"));
    let bodies: Vec<&str> = text
        .split("HTTP/1.1 200 OK")
        .skip(1)
        .map(|r| r.split_once("\r\n\r\n").map_or("", |(_, body)| body))
        .collect();
    assert_eq!(bodies.len(), 2, "{text:?}");
    assert!(
        bodies[0].contains("x-forwarded-proto: https\n"),
        "{:?}",
        bodies[0]
    );
    assert_eq!(bodies[1], "plain /two");
    assert_eq!(backend.requests(), 2);
    let fast = std::env::var("SLUICE_FAST_PATH").as_deref() != Ok("0");
    let served = proxy
        .metrics
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix("sluice_http1_fast_path_requests_total")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0);
    assert_eq!(served, if fast { 2 } else { 0 });
}

/// The Let's Encrypt renewal: the same paths, new contents, a reload. New handshakes get the
/// new certificate in the same process; a connection opened before goes on working.
#[tokio::test]
async fn a_reload_swaps_renewed_certificates_in_place_and_open_connections_carry_on() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("listener CA");
    let old = ca.server("a.test");
    old.write(dir.path(), "a");
    let backend = support::Backend::start("plain").await;
    let text = static_config(&[backend.addr], "").replace(
        "listen = \"127.0.0.1:0\"",
        "listen = \"127.0.0.1:0\"\ntls = { cert = \"a.pem\", key = \"a.key\" }",
    );
    let config = sluice::config::parse_str(&text, "test.toml", dir.path()).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let addr = proxy.local_addrs()[0].1;
    let in_place = proxy.in_place();
    let shutdown = Shutdown::new();
    let signal = shutdown.signal();
    tokio::spawn(proxy.run_until(async move { signal.wait().await }));

    // A keep-alive connection opened under the old certificate.
    let tls = connect_a_test(addr, ca.client()).await;
    let (mut open, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = |path: &str| {
        Request::get(path)
            .header("host", "a.test")
            .body(Full::<Bytes>::default())
            .unwrap()
    };
    let res = open.send_request(request("/before")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.into_body().collect().await.unwrap();
    assert_eq!(presented(addr, Some("a.test")).await, old.der);

    let renewed = ca.server("a.test");
    renewed.write(dir.path(), "a");
    let config = sluice::config::parse_str(&text, "test.toml", dir.path()).unwrap();
    let applied = in_place.apply(&config).expect("applied in place");
    assert_eq!(applied.certificates, vec!["test".to_owned()]);
    assert!(!applied.routes && applied.added.is_empty() && applied.removed.is_empty());

    assert_eq!(presented(addr, Some("a.test")).await, renewed.der);
    let res = open.send_request(request("/after")).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "the connection opened before carries on"
    );
    shutdown.trigger();
}

/// Resumption rests on tickets, not on a bounded server-side cache: a client comes back after
/// more clients than rustls's default cache holds (256) and is still resumed.
#[tokio::test]
async fn a_client_resumes_after_more_clients_than_a_session_cache_holds() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("listener CA");
    ca.server("a.test").write(dir.path(), "a");
    let (proxy, _backend) = tls_listener(dir.path(), r#"{ cert = "a.pem", key = "a.key" }"#).await;
    let first = ca.client();
    assert_eq!(
        tls_get(proxy.addr(), &first, "/").await.1,
        Some(HandshakeKind::Full)
    );
    for _ in 0..300 {
        tls_get(proxy.addr(), &ca.client(), "/").await;
    }
    assert_eq!(
        tls_get(proxy.addr(), &first, "/").await.1,
        Some(HandshakeKind::Resumed)
    );
}

/// Issue 28, item 11: a client whose TLS handshake fails (plaintext HTTP to a TLS port) is
/// counted per listener; the open connections gauge follows the connections.
#[tokio::test]
async fn failed_handshakes_and_open_connections_are_counted() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("listener CA");
    ca.server("a.test").write(dir.path(), "a");
    let (proxy, _backend) = tls_listener(dir.path(), r#"{ cert = "a.pem", key = "a.key" }"#).await;
    let mut plain = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = plain.read_to_end(&mut rest).await;
    let value = |name: &str| {
        proxy
            .metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
    };
    let failures = "sluice_tls_handshake_failures_total{listener=\"test\"}";
    support::upstream::wait_until("the failure is counted", || value(failures) == Some(1.0)).await;
    let open = "sluice_client_connections{listener=\"test\"}";
    support::upstream::wait_until("the connection is gone", || value(open) == Some(0.0)).await;
    let held = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    support::upstream::wait_until("one open", || value(open) == Some(1.0)).await;
    drop(held);
    assert!(value("process_resident_memory_bytes").is_some_and(|v| v > 0.0));
}

/// Issue 28, items 9 and 11: each TLS listener's certificates, with their names and expiry, in
/// `/status` and as a gauge in `/metrics`, as served now (a renewal shows at once).
#[tokio::test]
async fn status_and_metrics_show_each_certificates_expiry() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("listener CA");
    let leaf = ca.server("a.test");
    leaf.write(dir.path(), "a");
    let backend = support::Backend::start("plain").await;
    let text = static_config(&[backend.addr], "")
        .replace(
            "listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:0\"\ntls = { cert = \"a.pem\", key = \"a.key\" }",
        )
        .replace("[runtime]", "[admin]\nlisten = \"127.0.0.1:0\"\n[runtime]");
    let config = sluice::config::parse_str(&text, "t.toml", dir.path()).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let admin = proxy.admin_addr().unwrap();
    let metrics = Arc::clone(proxy.metrics());
    tokio::spawn(proxy.run_until(std::future::pending()));
    let expected = sluice_wire::cert::not_after(&leaf.der).unwrap();
    let mut stream = TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let body = raw.split_once("\r\n\r\n").unwrap().1;
    let status: serde_json::Value = serde_json::from_str(body).unwrap();
    let cert = &status["listeners"][0]["certificates"][0];
    assert_eq!(cert["names"][0], "a.test", "{status}");
    assert_eq!(cert["not_after"], expected);
    assert!(cert["days_left"].as_f64().unwrap() > 0.0);
    let series =
        "sluice_tls_certificate_expiry_timestamp_seconds{listener=\"test\",name=\"a.test\"}";
    let rendered = metrics.render();
    assert!(
        rendered.contains(&format!("{series} {expected}")),
        "{rendered}"
    );
}

/// An HTTPS backend offering `alpn` that speaks what the handshake agreed (HTTP/2 or
/// HTTP/1.1) and answers each request with the version it came in.
async fn alpn_backend(ca: &Ca, alpn: &[&[u8]]) -> SocketAddr {
    let mut config = server_config(&ca.server("backend.test"));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let text = format!("{:?} {}", req.version(), req.uri().path());
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(text))))
                });
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn h2_and_auto_clusters_speak_what_alpn_agrees() {
    let (dir, ca) = upstream_ca();
    let both = alpn_backend(&ca, &[b"h2", b"http/1.1"]).await;
    let http1_only = alpn_backend(&ca, &[b"http/1.1"]).await;
    let client = client();
    for (backend, protocol, expected) in [
        (both, "h2", "HTTP/2.0 /x"),
        (both, "auto", "HTTP/2.0 /x"),
        (http1_only, "auto", "HTTP/1.1 /x"),
        (both, "http1", "HTTP/1.1 /x"),
    ] {
        let extra = format!("protocol = \"{protocol}\"");
        let proxy = proxy_to(dir.path(), backend, VERIFIED, &extra).await;
        for _ in 0..2 {
            let reply = get(&client, &proxy.url("/x")).await;
            assert_eq!(
                (reply.status, reply.body.as_str()),
                (StatusCode::OK, expected),
                "{protocol}"
            );
        }
    }
    // `h2` to an endpoint that will not speak it: 502 with the reason.
    let proxy = proxy_to(dir.path(), http1_only, VERIFIED, "protocol = \"h2\"").await;
    let reply = get(&client, &proxy.url("/x")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(
        reply.body.contains("application protocol"),
        "{}",
        reply.body
    );
}

/// A TLS client that trickles a record byte by byte while the proxy waits for its next request
/// moves bytes but begins no request: the header timeout closes the connection as it closes a
/// silent one, and the bytes do not hold it open for the idle timeout (60 s here).
#[tokio::test]
async fn a_record_trickled_between_requests_does_not_hold_the_connection() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("listener CA");
    ca.server("a.test").write(dir.path(), "a");
    let backend = support::Backend::start("plain").await;
    let text = static_config(&[backend.addr], "").replace(
        "listen = \"127.0.0.1:0\"",
        "listen = \"127.0.0.1:0\"\nrequest_header_timeout = \"1s\"\n\
         tls = { cert = \"a.pem\", key = \"a.key\" }",
    );
    let proxy = TestProxy::start_in(&text, dir.path()).await;
    let mut tls = connect_a_test(proxy.addr(), ca.client()).await;
    tls.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .await
        .unwrap();
    let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
    while !got.ends_with(b"plain /") {
        let n = tls.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    // The header of an application-data record of 16 KiB, then its bytes, one every 100 ms.
    let tcp = tls.get_mut().0;
    tcp.write_all(&[0x17, 0x03, 0x03, 0x40, 0x00])
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let closed = 'trickle: loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if tcp.write_all(&[0]).await.is_err() {
            break true;
        }
        loop {
            match tcp.try_read(&mut buf) {
                Ok(0) => break 'trickle true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => break 'trickle true,
            }
        }
        if started.elapsed() > Duration::from_secs(5) {
            break false;
        }
    };
    assert!(
        closed,
        "still open 5 s into the trickle, with a header timeout of 1 s"
    );
}
