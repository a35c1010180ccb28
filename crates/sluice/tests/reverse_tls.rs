//! TLS and mTLS on the acceptor, over real sockets: the SDK registers over TLS and serves
//! requests; client certificate names decide which services a certificate may register for;
//! a service without a certificate, or dialing in plaintext, never registers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName};
use sluice::{Proxy, ReverseCluster};
use sluice_sdk::{serve, Error, Identity, Options, Sessions, TlsOptions};
use sluice_session::Registration;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

/// Fails a test that would otherwise hang; never a timing assertion.
async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("the test hung")
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A leaf certificate and its key.
struct Leaf {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A test CA, the acceptor's certificate (for `localhost`) and two client certificates, with
/// the PEM files the proxy reads in a temp dir.
struct Pki {
    dir: TempDir,
    ca: CertificateDer<'static>,
    billing: Leaf,
    stranger: Leaf,
}

impl Pki {
    fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "Sluice test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let server = leaf(&issuer, "localhost", ExtendedKeyUsagePurpose::ServerAuth);
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", ca_cert.pem());
        write("server.pem", server.cert.pem());
        write("server.key", server.key.serialize_pem());
        Self {
            ca: ca_cert.der().clone(),
            billing: leaf(
                &issuer,
                "billing-1.internal",
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
            stranger: leaf(
                &issuer,
                "stranger.internal",
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
            dir,
        }
    }

    /// The SDK's TLS options: trust the test CA, present `client` if given.
    fn client(&self, client: Option<&Leaf>) -> TlsOptions {
        TlsOptions {
            config: Arc::new(self.client_config(client)),
            server_name: ServerName::try_from("localhost").unwrap(),
        }
    }

    fn client_config(&self, client: Option<&Leaf>) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        match client {
            None => builder.with_no_client_auth(),
            Some(leaf) => {
                let key = PrivatePkcs8KeyDer::from(leaf.key.serialize_der());
                builder
                    .with_client_auth_cert(vec![leaf.cert.der().clone()], key.into())
                    .unwrap()
            }
        }
    }
}

fn leaf(issuer: &Issuer<'_, KeyPair>, name: &str, usage: ExtendedKeyUsagePurpose) -> Leaf {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer).unwrap();
    Leaf { cert, key }
}

/// `GET path` through the proxy on a fresh connection: the status and the body.
async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = within(sender.send_request(req)).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A running proxy: reverse clusters `billing` (under `/billing`) and `api` (everything else).
struct TlsProxy {
    http: SocketAddr,
    acceptor: SocketAddr,
    billing: ReverseCluster,
    api: ReverseCluster,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl TlsProxy {
    /// `tls` is the acceptor's `tls = { ... }` table; `extra` follows it inside `[acceptor]`.
    async fn start(pki: &Pki, tls: &str, extra: &str) -> Self {
        Self::start_with(pki, tls, extra, "").await
    }

    /// As [`start`](Self::start), with extra keys for `[cluster.billing]`.
    async fn start_with(pki: &Pki, tls: &str, extra: &str, billing: &str) -> Self {
        let rate = if extra.contains("handshakes_per_second") {
            ""
        } else {
            "handshakes_per_second = 0\n"
        };
        let text = format!(
            "[acceptor]\nlisten = \"127.0.0.1:0\"\n{rate}tls = {tls}\n{extra}\n\
             [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
             [[route]]\npath_prefix = \"/billing\"\ncluster = \"billing\"\n\
             [[route]]\ncluster = \"api\"\n\
             [cluster.billing]\nkind = \"reverse\"\n{billing}\n[cluster.api]\nkind = \"reverse\"\n"
        );
        let config = sluice::config::parse_str(&text, "tls.toml", pki.dir.path()).unwrap();
        let proxy = Proxy::bind(&config).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let started = Self {
            http: proxy.local_addrs()[0].1,
            acceptor: proxy.acceptor_addr().unwrap(),
            billing: proxy.reverse_cluster("billing").unwrap().clone(),
            api: proxy.reverse_cluster("api").unwrap().clone(),
            stop,
            task: tokio::spawn(async {}),
        };
        let task = tokio::spawn(proxy.run_until(async move {
            let _ = stopped.await;
        }));
        Self { task, ..started }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

const SERVER_ONLY: &str = r#"{ cert = "server.pem", key = "server.key" }"#;
const MUTUAL: &str = r#"{ cert = "server.pem", key = "server.key", client_ca = "ca.pem" }"#;
const BILLING_ONLY: &str = "[acceptor.clients]\n\"billing-1.internal\" = [\"billing\"]\n";

/// Starts an SDK instance of `service` that answers `hello from <service>`.
fn start_service(acceptor: SocketAddr, service: &str, tls: TlsOptions) -> Sessions {
    start_identified(acceptor, Identity::new(service), tls)
}

fn start_identified(acceptor: SocketAddr, identity: Identity, tls: TlsOptions) -> Sessions {
    let name = identity.service.clone();
    let mut options = Options::new(acceptor, identity);
    options.tls = Some(tls);
    let svc = tower::service_fn(move |_req: Request<Incoming>| {
        let body = format!("hello from {name}");
        async move { Ok::<_, Infallible>(Response::new(body)) }
    });
    serve(options, svc).unwrap()
}

async fn registered(sessions: &Sessions, n: usize) {
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.registered == n))
        .await
        .unwrap();
}

async fn failed(sessions: &Sessions) -> Error {
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.last_error.is_some()))
        .await
        .unwrap();
    sessions.last_error().unwrap()
}

