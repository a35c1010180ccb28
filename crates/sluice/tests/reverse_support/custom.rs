//! Services with a handler of the test's own: hyper with a streamed body ([`Frames`]), or raw
//! bytes written on the session (for framing hyper's server will not produce, like trailers
//! the proxy did not ask for).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::service::{dial, ServiceSpec};

/// A body of unknown length (sent chunked) that yields its frames one poll at a time, giving
/// way to the runtime between them, so each goes out as its own chunk.
#[derive(Debug, Default)]
pub struct Frames {
    frames: VecDeque<Frame<Bytes>>,
    yielded: bool,
}

impl Frames {
    /// These chunks, then `trailers` if any.
    pub fn new(chunks: impl IntoIterator<Item = Bytes>, trailers: Option<HeaderMap>) -> Self {
        let mut frames: VecDeque<_> = chunks.into_iter().map(Frame::data).collect();
        frames.extend(trailers.map(Frame::trailers));
        Self {
            frames,
            yielded: false,
        }
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if !self.yielded && !self.frames.is_empty() {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.yielded = false;
        Poll::Ready(self.frames.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::new()
    }
}

/// `n` chunks of `size` bytes, chunk `i` filled with `b'a' + i % 26`.
pub fn lettered(n: usize, size: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; size]))
        .collect()
}

/// Registers `spec.sessions` sessions and serves each with hyper and `handler`.
pub async fn serve_fn<F, Fut, B>(
    acceptor: SocketAddr,
    spec: &ServiceSpec,
    handler: F,
) -> Vec<JoinHandle<()>>
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, std::io::Error>> + Send + 'static,
    B: Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    let handler = Arc::new(handler);
    let mut tasks = Vec::new();
    for _ in 0..spec.sessions {
        let (stream, status) = dial(acceptor, &spec.registration()).await;
        assert_eq!(status, 101, "registration refused");
        let handler = Arc::clone(&handler);
        tasks.push(tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handler(req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        }));
    }
    tasks
}

/// Registers `spec.sessions` sessions; on each, answers every request (a head without a
/// body) with exactly `response`.
pub async fn serve_raw(
    acceptor: SocketAddr,
    spec: &ServiceSpec,
    response: &'static [u8],
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for _ in 0..spec.sessions {
        let (stream, status) = dial(acceptor, &spec.registration()).await;
        assert_eq!(status, 101, "registration refused");
        tasks.push(tokio::spawn(answer_raw(stream, response)));
    }
    tasks
}

async fn answer_raw(mut stream: TcpStream, response: &'static [u8]) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            if stream.write_all(response).await.is_err() {
                return;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A response as a hyper client saw it, trailers included.
#[derive(Debug)]
pub struct FullReply {
    pub status: http::StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

/// Sends `req` on a fresh connection and reads the whole response.
pub async fn send_req(addr: SocketAddr, req: Request<Frames>) -> FullReply {
    use http_body_util::BodyExt;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let res = sender.send_request(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    FullReply {
        status: parts.status,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    }
}

/// A chunked body whose chunks the test sends while the response is under way; it ends when
/// the sender is dropped.
#[derive(Debug)]
pub struct Channel(pub tokio::sync::mpsc::Receiver<Bytes>);

impl Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}
