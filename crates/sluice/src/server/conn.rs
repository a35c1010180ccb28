//! One client connection: TLS handshake, protocol choice, serving, graceful close.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::rt::bounds::Http2ServerConnExec;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sluice_config::HttpOptions;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, Instrument};

use crate::http::headers::wants_upgrade;
use crate::http::IO_BUFFER_BYTES;
use sluice_session::Prefixed;

use super::active::{ActiveRequests, Tracked, TrackedBody};
use super::carrier::UpgradeCarrier;
use super::fast::{Conn, FastHttp1, Left};
use super::framing::{FramingGuard, FramingWatch};
use super::io::{deadline, IdleTimeout};
use super::prefixed::sniff_h2;
use super::service::{BoxError, HttpService};
use super::{ClientInfo, ShutdownSignal};

/// Per-listener protocol builders, shared by its connections.
pub(super) struct Settings {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    http: HttpOptions,
    tls: Option<TlsAcceptor>,
    pub(super) bytes: Option<crate::metrics::ByteCounters>,
    /// Where failed TLS handshakes are counted.
    pub(super) tls_failures: prometheus_client::metrics::counter::Counter,
    /// Serves HTTP/1.1 requests (plain or over TLS) before hyper does, when set.
    pub(super) fast: Option<std::sync::Arc<dyn FastHttp1>>,
}

impl Settings {
    pub(super) fn new(http: &HttpOptions, tls: Option<TlsAcceptor>) -> Self {
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new())
            .header_read_timeout(http.request_header_timeout)
            .max_header_size(http.max_header_bytes)
            // The read buffer holds a whole request head, so it grows with the header limit.
            .max_buf_size(IO_BUFFER_BYTES.max(2 * http.max_header_bytes));
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(http.max_header_bytes).unwrap_or(u32::MAX));
        Self {
            h1,
            h2,
            http: http.clone(),
            tls,
            bytes: None,
            tls_failures: Default::default(),
            fast: None,
        }
    }
}

/// Serves one accepted connection until it closes or the shutdown (then graceful) completes;
/// `open` (the connection's share of the listener's counts) is dropped when it ends.
///
/// An idle keep-alive connection is this future and little else, so what it holds is counted
/// in bytes: the connection's state (`io`, `svc`) is made here, before the future, which owns
/// it once and lends it to each stage by reference. An `async fn` would hold its arguments
/// twice (as arguments and as the locals they are moved into), and each stage taking them by
/// value a copy more. Only the ways of serving that take the stream whole (TLS, hyper's
/// HTTP/1 and HTTP/2) move it, into a box of their own.
pub(super) fn serve<S: HttpService>(
    stream: TcpStream,
    info: ClientInfo,
    service: S,
    settings: Arc<Settings>,
    signal: ShutdownSignal,
    open: impl Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let span = tracing::debug_span!("conn", client.addr = %info.peer, tls = info.tls);
    // Responses are written whole; Nagle would only add latency.
    let _ = stream.set_nodelay(true);
    let limit = settings.http.max_requests_per_connection;
    let active = Arc::new(ActiveRequests::with_limit(limit));
    let mut io = IdleTimeout::new(stream, settings.http.idle_timeout, Arc::clone(&active))
        .with_first_wait(settings.http.request_header_timeout)
        .with_byte_counters(settings.bytes.clone());
    let svc = ConnService {
        service,
        info,
        framing: None,
        active,
        carrier: UpgradeCarrier::default(),
    };
    async move {
        let result = match &settings.tls {
            Some(tls) => Box::pin(serve_tls(io, tls.clone(), svc, &settings, &signal)).await,
            None => match serve_plain(&mut io, svc.parts(), &settings, &signal).await {
                Ok(Next::Done) => Ok(()),
                Ok(Next::H1(buf)) => {
                    Box::pin(serve_h1(Prefixed::new(buf, io), svc, &settings, &signal)).await
                }
                Ok(Next::H2(buf)) => {
                    Box::pin(serve_h2(Prefixed::new(buf, io), svc, &settings, &signal)).await
                }
                Err(e) => Err(e),
            },
        };
        if let Err(error) = result {
            debug!(%error, "connection ended with an error");
        }
        drop(open);
    }
    .instrument(span)
}

/// What a connection's first stage left to hyper.
enum Next {
    /// Nothing: the connection is done.
    Done,
    /// hyper's HTTP/1.1 serves the rest, starting with these bytes.
    H1(Vec<u8>),
    /// hyper's HTTP/2 serves the rest (a client with prior knowledge), starting with these.
    H2(Vec<u8>),
}

