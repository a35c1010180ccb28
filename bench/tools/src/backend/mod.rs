//! The benchmark backend: answers every request with `200 text/plain` and a body of a chosen
//! size after a chosen delay, counting what it handles ([`stats`]); or, in [`grpc`] mode,
//! gRPC calls over cleartext HTTP/2. The body repeats one line,
//! or with `?text=1` is varied JSON lines that compress as an API's answers do. `?max_age=N`
//! adds `Cache-Control: public, max-age=N` and `?no_store=1` `Cache-Control: no-store` (the
//! cache scenario's cacheable and uncacheable answers).
//!
//! Every benchmark target (Sluice dial-in, Sluice static, nginx, …) reaches the same
//! [`Backend`], so differences between targets come from the proxies alone.

pub mod grpc;
pub mod stats;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Body;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};

pub use stats::Counters;

/// The largest body a request may ask for with `?bytes=N`; larger values are capped.
pub const MAX_BODY: usize = 64 << 20;

/// The listen backlog [`bind`] asks for.
const BACKLOG: u32 = 4096;

/// What the body is made of, repeated: the default 13 bytes are exactly one line.
const PATTERN: &[u8] = b"hello, world\n";

/// How the backend answers, before per-request overrides.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Sleep this long before answering each request (override per request: `?delay_ms=N`).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub delay_ms: u64,
    /// Answer bodies of this many bytes (override per request: `?bytes=N`, capped at 64 MiB).
    #[arg(long, value_name = "B", default_value_t = 13,
          value_parser = clap::value_parser!(u64).range(..=MAX_BODY as u64))]
    pub body_bytes: u64,
}

/// The request handler, shared by every connection and session.
#[derive(Debug)]
pub struct Backend {
    delay: Duration,
    /// The default body, built once and cloned (a reference count) per response.
    body: Bytes,
    /// The largest body built for a `?bytes=N` so far; smaller ones are slices of it.
    large: Mutex<Bytes>,
    /// The same for `?text=1` bodies.
    large_text: Mutex<Bytes>,
    counters: Arc<Counters>,
}

impl Backend {
    /// A backend answering as `config` says, counting into `counters`.
    pub fn new(config: &Config, counters: Arc<Counters>) -> Self {
        // Bounded by the flag's parser; `usize` holds 64 MiB on every supported target.
        let body = pattern(usize::try_from(config.body_bytes).unwrap_or(MAX_BODY));
        Self {
            delay: Duration::from_millis(config.delay_ms),
            large: Mutex::new(body.clone()),
            large_text: Mutex::new(Bytes::new()),
            body,
            counters,
        }
    }

    /// The default body as one gRPC message: what the [`grpc`] mode answers with.
    pub fn grpc_reply(&self) -> Bytes {
        grpc::message(&self.body)
    }

    /// Handles one request: reads and discards its body, waits the delay, answers `200` with
    /// the body (or `400` when the query's `bytes` or `delay_ms` is not a number).
    pub async fn handle<B: Body>(
        self: Arc<Self>,
        req: Request<B>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let _in_flight = self.counters.start();
        let (bytes, delay) = match self.overrides(req.uri().query()) {
            Ok(params) => params,
            Err(msg) => return Ok(text(StatusCode::BAD_REQUEST, Bytes::from(msg))),
        };
        let req_query = req.uri().query().map(str::to_owned);
        let mut body = std::pin::pin!(req.into_body());
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let body = if wants_text(req_query.as_deref()) {
            self.text_body(bytes)
        } else {
            self.body(bytes)
        };
        let mut res = text(StatusCode::OK, body);
        if let Some(cc) = cache_control(req_query.as_deref()) {
            res.headers_mut().insert(header::CACHE_CONTROL, cc);
        }
        Ok(res)
    }

    /// The body size and delay for a request, from its query or the defaults.
    fn overrides(&self, query: Option<&str>) -> Result<(usize, Duration), String> {
        let (mut bytes, mut delay) = (self.body.len(), self.delay);
        for pair in query.unwrap_or_default().split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{key}={value:?} is not a number\n"))
            };
            match key {
                "bytes" => bytes = usize::try_from(number()?).map_or(MAX_BODY, |n| n.min(MAX_BODY)),
                "delay_ms" => delay = Duration::from_millis(number()?),
                _ => {}
            }
        }
        Ok((bytes, delay))
    }

    fn body(&self, len: usize) -> Bytes {
        if len == self.body.len() {
            return self.body.clone();
        }
        let mut large = self.large.lock().unwrap_or_else(PoisonError::into_inner);
        if large.len() < len {
            *large = pattern(len);
        }
        large.slice(..len)
    }

    /// A `?text=1` body of `len` bytes: a slice of the largest built so far.
    fn text_body(&self, len: usize) -> Bytes {
        let mut large = self
            .large_text
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if large.len() < len {
            *large = json_lines(len);
        }
        large.slice(..len)
    }
}

/// The `Cache-Control` the query asks for: `max_age=N` (digits only) or `no_store=1`.
fn cache_control(query: Option<&str>) -> Option<HeaderValue> {
    let mut pairs = query.unwrap_or_default().split('&');
    pairs.find_map(|pair| match pair.split_once('=')? {
        ("no_store", "1") => Some(HeaderValue::from_static("no-store")),
        ("max_age", n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            HeaderValue::from_str(&format!("public, max-age={n}")).ok()
        }
        _ => None,
    })
}

