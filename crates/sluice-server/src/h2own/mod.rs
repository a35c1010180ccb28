//! Sluice's own HTTP/2 server transport (`own_http2`): one task per connection, no task per
//! stream. Frames and HPACK come from `sluice-h2`; each request goes to the proxy's one
//! pipeline ([`Pipeline`], the same `ProxyService::handle` every transport calls) as an
//! `http::Request` whose body is fed by the connection; each answer's head is encoded straight
//! into the connection's write buffer and its body pulled only as the client's window allows,
//! so a slow reader holds one chunk per stream and back-pressures the upstream.
//!
//! What a connection keeps while idle: its HPACK decoder's table (as far as the client fills
//! it), its open streams (none), no read or write buffer (each is freed once empty).
//!
//! - `conn`: the connection's state and its poll loop (read, answers, bodies, write).
//! - `frames`: what each frame a client sends does to it (RFC 9113 §5, §6).
//! - `out`: where each stream's answer is, and the future that brings it.
//! - `answer`: a response's head and body written as frames under flow control.
//! - `inbound`: a request body as its DATA frames come.
//! - `wakes`: which streams the connection's task was woken for (it polls those alone).
//! - `calm`: the budget that ends a connection whose client makes the server work for nothing
//!   (rapid reset, MadeYouReset, control-frame floods).

mod answer;
mod calm;
mod conn;
mod frames;
mod inbound;
mod out;
mod wakes;

use std::any::TypeId;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;

use http::{Request, Response};
use sluice_core::body::{ProxyBody, RequestBody};
use sluice_core::ClientInfo;
use sluice_net::http::HttpOptions;
use sluice_net::shutdown::ShutdownSignal;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::active::ActiveRequests;
use crate::service::BoxError;

/// An answer on its way: the pipeline's future for one request.
pub type Answering = Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>>;

/// What serves the requests of the own HTTP/2 transport: the proxy's one pipeline.
pub trait Pipeline: Send + Sync + 'static {
    /// Answers `req` (its extensions carry the client's [`ClientInfo`]).
    fn call(&self, req: Request<RequestBody>) -> Answering;

    /// The type of the service whose requests it serves: a server uses it only for that
    /// service, so that a service wrapped in tower layers is never bypassed.
    fn service_type(&self) -> TypeId;
}

/// What a connection is given besides its bytes.
pub(crate) struct Given<'a> {
    pub(crate) pipeline: &'a Arc<dyn Pipeline>,
    pub(crate) info: ClientInfo,
    pub(crate) http: &'a HttpOptions,
    pub(crate) active: &'a Arc<ActiveRequests>,
    /// Fields every answer carries over any of the same name (`Alt-Svc`).
    pub(crate) fields: &'a [(http::HeaderName, http::HeaderValue)],
}

/// Serves an HTTP/2 connection whose first bytes (`first`, the preface sniffed on plaintext;
/// empty over TLS) were read already, until it ends; at the shutdown, or once its last request
/// by `max_requests_per_connection` began, it sends GOAWAY and finishes the streams it has.
pub(crate) async fn serve<I>(
    io: I,
    given: Given<'_>,
    signal: &ShutdownSignal,
    first: Vec<u8>,
) -> Result<(), BoxError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send,
{
    let header_timeout = given.http.request_header_timeout;
    let active = Arc::clone(given.active);
    let mut conn = conn::Conn::new(io, given, first);
    let mut shutdown = pin!(signal.wait());
    let mut last = pin!(active.last_request());
    let mut first_request = pin!(tokio::time::timeout(header_timeout, active.first_request()));
    let mut started = false;
    poll_fn(|cx| {
        if !conn.stopping()
            && (shutdown.as_mut().poll(cx).is_ready() || last.as_mut().poll(cx).is_ready())
        {
            conn.stop();
        }
        if !started {
            match first_request.as_mut().poll(cx) {
                Poll::Ready(Ok(())) => started = true,
                Poll::Ready(Err(_)) => conn.stop(),
                Poll::Pending => {}
            }
        }
        conn.poll_run(cx)
    })
    .await
}

/// Serves one HTTP/2 connection on `io` (its preface not read yet) with `pipeline`, until it
/// ends, or, once `signal` fires, until the streams it has are finished (GOAWAY sent): the
/// transport without a listener, for a framework user's own sockets and for fuzzing.
pub async fn serve_connection<I>(
    io: I,
    pipeline: Arc<dyn Pipeline>,
    http: &HttpOptions,
    info: ClientInfo,
    signal: &ShutdownSignal,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send,
{
    let active = Arc::new(ActiveRequests::with_limit(http.max_requests_per_connection));
    let given = Given {
        pipeline: &pipeline,
        info,
        http,
        active: &active,
        fields: &[],
    };
    serve(io, given, signal, Vec::new()).await
}