/// A plaintext connection's first stage: the HTTP/2 sniff, then the fast path.
async fn serve_plain(
    io: &mut IdleTimeout<TcpStream>,
    svc: Parts<'_>,
    settings: &Settings,
    signal: &ShutdownSignal,
) -> Result<Next, BoxError> {
    if !settings.http.http2 {
        let left = serve_fast_h1(io, svc, settings, signal, Vec::new()).await;
        return Ok(left.map_or(Next::Done, Next::H1));
    }
    // A client that sends nothing is closed by `io`'s first wait (the header timeout, which
    // began at the accept a moment ago); one that trickles the preface, by then too.
    let by = deadline(
        tokio::time::Instant::now(),
        settings.http.request_header_timeout,
    );
    match sniff_h2(io, by).await? {
        (true, first) => Ok(Next::H2(first)),
        (false, first) => {
            let left = serve_fast_h1(io, svc, settings, signal, first).await;
            Ok(left.map_or(Next::Done, Next::H1))
        }
    }
}

/// HTTP/1.1, plain or over TLS, from its `first` bytes (read by the sniff) on: the fast path
/// serves what it takes, when the listener has one; returns the bytes hyper is to serve the
/// rest from, or `None` when the connection is done.
async fn serve_fast_h1<I>(
    io: &mut I,
    svc: Parts<'_>,
    settings: &Settings,
    signal: &ShutdownSignal,
    first: Vec<u8>,
) -> Option<Vec<u8>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some(fast) = &settings.fast else {
        return Some(first);
    };
    let conn = Conn {
        info: svc.info,
        http: &settings.http,
        signal,
        active: svc.active,
    };
    match fast.serve(io, conn, first).await {
        Left::Done => {
            // As hyper ends a connection: a TLS stream sends its close_notify, so that a body
            // delimited by the close is not taken for a truncated one; the FIN goes out before
            // the close, which sends a reset instead when request bytes are left unread.
            let _ = io.shutdown().await;
            None
        }
        Left::HandOff(buf) => Some(buf),
    }
}

async fn serve_tls<S: HttpService>(
    io: IdleTimeout<TcpStream>,
    acceptor: TlsAcceptor,
    svc: ConnService<S>,
    settings: &Settings,
    signal: &ShutdownSignal,
) -> Result<(), BoxError> {
    // The handshake's state is boxed while it runs, the stream once it is done: this future
    // stays small, and HTTP/2's (boxed too) does not hold room for the stream twice.
    let accept = Box::pin(acceptor.accept(io));
    let handshake = tokio::time::timeout(settings.http.request_header_timeout, accept);
    let mut tls = match handshake.await {
        Ok(Ok(tls)) => Box::new(tls),
        Ok(Err(e)) => {
            settings.tls_failures.inc();
            return Err(e.into());
        }
        Err(_) => {
            settings.tls_failures.inc();
            return Err("TLS handshake timed out".into());
        }
    };
    if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
        return Box::pin(serve_h2(tls, svc, settings, signal)).await;
    }
    match serve_fast_h1(&mut tls, svc.parts(), settings, signal, Vec::new()).await {
        None => Ok(()),
        Some(buf) => Box::pin(serve_h1(Prefixed::new(buf, tls), svc, settings, signal)).await,
    }
}

async fn serve_h1<I, S: HttpService>(
    io: I,
    svc: ConnService<S>,
    settings: &Settings,
    signal: &ShutdownSignal,
) -> Result<(), BoxError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let watch = Arc::new(FramingWatch::default());
    let io = FramingGuard::new(io, settings.http.max_header_bytes, Arc::clone(&watch));
    let svc = ConnService {
        framing: Some(Arc::clone(&watch)),
        ..svc
    };
    let active = Arc::clone(&svc.active);
    let carrier = svc.carrier.clone();
    // Upgrades (WebSocket) hand the connection to the proxy's bridge after the 101.
    let conn = settings
        .h1
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    tokio::pin!(conn);
    let result = drive(conn.as_mut(), signal, &active, settings).await;
    // Still alive here, so the guard can answer 408 when it is dropped.
    if let Err(e) = &result {
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout)
        {
            watch.head_timed_out();
        }
    }
    // A protocol switch: its bridge is this connection now, drained and cut like one.
    if let Some(bridge) = carrier.take() {
        bridge.await;
    }
    result
}

