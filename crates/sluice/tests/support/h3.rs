//! An HTTP/3 client for the tests (h3 over quinn, the stack the proxy serves with; the
//! independent clients, aioquic and quic-go, are tests/http3's), and a certificate for the
//! proxy's TLS listener that it trusts.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Request, Response};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A test CA's leaf for `localhost`, written as `h3.pem` and `h3.key` in a directory, and a
/// client config that trusts the CA (TLS 1.3, ALPN `h3`).
pub struct H3Tls {
    pub client: Arc<rustls::ClientConfig>,
    dir: std::path::PathBuf,
}

impl H3Tls {
    pub fn write(dir: &Path) -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "h3 test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join("h3.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("h3.key"), key.serialize_pem()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"h3".to_vec()];
        Self {
            client: Arc::new(client),
            dir: dir.to_owned(),
        }
    }

    /// The listener keys that serve this certificate with HTTP/3 on.
    pub fn listener_keys(&self) -> String {
        let (cert, key) = (self.dir.join("h3.pem"), self.dir.join("h3.key"));
        format!(
            "tls = {{ cert = \"{}\", key = \"{}\" }}\nhttp3 = true\n",
            cert.display(),
            key.display()
        )
    }
}

/// What an HTTP/3 request brought back: the head, the body, the trailers.
#[derive(Debug)]
pub struct H3Answer {
    pub response: Response<()>,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

/// Sends `req` (its URI's path; `localhost` is the authority) over a new QUIC connection to
/// `addr` and reads the whole answer.
pub async fn h3_request(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    req: Request<Bytes>,
) -> H3Answer {
    try_h3_request(addr, tls, req).await.unwrap()
}

/// [`h3_request`], with what went wrong (the handshake, or the request's stream or
/// connection) as an error rather than a panic.
pub async fn try_h3_request(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    req: Request<Bytes>,
) -> Result<H3Answer, String> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::clone(tls)).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let quic = endpoint
        .connect(addr, "localhost")
        .unwrap()
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut driver, mut sender) = h3::client::new(h3_quinn::Connection::new(quic))
        .await
        .map_err(|e| format!("HTTP/3 setup: {e}"))?;
    let drive = tokio::spawn(async move { poll_fn(|cx| driver.poll_close(cx)).await });
    let answer = exchange(&mut sender, addr, req).await;
    drop(sender);
    drive.abort();
    endpoint.close(0u32.into(), b"");
    answer.map_err(|e| format!("request: {e}"))
}

async fn exchange(
    sender: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    addr: SocketAddr,
    req: Request<Bytes>,
) -> Result<H3Answer, h3::error::StreamError> {
    let (mut parts, body) = req.into_parts();
    if parts.uri.authority().is_none() {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = format!("https://localhost:{}{path}", addr.port())
            .parse()
            .unwrap();
    }
    let mut stream = sender.send_request(Request::from_parts(parts, ())).await?;
    if !body.is_empty() {
        stream.send_data(body).await?;
    }
    stream.finish().await?;
    let response = stream.recv_response().await?;
    let mut body = BytesMut::new();
    while let Some(mut chunk) = stream.recv_data().await? {
        let bytes = chunk.copy_to_bytes(chunk.remaining());
        body.extend_from_slice(&bytes);
    }
    let trailers = stream.recv_trailers().await?;
    Ok(H3Answer {
        response,
        body: body.freeze(),
        trailers,
    })
}