/// Dials the acceptor over TLS with `client`, sends a registration for `service`, and returns
/// everything the acceptor sent before closing (its refusal, or a 101).
async fn raw_register(pki: &Pki, proxy: &TlsProxy, client: &Leaf, service: &str) -> String {
    let connector = TlsConnector::from(Arc::new(pki.client_config(Some(client))));
    let tcp = TcpStream::connect(proxy.acceptor).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let hello = Registration {
        identity: Identity::new(service),
        capacity: Some(1),
        streams: None,
    };
    tls.write_all(&hello.encode()).await.unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    let _ = within(tls.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A TLS handshake flood from one address is limited before the handshake, not after: the
/// acceptor spends no TLS work on connections over the rate.
#[tokio::test]
async fn the_handshake_rate_limit_applies_before_the_tls_handshake() {
    let pki = Pki::new();
    let proxy = TlsProxy::start(&pki, SERVER_ONLY, "handshakes_per_second = 1").await;
    let connector = TlsConnector::from(Arc::new(pki.client_config(None)));
    let name = ServerName::try_from("localhost").unwrap();
    let mut completed = 0;
    for _ in 0..5 {
        let tcp = TcpStream::connect(proxy.acceptor).await.unwrap();
        if within(connector.connect(name.clone(), tcp)).await.is_ok() {
            completed += 1;
        }
    }
    // A burst of one, refilled at one a second: five in a row cannot all get a TLS session.
    assert!(
        (1..5).contains(&completed),
        "{completed} TLS handshakes completed"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn sdk_registers_over_tls_and_serves_requests() {
    let pki = Pki::new();
    let proxy = TlsProxy::start(&pki, SERVER_ONLY, "").await;
    let sessions = start_service(proxy.acceptor, "api", pki.client(None));
    registered(&sessions, 1).await;
    let res = get(proxy.http, "/hello").await;
    assert_eq!(res, (StatusCode::OK, "hello from api".to_owned()));
    assert_eq!(proxy.api.sessions(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn mtls_certificate_registers_only_for_its_services() {
    let pki = Pki::new();
    let proxy = TlsProxy::start(&pki, MUTUAL, BILLING_ONLY).await;
    let billing = start_service(proxy.acceptor, "billing", pki.client(Some(&pki.billing)));
    registered(&billing, 1).await;
    let res = get(proxy.http, "/billing/invoice").await;
    assert_eq!(res, (StatusCode::OK, "hello from billing".to_owned()));

    let wrong = start_service(proxy.acceptor, "api", pki.client(Some(&pki.billing)));
    assert!(matches!(
        failed(&wrong).await,
        Error::Refused { status: 401, .. }
    ));
    assert_eq!(wrong.registered(), 0);
    let answer = raw_register(&pki, &proxy, &pki.billing, "api").await;
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    assert!(answer.ends_with("client certificate not allowed for service api\n"));
    let answer = raw_register(&pki, &proxy, &pki.stranger, "billing").await;
    assert!(
        answer.starts_with("HTTP/1.1 401 "),
        "an unlisted name: {answer}"
    );
    assert_eq!(proxy.api.sessions(), 0);
    assert_eq!(proxy.billing.sessions(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn tokens_still_apply_under_mtls() {
    let pki = Pki::new();
    let tokens = "tokens = [\"s3cret\"]";
    let proxy = TlsProxy::start_with(&pki, MUTUAL, BILLING_ONLY, tokens).await;
    let answer = raw_register(&pki, &proxy, &pki.billing, "billing").await;
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    assert!(
        answer.ends_with("missing or invalid bearer token\n"),
        "{answer}"
    );
    let mut identity = Identity::new("billing");
    identity.token = Some("s3cret".into());
    let billing = start_identified(proxy.acceptor, identity, pki.client(Some(&pki.billing)));
    registered(&billing, 1).await;
    assert_eq!(get(proxy.http, "/billing").await.1, "hello from billing");
    proxy.stop().await;
}

#[tokio::test]
async fn mtls_without_client_certificate_never_registers() {
    let pki = Pki::new();
    let proxy = TlsProxy::start(&pki, MUTUAL, "").await;
    let anonymous = start_service(proxy.acceptor, "api", pki.client(None));
    let error = failed(&anonymous).await;
    // TLS 1.3 clients learn of the refusal after their side of the handshake, as an alert.
    assert!(matches!(error, Error::Tls(_) | Error::Io(_)), "{error}");
    assert_eq!(anonymous.registered(), 0);
    // Without [acceptor.clients], any certificate the CA signed may register.
    let stranger = start_service(proxy.acceptor, "api", pki.client(Some(&pki.stranger)));
    registered(&stranger, 1).await;
    assert_eq!(get(proxy.http, "/").await.1, "hello from api");
    assert_eq!(proxy.api.sessions(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn plaintext_registration_to_a_tls_acceptor_fails() {
    let pki = Pki::new();
    let proxy = TlsProxy::start(&pki, SERVER_ONLY, "").await;
    let mut tcp = TcpStream::connect(proxy.acceptor).await.unwrap();
    let hello = Registration {
        identity: Identity::new("api"),
        capacity: Some(1),
        streams: None,
    };
    tcp.write_all(&hello.encode()).await.unwrap();
    let mut answer = Vec::new();
    let _ = within(tcp.read_to_end(&mut answer)).await;
    assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");

    let mut options = Options::new(proxy.acceptor, Identity::new("api"));
    options.handshake_timeout = Duration::from_secs(5);
    let plain = serve(
        options,
        tower::service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }),
    )
    .unwrap();
    let error = failed(&plain).await;
    assert!(!matches!(error, Error::Refused { .. }), "{error}");
    assert_eq!(plain.registered(), 0);
    assert_eq!(proxy.api.sessions(), 0);
    proxy.stop().await;
}
