//! The backend's gRPC mode (`bench-backend --grpc`): cleartext HTTP/2 with prior knowledge,
//! where every call is answered with `content-type: application/grpc`, gRPC-framed messages
//! and the trailers `grpc-status: 0`. A method named `Stream` (any service) is
//! server-streaming: [`STREAM_MESSAGES`] messages, each its own DATA frame; any other is unary,
//! one message. The request's messages are read and dropped. Requests and connections are
//! counted as in HTTP/1.1 mode, so the harness computes CPU per call the same way. Dialing in,
//! the SDK serves [`call`] on HTTP/2 sessions instead of [`serve`]'s listener.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use super::Counters;

/// The messages a server-streaming call (a method named `Stream`) answers with.
pub const STREAM_MESSAGES: usize = 10;

/// One gRPC message: the 5-byte prefix (not compressed, big-endian length) and `payload`.
pub fn message(payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(0);
    // The payload is the backend's body, at most 64 MiB: it fits the prefix's u32.
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

/// Serves gRPC over cleartext HTTP/2 on every connection `listener` accepts, answering each
/// call with `reply` (a whole gRPC message, see [`message`]) and counting connections and
/// calls in `counters`; runs until dropped. Accept errors are reported and retried.
pub async fn serve(listener: TcpListener, counters: Arc<Counters>, reply: Bytes) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                eprintln!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        counters.accepted();
        let _ = stream.set_nodelay(true);
        let (counters, reply) = (counters.clone(), reply.clone());
        let svc = hyper::service::service_fn(move |req| call(counters.clone(), reply.clone(), req));
        tokio::spawn(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc),
        );
    }
}

/// One call: drains the request's messages, then answers `reply` once (unary) or
/// [`STREAM_MESSAGES`] times (`Stream`), and `grpc-status: 0`.
pub async fn call(
    counters: Arc<Counters>,
    reply: Bytes,
    req: Request<Incoming>,
) -> Result<Response<Messages>, Infallible> {
    let _in_flight = counters.start();
    let streaming = req.uri().path().ends_with("/Stream");
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    let count = if streaming { STREAM_MESSAGES } else { 1 };
    let mut res = Response::new(Messages { reply, left: count });
    let grpc = HeaderValue::from_static("application/grpc");
    res.headers_mut().insert(header::CONTENT_TYPE, grpc);
    Ok(res)
}

/// A response body of `left` copies of one message, each its own frame, then the trailers.
#[derive(Debug)]
pub struct Messages {
    reply: Bytes,
    left: usize,
}

impl Body for Messages {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(match self.left {
            usize::MAX => None,
            0 => {
                self.left = usize::MAX;
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                Some(Ok(Frame::trailers(trailers)))
            }
            _ => {
                self.left -= 1;
                Some(Ok(Frame::data(self.reply.clone())))
            }
        })
    }

    fn is_end_stream(&self) -> bool {
        self.left == usize::MAX
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use http_body_util::Full;

    /// Calls `path` with one message over a new HTTP/2 connection; returns the response's
    /// content type, its data and its trailers.
    async fn grpc_call(addr: std::net::SocketAddr, path: &str) -> (String, Bytes, HeaderMap) {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(message(b"ping")))
            .unwrap();
        let res = send.send_request(req).await.unwrap();
        let kind = res.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        let collected = res.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap_or_default();
        (kind, collected.to_bytes(), trailers)
    }

    #[tokio::test]
    async fn unary_calls_get_one_message_and_streams_ten_each_with_status_0() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        tokio::spawn(serve(listener, counters.clone(), message(b"pong")));

        let (kind, data, trailers) = grpc_call(addr, "/bench.Bench/Unary").await;
        assert_eq!(kind, "application/grpc");
        assert_eq!(data, message(b"pong"));
        assert_eq!(trailers["grpc-status"], "0");

        let (_, data, trailers) = grpc_call(addr, "/bench.Bench/Stream").await;
        assert_eq!(data, message(b"pong").repeat(STREAM_MESSAGES));
        assert_eq!(trailers["grpc-status"], "0");

        let stats = counters.snapshot();
        assert_eq!((stats.requests, stats.connections), (2, 2));
    }
}