/// Whether the query asks for a compressible text body (`text=1`).
fn wants_text(query: Option<&str>) -> bool {
    query.unwrap_or_default().split('&').any(|p| p == "text=1")
}

/// `len` bytes of JSON lines with varied numbers and names (the same for every run): gzip
/// at level 1 shrinks them some 3-4 times, as it does an API's answers, where the repeated
/// pattern shrinks a thousandfold and would flatter any compressor.
fn json_lines(len: usize) -> Bytes {
    use std::fmt::Write;
    const WORDS: [&str; 8] = [
        "red", "blue", "sale", "new", "kids", "home", "garden", "tools",
    ];
    let mut out = String::with_capacity(len + 160);
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut id = 0u64;
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let word = |shift: u32| WORDS[((seed >> shift) % 8) as usize];
        let _ = writeln!(
            out,
            r#"{{"id":{id},"name":"item-{:x}","price":{}.{:02},"stock":{},"tags":["{}","{}"]}}"#,
            seed >> 40,
            seed % 1000,
            (seed >> 10) % 100,
            (seed >> 20) % 500,
            word(30),
            word(50),
        );
        id += 1;
    }
    out.truncate(len);
    Bytes::from(out)
}

fn pattern(len: usize) -> Bytes {
    PATTERN.iter().copied().cycle().take(len).collect()
}

fn text(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(body));
    *res.status_mut() = status;
    let plain = HeaderValue::from_static("text/plain");
    res.headers_mut().insert(header::CONTENT_TYPE, plain);
    res
}

/// Listens on `addr` (`host:port`, the first address it resolves to) with a backlog of 4096
/// (the kernel caps it at `net.core.somaxconn`) rather than Tokio's 1024, so that a burst of
/// new connections from a load generator or proxy is not met with dropped SYNs and
/// one-second retransmits.
pub async fn bind(addr: &str) -> io::Result<TcpListener> {
    let mut addrs = tokio::net::lookup_host(addr).await?;
    let addr = addrs
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{addr} has no address")))?;
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Serves HTTP/1.1 keep-alive with `TCP_NODELAY` on every connection `listener` accepts,
/// counting each in `accepted` if given; runs until dropped. Accept errors (such as running out of descriptors) are reported on
/// stderr and retried after a pause, never fatal.
pub async fn serve<F, Fut>(listener: TcpListener, accepted: Option<Arc<Counters>>, handler: F)
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                eprintln!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Some(counters) = &accepted {
            counters.accepted();
        }
        // Small answers must leave at once, not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let svc = hyper::service::service_fn(handler.clone());
        tokio::spawn(
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(body_bytes: u64) -> Backend {
        let config = Config {
            delay_ms: 5,
            body_bytes,
        };
        Backend::new(&config, Arc::default())
    }

    #[test]
    fn the_query_overrides_size_and_delay_and_rejects_garbage() {
        let b = backend(13);
        assert_eq!(b.overrides(None), Ok((13, Duration::from_millis(5))));
        let both = b.overrides(Some("x=1&bytes=7&delay_ms=0"));
        assert_eq!(both, Ok((7, Duration::ZERO)));
        let huge = b.overrides(Some("bytes=99999999999"));
        assert_eq!(huge, Ok((MAX_BODY, Duration::from_millis(5))));
        assert!(b.overrides(Some("bytes=ten")).is_err());
        assert!(b.overrides(Some("delay_ms=-1")).is_err());
    }

    #[test]
    fn text_bodies_are_varied_json_lines_of_the_asked_length() {
        let b = backend(13);
        assert!(wants_text(Some("bytes=10&text=1")));
        assert!(!wants_text(Some("text=0")));
        let body = b.text_body(10_000);
        assert_eq!(body.len(), 10_000);
        assert!(body.starts_with(b"{\"id\":0,\"name\":\"item-"));
        assert_eq!(b.text_body(100), body.slice(..100));
    }

    #[test]
    fn the_query_asks_for_a_cache_control() {
        let cc = |q| cache_control(Some(q)).map(|v| v.to_str().unwrap_or("?").to_owned());
        assert_eq!(cc("k=3&max_age=60").as_deref(), Some("public, max-age=60"));
        assert_eq!(cc("no_store=1").as_deref(), Some("no-store"));
        assert_eq!(cc("max_age=-1"), None);
        assert_eq!(cc("max_age="), None);
        assert_eq!(cache_control(None), None);
    }

    #[test]
    fn bodies_have_the_asked_length_and_share_one_buffer() {
        let b = backend(13);
        assert_eq!(b.body(13), Bytes::from_static(b"hello, world\n"));
        assert_eq!(b.body(0).len(), 0);
        let big = b.body(100_000);
        assert_eq!(big.len(), 100_000);
        let small = b.body(20);
        assert_eq!(&small[..], &big[..20], "a slice of the largest body so far");
        assert_eq!(small.as_ptr(), big.as_ptr());
    }
}
