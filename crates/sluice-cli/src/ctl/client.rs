//! One request to the admin API: plain HTTP/1.1 over a fresh TCP connection, within a
//! deadline, with errors that say what to do about them.

use std::fmt::{self, Write as _};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
pub(crate) use http::Method;
use http::{header, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// The environment variable with the bearer token (never a flag: argv shows in `ps`).
pub(crate) const TOKEN_ENV: &str = "SLUICE_ADMIN_TOKEN";
/// How long one request may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A validated `--admin` URL: `http://host:port`, maybe with a path prefix.
#[derive(Debug, Clone)]
pub(crate) struct AdminUrl {
    authority: http::uri::Authority,
    /// What comes before the API's own paths, without a trailing slash; usually empty.
    prefix: String,
}

impl AdminUrl {
    /// Parses `--admin`; a missing scheme means http, https is refused (the API is plain HTTP).
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let uri: Uri = s.parse().map_err(|e| format!("not a URL ({e})"))?;
        match uri.scheme_str() {
            Some("http") | None => {}
            Some("https") => {
                return Err("the admin API speaks plain HTTP, not https: use http:// \
                            (for a remote Sluice, through an SSH tunnel)"
                    .into())
            }
            Some(other) => return Err(format!("unsupported scheme `{other}`: use http://")),
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or("no host:port in it, e.g. http://127.0.0.1:9901")?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "credentials in the URL are not sent: set {TOKEN_ENV}"
            ));
        }
        if uri.query().is_some() {
            return Err("a query string has no place in the admin URL".into());
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(Self { authority, prefix })
    }

    /// The host to connect to, without an IPv6 literal's brackets, and the port (default 80).
    fn host_port(&self) -> (&str, u16) {
        let host = self.authority.host();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        (host, self.authority.port_u16().unwrap_or(80))
    }
}

impl fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.prefix)
    }
}

/// Percent-encodes `s` for use as one path segment (a cluster name, an `[::1]:80` address).
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b.is_ascii_alphanumeric() || b"-._~:@".contains(&b) {
            true => out.push(char::from(b)),
            false => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// Sends requests to one admin API, with the bearer token when there is one.
pub(crate) struct Client {
    url: AdminUrl,
    token: Option<String>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Client {
    /// A client of the admin API at `url`; `token`, if any, goes in every request.
    pub(crate) fn new(url: AdminUrl, token: Option<String>) -> Self {
        Self { url, token }
    }

    /// The admin API's base URL.
    pub(crate) fn url(&self) -> &AdminUrl {
        &self.url
    }

    /// Sends `method path` (with `body` as JSON) and returns the 2xx reply's JSON; any other
    /// status, a transport failure or [`TIMEOUT`] is an error meant for the operator.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let request = self.request(method, path, body)?;
        let Ok(exchanged) = tokio::time::timeout(TIMEOUT, self.exchange(request)).await else {
            bail!(
                "the admin API at {} did not answer within {TIMEOUT:?}",
                self.url
            );
        };
        let (status, body) = exchanged?;
        self.reply(status, &body)
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Request<Full<Bytes>>> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url.prefix))
            .header(header::HOST, self.url.authority.as_str())
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("sluice-ctl/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(token) = &self.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| anyhow!("{TOKEN_ENV} holds characters a header cannot carry"))?;
            value.set_sensitive(true);
            builder = builder.header(header::AUTHORIZATION, value);
        }
        let body = match body {
            Some(json) => {
                builder = builder.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(&json)?)
            }
            None => Bytes::new(),
        };
        builder
            .body(Full::new(body))
            .with_context(|| format!("building the request to {}", self.url))
    }

    /// Connects, sends `request` and reads the whole response.
    async fn exchange(&self, request: Request<Full<Bytes>>) -> anyhow::Result<(StatusCode, Bytes)> {
        let stream = self.connect().await?;
        let broke_off = || format!("the admin API at {} broke off the exchange", self.url);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(broke_off)?;
        // Its errors also fail `send_request` or the body, where they are reported.
        tokio::spawn(conn);
        let response = sender.send_request(request).await.with_context(broke_off)?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .with_context(broke_off)?;
        Ok((status, body.to_bytes()))
    }

    async fn connect(&self) -> anyhow::Result<TcpStream> {
        TcpStream::connect(self.url.host_port()).await.map_err(|e| {
            anyhow!(
                "cannot reach the admin API at {}: {} (is sluice running with [admin] listen = \"{}\"? \
                 if it listens elsewhere, set --admin or SLUICE_ADMIN)",
                self.url,
                io_reason(&e),
                self.url.authority
            )
        })
    }

    /// The JSON of a 2xx reply, or the error an operator should see.
    fn reply(&self, status: StatusCode, body: &[u8]) -> anyhow::Result<Value> {
        if status == StatusCode::UNAUTHORIZED {
            return Err(self.unauthorized(body));
        }
        if !status.is_success() {
            bail!("the admin API answered {status}{}", error_text(body));
        }
        serde_json::from_slice(body).map_err(|e| {
            anyhow!(
                "the admin API at {} answered {status} with something that is not JSON ({e})",
                self.url
            )
        })
    }

    fn unauthorized(&self, body: &[u8]) -> anyhow::Error {
        match self.token {
            None => anyhow!(
                "the admin API at {} wants a bearer token: set {TOKEN_ENV}",
                self.url
            ),
            Some(_) => anyhow!(
                "the admin API at {} refused the bearer token{}: set {TOKEN_ENV} to that Sluice's [admin] token",
                self.url,
                error_text(body)
            ),
        }
    }
}

/// `: <reason>` from an error reply (`{"error": ...}`, else its text), or nothing if empty.
fn error_text(body: &[u8]) -> String {
    const MAX: usize = 200;
    let reason = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) if o.get("error").is_some_and(Value::is_string) => {
            o["error"].as_str().unwrap_or_default().to_owned()
        }
        _ => String::from_utf8_lossy(body)
            .trim()
            .chars()
            .take(MAX)
            .collect(),
    };
    match reason.is_empty() {
        true => String::new(),
        false => format!(": {reason}"),
    }
}

/// "connection refused" rather than "Connection refused (os error 111)".
fn io_reason(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(_) => e.kind().to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn admin_url_takes_http_a_bare_authority_and_a_prefix() {
        let url = AdminUrl::parse("http://127.0.0.1:9901/").unwrap();
        assert_eq!(url.to_string(), "http://127.0.0.1:9901");
        assert_eq!(url.host_port(), ("127.0.0.1", 9901));
        let url = AdminUrl::parse("[::1]:9901").unwrap();
        assert_eq!(url.host_port(), ("::1", 9901));
        let url = AdminUrl::parse("http://admin.local/sluice/").unwrap();
        assert_eq!(url.to_string(), "http://admin.local/sluice");
        assert_eq!(url.host_port(), ("admin.local", 80));
    }

    #[test]
    fn admin_url_refuses_https_and_credentials() {
        assert!(AdminUrl::parse("https://127.0.0.1:9901")
            .unwrap_err()
            .contains("plain HTTP"));
        assert!(AdminUrl::parse("http://me:secret@127.0.0.1:9901")
            .unwrap_err()
            .contains(TOKEN_ENV));
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("127.0.0.1:9003"), "127.0.0.1:9003");
        assert_eq!(segment("[::1]:9003"), "%5B::1%5D:9003");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn error_text_prefers_the_error_field() {
        assert_eq!(
            error_text(br#"{"error": "no such cluster"}"#),
            ": no such cluster"
        );
        assert_eq!(error_text(b"plain text\n"), ": plain text");
        assert_eq!(error_text(b""), "");
    }
}
