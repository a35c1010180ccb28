//! The fast path's HTTP/1 request parser (`sluice_wire::h1`) against hyper itself. When the
//! fast path takes the first request of a byte stream:
//!
//! * hyper served that request, with the same method, target and fields (each name's values in
//!   the same order), and the request is one Sluice's normalisation leaves as it is;
//! * when the fast path read its body whole, hyper read the same body; when the fast path's
//!   chunked decoder refused it, hyper's refused it too (and the other way round);
//! * the head the fast path writes upstream parses, carries no hop-by-hop field, and frames
//!   the body as the request did.
#![no_main]

#[path = "common.rs"]
mod common;

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use sluice_wire::h1::{self, BodyFraming, ClientIp, Forward, Parsed, RequestHead};
use sluice_wire::RequestRules;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The head limit both get (Sluice configures hyper and the fast path alike).
const MAX_HEAD: usize = 4096;

/// What hyper made of the first request it served.
#[derive(Debug, Clone)]
struct Served {
    method: String,
    target: String,
    fields: Vec<(String, Vec<u8>)>,
    /// The body, or `None` when reading it failed.
    body: Option<Vec<u8>>,
}

/// Serves `data` with hyper on an in-memory connection; the first request it served.
async fn hyper_serves(data: &[u8]) -> Option<Served> {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let first = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&first);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let seen = Arc::clone(&seen);
        async move {
            let mut fields: Vec<(String, Vec<u8>)> = req
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect();
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            let method = req.method().as_str().to_owned();
            let target = req.uri().to_string();
            let body = req.into_body().collect().await.ok();
            let served = Served {
                method,
                target,
                fields,
                body: body.map(|b| b.to_bytes().to_vec()),
            };
            seen.lock().expect("not poisoned").get_or_insert(served);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Half-close: the client's end of input must not cut a request short.
    builder
        .max_header_size(MAX_HEAD)
        .max_buf_size(64 * 1024)
        .half_close(true);
    let conn = builder.serve_connection(TokioIo::new(server), svc);
    let input = data.to_vec();
    let talk = async move {
        let _ = client.write_all(&input).await;
        let _ = client.shutdown().await;
        let _ = client.read_to_end(&mut Vec::new()).await;
    };
    let _ = tokio::join!(conn, talk);
    let first = first.lock().expect("not poisoned").take();
    first
}

/// The body after the head by the fast path's framing: `Some(Ok)` read whole, `Some(Err)`
/// refused, `None` when the data ends first.
fn body(rest: &[u8], framing: BodyFraming) -> Option<Result<Vec<u8>, ()>> {
    match framing {
        BodyFraming::None => Some(Ok(Vec::new())),
        BodyFraming::Length(n) => {
            let n = usize::try_from(n).ok()?;
            rest.get(..n).map(|b| Ok(b.to_vec()))
        }
        BodyFraming::Chunked => common::dechunk(rest, MAX_HEAD),
    }
}

/// The upstream head parses, has no hop-by-hop field, and frames the body as the request.
fn check_written(data: &[u8], head: &RequestHead) {
    let client = ClientIp::new(IpAddr::from([192, 0, 2, 1]));
    let fwd = Forward {
        target: None,
        client: &client,
        tls: false,
        trusted: true,
        remove: &[],
        set: &[],
        stamps: &[("sluice-client-addr", b"192.0.2.1:40000")],
    };
    let mut out = Vec::new();
    h1::write_head(data, head, &fwd, &mut out);
    let mut storage = [httparse::EMPTY_HEADER; h1::MAX_HEADERS + 8];
    let mut req = httparse::Request::new(&mut storage);
    let parsed = req.parse(&out).expect("the written head parses");
    assert_eq!(parsed, httparse::Status::Complete(out.len()));
    let has = |n: &str| req.headers.iter().any(|h| h.name.eq_ignore_ascii_case(n));
    for hop in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
    ] {
        assert!(
            !has(hop),
            "{hop} forwarded: {:?}",
            String::from_utf8_lossy(&out)
        );
    }
    assert_eq!(has("transfer-encoding"), head.body == BodyFraming::Chunked);
    if let BodyFraming::Length(n) = head.body {
        let length = req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"));
        let length = length.and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok());
        assert_eq!(length, Some(n));
    }
}

fuzz_target!(|data: &[u8]| {
    let Parsed::Take(head) = h1::parse_request(data, MAX_HEAD, RequestRules::default()) else {
        return;
    };
    let served = common::runtime().block_on(hyper_serves(data));
    let served = served.expect("hyper serves what the fast path takes");
    assert_eq!(served.method.as_bytes(), head.method(data));
    assert_eq!(served.target.as_bytes(), head.target(data));
    assert_eq!(served.fields, common::fields(data, &head.fields));
    check_written(data, &head);
    let mut req = Request::builder()
        .method(served.method.as_str())
        .uri(served.target.as_str())
        .body(())
        .expect("hyper's own parts");
    for (name, value) in &served.fields {
        let value = http::HeaderValue::from_bytes(value).expect("hyper's own value");
        let name = http::HeaderName::from_bytes(name.as_bytes()).expect("hyper's own name");
        req.headers_mut().append(name, value);
    }
    // Fields named with `_` are the forwarding's to drop; here they are left alone.
    let rules = RequestRules {
        underscores_in_headers: sluice_wire::Underscores::Allow,
        ..RequestRules::default()
    };
    let before = (req.uri().clone(), req.headers().clone());
    sluice_wire::normalize::normalize_request(&mut req, rules)
        .expect("the fast path takes only what normalisation accepts");
    assert_eq!(before, (req.uri().clone(), req.headers().clone()));
    match body(&data[head.len..], head.body) {
        Some(Ok(bytes)) => assert_eq!(served.body, Some(bytes)),
        Some(Err(())) => assert_eq!(served.body, None),
        None => {}
    }
});
