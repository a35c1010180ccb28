//! The fast path's HTTP/1 response parser (`sluice_wire::h1::parse_response`) against hyper's
//! client, which the proxy uses today. The first byte picks the request (`HEAD` when odd, else
//! `GET`); the rest is what the upstream answers before closing. Then:
//!
//! * the fast path refuses the response exactly when hyper's client fails on its head (or
//!   hyper reports a protocol switch, which the proxy refuses);
//! * for a response it forwards, hyper read the same status and the same fields;
//! * when the fast path read the body whole, hyper read the same body; when the fast path's
//!   chunked decoder refused it, hyper's failed too.
#![no_main]

#[path = "common.rs"]
mod common;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use sluice_wire::h1::{self, ParsedResponse, ResponseBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// hyper's client buffer limit in Sluice, which bounds a response head.
const MAX_HEAD: usize = 64 * 1024;

/// What hyper's client made of the answer.
#[derive(Debug)]
enum Hyper {
    /// It failed before a response head.
    Failed,
    /// A response: status, fields (sorted by name), body (`None` when reading it failed).
    Response(u16, Vec<(String, Vec<u8>)>, Option<Vec<u8>>),
}

async fn hyper_reads(method: &str, answer: &[u8]) -> Hyper {
    let (client, mut server) = tokio::io::duplex(128 * 1024);
    let answer = answer.to_vec();
    let upstream = tokio::spawn(async move {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && server.read(&mut byte).await.is_ok_and(|n| n == 1) {
            head.push(byte[0]);
        }
        let _ = server.write_all(&answer).await;
        let _ = server.shutdown().await;
    });
    let Ok((mut sender, conn)) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(client))
        .await
    else {
        return Hyper::Failed;
    };
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri("/")
        .header("host", "a")
        .body(Empty::new())
        .expect("a request");
    let result = match sender.send_request(req).await {
        Err(_) => Hyper::Failed,
        Ok(res) => {
            let mut fields: Vec<(String, Vec<u8>)> = res
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect();
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            let status = res.status().as_u16();
            let body = res.into_body().collect().await.ok();
            Hyper::Response(status, fields, body.map(|b| b.to_bytes().to_vec()))
        }
    };
    let _ = upstream.await;
    result
}

/// The body by the fast path's framing: `Some(Ok)` whole, `Some(Err)` refused, `None` when the
/// data ends first.
fn body(rest: &[u8], framing: ResponseBody) -> Option<Result<Vec<u8>, ()>> {
    match framing {
        ResponseBody::None => Some(Ok(Vec::new())),
        ResponseBody::UntilClose => Some(Ok(rest.to_vec())),
        ResponseBody::Length(n) => rest.get(..usize::try_from(n).ok()?).map(|b| Ok(b.to_vec())),
        ResponseBody::Chunked => common::dechunk(rest, MAX_HEAD),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, answer)) = data.split_first() else {
        return;
    };
    let head_request = pick % 2 == 1;
    let method = if head_request { "HEAD" } else { "GET" };
    let hyper = common::runtime().block_on(hyper_reads(method, answer));
    match (h1::parse_response(answer, head_request, MAX_HEAD), hyper) {
        (ParsedResponse::Partial, _) => {}
        (ParsedResponse::Invalid(_), Hyper::Failed) => {}
        (ParsedResponse::Invalid(_), Hyper::Response(101, _, _)) => {}
        (ParsedResponse::Invalid(why), Hyper::Response(status, ..)) => {
            panic!("refused ({why}) a response hyper read: {status}")
        }
        (ParsedResponse::Head(head), Hyper::Failed) => {
            panic!("forwards a response hyper failed on: {head:?}")
        }
        (ParsedResponse::Head(head), Hyper::Response(status, hyper_fields, hyper_body)) => {
            assert_eq!(head.status, status);
            assert_eq!(common::fields(answer, &head.fields), hyper_fields);
            match body(&answer[head.len..], head.body) {
                Some(Ok(bytes)) => assert_eq!(hyper_body, Some(bytes)),
                Some(Err(())) => assert_eq!(hyper_body, None),
                None => {}
            }
        }
    }
});
