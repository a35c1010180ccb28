//! TLS and UNIX-socket acceptors, and re-dialing an acceptor that restarts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName};
use sluice_sdk::{serve, Acceptor, TlsOptions};
use support::{accept_all, hello, options, registered, Fake, Listener};
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::TlsAcceptor;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config for a fresh self-signed `localhost`, and a client config trusting it.
fn tls_pair() -> (TlsAcceptor, TlsOptions) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key.into())
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tls = TlsOptions {
        config: Arc::new(client),
        server_name: ServerName::try_from("localhost").unwrap(),
    };
    (TlsAcceptor::from(Arc::new(server)), tls)
}

#[tokio::test]
async fn sessions_over_tls() {
    let (acceptor, tls) = tls_pair();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut options = options(listener.local_addr().unwrap(), 2);
    options.tls = Some(tls);
    let mut fake = Fake::start(Listener::Tcp(listener), Some(acceptor), accept_all());
    let sessions = serve(options, tower::service_fn(hello)).unwrap();
    for mut s in fake.sessions(2).await {
        assert_eq!(s.get("/tls").await.body, "hello /tls");
    }
    registered(&sessions, 2).await;
}

#[tokio::test]
async fn sessions_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acceptor.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut fake = Fake::start(Listener::Unix(listener), None, accept_all());
    let sessions = serve(options(Acceptor::Unix(path), 1), tower::service_fn(hello)).unwrap();
    let mut s = fake.session().await;
    assert_eq!(s.get("/unix").await.body, "hello /unix");
    registered(&sessions, 1).await;
}

#[tokio::test]
async fn redials_after_the_acceptor_restarts_on_the_same_port() {
    let (mut fake, addr) = Fake::tcp().await;
    let sessions = serve(options(addr, 2), tower::service_fn(hello)).unwrap();
    let first = fake.sessions(2).await;
    registered(&sessions, 2).await;

    drop((fake, first));
    registered(&sessions, 0).await;
    let listener = TcpListener::bind(addr).await.unwrap();
    let mut fake = Fake::start(Listener::Tcp(listener), None, accept_all());
    for mut s in fake.sessions(2).await {
        assert_eq!(s.get("/back").await.body, "hello /back");
    }
    registered(&sessions, 2).await;
}