async fn serve_h2<I, S: HttpService>(
    io: I,
    svc: ConnService<S>,
    settings: &Settings,
    signal: &ShutdownSignal,
) -> Result<(), BoxError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let active = Arc::clone(&svc.active);
    let conn = settings.h2.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    // hyper's HTTP/2 server has no header timer: a client that sends the preface alone, or
    // HEADERS without END_HEADERS, would hold the connection for `idle_timeout`. Its first
    // complete request must begin within `request_header_timeout`, as on HTTP/1.1.
    let first = tokio::time::timeout(settings.http.request_header_timeout, active.first_request());
    tokio::select! {
        res = drive(conn, signal, &active, settings) => res,
        Err(_) = first => Err("no complete request within request_header_timeout".into()),
    }
}

/// Runs a connection to its end; on shutdown, or once its last request (by
/// `max_requests_per_connection`) has begun, asks it to finish gracefully (HTTP/1.1: close
/// after the response in progress; HTTP/2: GOAWAY) and waits for that.
///
/// A connection that has not begun a request yet may have been accepted a moment before the
/// shutdown with its request still unread in the socket (a hot restart stops accepting while
/// clients keep connecting): closing it would fail that request. So the shutdown waits for the
/// first request to begin, within `request_header_timeout`, and then asks the connection to
/// finish after it.
async fn drive<C: Graceful>(
    mut conn: Pin<&mut C>,
    signal: &ShutdownSignal,
    active: &ActiveRequests,
    settings: &Settings,
) -> Result<(), BoxError> {
    tokio::select! {
        res = conn.as_mut() => return res.map_err(Into::into),
        () = signal.wait() => {}
        // `max_requests_per_connection`: HTTP/1.1 closes after this response, HTTP/2 sends
        // GOAWAY and finishes the streams it has.
        () = active.last_request() => {
            conn.as_mut().graceful_shutdown();
            return conn.await.map_err(Into::into);
        }
    }
    if !active.started() {
        let first =
            tokio::time::timeout(settings.http.request_header_timeout, active.first_request());
        tokio::select! {
            res = conn.as_mut() => return res.map_err(Into::into),
            _ = first => {}
        }
    }
    conn.as_mut().graceful_shutdown();
    conn.await.map_err(Into::into)
}

/// A served connection that can be asked to finish gracefully. hyper-util's
/// `GracefulConnection` is sealed and does not cover HTTP/1 connections with upgrades, so the
/// two kinds served here are adapted locally. An upgraded connection has already left hyper:
/// shutting it down does nothing, and the bridge carrying it runs until either side closes.
trait Graceful: Future<Output = Result<(), hyper::Error>> {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> Graceful for http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: Body + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl<I, S, B, E> Graceful for http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: Body + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
    E: Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self);
    }
}

/// Adapts a tower service to hyper for one connection, tagging requests with [`ClientInfo`],
/// on HTTP/1 with [`AmbiguousFraming`](super::AmbiguousFraming) when the guard saw it, and
/// those that ask to switch protocols with the connection's [`UpgradeCarrier`].
#[derive(Clone)]
struct ConnService<S> {
    service: S,
    info: ClientInfo,
    framing: Option<Arc<FramingWatch>>,
    active: Arc<ActiveRequests>,
    carrier: UpgradeCarrier,
}

/// What of a [`ConnService`] a fast path uses (borrowed apart from the service, which need not
/// be `Sync`).
#[derive(Clone, Copy)]
struct Parts<'a> {
    info: &'a ClientInfo,
    active: &'a Arc<ActiveRequests>,
}

impl<S> ConnService<S> {
    fn parts(&self) -> Parts<'_> {
        Parts {
            info: &self.info,
            active: &self.active,
        }
    }
}

impl<S: HttpService> hyper::service::Service<Request<Incoming>> for ConnService<S> {
    type Response = Response<TrackedBody<S::Body>>;
    type Error = Infallible;
    type Future = Tracked<S::Future>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(self.info);
        if self.framing.as_ref().is_some_and(|f| f.next_is_ambiguous()) {
            req.extensions_mut().insert(super::AmbiguousFraming);
        }
        if wants_upgrade(req.version(), req.headers()) {
            req.extensions_mut().insert(self.carrier.clone());
        }
        Tracked::new(self.service.clone().serve(req), self.active.begin())
    }
}
