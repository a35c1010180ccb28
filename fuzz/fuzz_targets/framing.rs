//! The HTTP/1 framing scanner against hyper itself. Sluice's server runs every byte hyper reads
//! from a client through `sluice_wire::framing::Scanner`, which must find the request that
//! carried both `Content-Length` and `Transfer-Encoding` (hyper drops the former silently and
//! closes after the response). So on the same bytes:
//!
//! * a request the scanner flags is one hyper served with `Transfer-Encoding` and without
//!   `Content-Length`, and the last hyper served;
//! * a request hyper served with `Transfer-Encoding`, then closed after although the request
//!   did not ask for that, is the one the scanner flags (unless the scan stopped: input
//!   hyper refuses);
//! * when hyper served every request it answered, read every body whole and kept the
//!   connection open, the scanner counted as many heads.
#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http::{header, Request, Response, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use sluice_wire::framing::Scanner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The head limit both get (Sluice configures hyper and the scanner alike).
const MAX_HEAD: usize = 4096;

/// What hyper made of one request it handed to the service.
#[derive(Debug, Clone)]
struct Served {
    transfer_encoding: bool,
    content_length: bool,
    asks_close: bool,
    /// Whether its body was read to the end without error (a body error ends the
    /// connection for hyper, while the scanner may read on).
    body_ok: bool,
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

/// Serves `data` with hyper on an in-memory connection: the requests it served, whether the
/// connection ended without error, and the response heads it wrote (in order).
async fn hyper_serves(data: &[u8]) -> (Vec<Served>, bool, Vec<String>) {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let served = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&served);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let seen = Arc::clone(&seen);
        async move {
            let h = req.headers();
            // Anything that could make hyper close for its own reasons counts as asking.
            let asks_close = req.version() != Version::HTTP_11
                || h.contains_key(header::UPGRADE)
                || h.get_all(header::CONNECTION).iter().any(|v| {
                    v.to_str().map_or(true, |v| {
                        let v = v.to_ascii_lowercase();
                        v.contains("close") || v.contains("upgrade")
                    })
                });
            let (transfer_encoding, content_length) = (
                h.contains_key(header::TRANSFER_ENCODING),
                h.contains_key(header::CONTENT_LENGTH),
            );
            let body_ok = req.into_body().collect().await.is_ok();
            let entry = Served {
                transfer_encoding,
                content_length,
                asks_close,
                body_ok,
            };
            seen.lock().expect("not poisoned").push(entry);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.max_header_size(MAX_HEAD).max_buf_size(64 * 1024);
    let conn = builder.serve_connection(TokioIo::new(server), svc);
    let input = data.to_vec();
    let talk = async move {
        let _ = client.write_all(&input).await;
        let _ = client.shutdown().await;
        let mut out = Vec::new();
        let _ = client.read_to_end(&mut out).await;
        out
    };
    let (result, out) = tokio::join!(conn, talk);
    let text = String::from_utf8_lossy(&out);
    let heads = text
        .split("\r\n\r\n")
        .filter(|h| h.starts_with("HTTP/1.1 ") && !h.starts_with("HTTP/1.1 100 "))
        .map(str::to_ascii_lowercase)
        .collect();
    let served = served.lock().expect("not poisoned").clone();
    (served, result.is_ok(), heads)
}

fuzz_target!(|data: &[u8]| {
    let (served, clean, heads) = runtime().block_on(hyper_serves(data));
    let mut scanner = Scanner::new(MAX_HEAD);
    scanner.feed(data);

    if let Some(k) = scanner.first_ambiguous() {
        let k = usize::try_from(k).expect("small");
        if let Some(req) = served.get(k) {
            assert!(req.transfer_encoding && !req.content_length, "{k}: {req:?}");
            assert_eq!(k + 1, served.len(), "hyper served past request {k}");
        }
    }
    if scanner.is_off() {
        return;
    }
    for (k, req) in served.iter().enumerate() {
        let closed_after = heads
            .get(k)
            .is_some_and(|h| h.contains("\r\nconnection: close"));
        let unasked_close = closed_after && !req.asks_close && k + 1 == served.len();
        if clean && req.body_ok && req.transfer_encoding && unasked_close {
            assert_eq!(scanner.first_ambiguous(), Some(k as u64), "{served:?}");
        }
    }
    // hyper answered only what it served (a refused head gets an answer of its own), and
    // kept the connection open throughout.
    let kept_open =
        heads.len() == served.len() && !heads.iter().any(|h| h.contains("\r\nconnection: close"));
    if clean && kept_open && served.iter().all(|r| !r.asks_close && r.body_ok) {
        assert_eq!(scanner.heads(), served.len() as u64, "{served:?}");
    }
});
