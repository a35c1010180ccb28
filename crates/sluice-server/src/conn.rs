//! One client connection: TLS handshake, protocol choice, serving, graceful close.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::{poll_fn, Future};
use std::io;
use std::mem;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::rt::bounds::Http2ServerConnExec;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sluice_net::http::HttpOptions;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, Instrument};

use sluice_core::headers::wants_upgrade;
use sluice_core::read_ahead::IO_BUFFER_BYTES;
use sluice_session::Prefixed;

use super::active::{ActiveRequests, Tracked, TrackedBody};
use super::carrier::UpgradeCarrier;
use super::fast::{Conn, FastHttp1, Left};
use super::framing::{FramingGuard, FramingWatch};
use super::io::{deadline, poll_read_first, IdleTimeout};
use super::prefixed::sniff_h2;
use super::service::{BoxError, HttpService};
use sluice_core::ClientInfo;
use sluice_net::shutdown::ShutdownSignal;

/// Per-listener protocol builders, shared by its connections.
pub(super) struct Settings {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    http: HttpOptions,
    tls: Option<TlsAcceptor>,
    pub(super) bytes: Option<crate::counters::ByteCounters>,
    /// Where failed TLS handshakes are counted.
    pub(super) tls_failures: prometheus_client::metrics::counter::Counter,
    /// Serves HTTP/1.1 requests (plain or over TLS) before hyper does, when set.
    pub(super) fast: Option<std::sync::Arc<dyn FastHttp1>>,
    /// Whether each connection needs `TCP_NODELAY` set: not when the listener has it, since
    /// Linux's accepted sockets inherit it (a system call less per connection).
    pub(super) nodelay: bool,
    /// What every client of the listener has in common (its address and trust are a
    /// connection's own: [`Peer`]).
    pub(super) client: ClientInfo,
    /// The `Alt-Svc` field every answer carries (HTTP/3 offered), if any.
    pub(super) alt_svc: Option<http::HeaderValue>,
    /// The same, as the fields the fast path puts on its answers.
    pub(super) fields: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Serves HTTP/2 connections instead of hyper, when set (`own_http2`).
    pub(super) own_h2: Option<Arc<dyn crate::h2own::Pipeline>>,
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
        let client = ClientInfo {
            tls: tls.is_some(),
            rules: http.rules,
            body_timeout: http.client_body_timeout,
            max_body: http.max_request_body,
            ..ClientInfo::default()
        };
        Self {
            h1,
            h2,
            http: http.clone(),
            tls,
            bytes: None,
            tls_failures: Default::default(),
            fast: None,
            nodelay: true,
            client,
            alt_svc: None,
            fields: Vec::new(),
            own_h2: None,
        }
    }
}

/// A connection's client as the connection keeps it: what is its own of its [`ClientInfo`]
/// (the rest is the listener's, `Settings::client`, and is put together as a request needs it):
/// 40 bytes of every open connection's state where the whole would be 104.
#[derive(Debug, Clone, Copy)]
pub(super) struct Peer {
    /// The client's address.
    pub(super) addr: SocketAddr,
    /// Whether it is one of the listener's `trusted_proxies`.
    pub(super) trusted: bool,
}

impl Peer {
    fn info(self, settings: &Settings) -> ClientInfo {
        ClientInfo {
            peer: self.addr,
            trusted: self.trusted,
            ..settings.client
        }
    }
}

/// Serves one accepted connection until it closes or the shutdown (then graceful) completes;
/// `open` (the connection's share of the listener's counts) is dropped when it ends.
///
/// An idle keep-alive connection is this future and little else, so what it holds is counted
/// in bytes: the connection's state (`io`, `peer`, `service`) is made here, before the future,
/// which owns it once and lends it to each stage by reference. An `async fn` would hold its
/// arguments twice (as arguments and as the locals they are moved into), and each stage
/// taking them by value a copy more. Only the ways of serving that take the stream whole (TLS,
/// hyper's HTTP/1 and HTTP/2) move it, into a box of their own, with what hyper is given of
/// the rest ([`ConnService`]).
pub(super) fn serve<S: HttpService>(
    stream: TcpStream,
    peer: Peer,
    service: S,
    settings: Arc<Settings>,
    signal: ShutdownSignal,
    open: impl Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let span = tracing::debug_span!("conn", client.addr = %peer.addr, tls = settings.client.tls);
    let limit = settings.http.max_requests_per_connection;
    let active = Arc::new(ActiveRequests::with_limit(limit));
    let mut io = IdleTimeout::new(stream, settings.http.idle_timeout, Arc::clone(&active))
        .with_first_wait(settings.http.request_header_timeout)
        .with_byte_counters(settings.bytes.clone());
    async move {
        // Responses are written whole; Nagle would only add latency. (Here, not in the accept
        // loop, which makes this future.)
        if settings.nodelay {
            let _ = io.get_ref().set_nodelay(true);
        }
        let result = match &settings.tls {
            Some(tls) => {
                let served =
                    serve_tls(io, tls.clone(), (service, peer, active), &settings, &signal);
                Box::pin(served).await
            }
            None => 'plain: {
                // Taken apart at once: a whole result kept across the waits below would be
                // room in every connection's state.
                let (h2, first) = match sniff(&mut io, &settings).await {
                    Ok(sniffed) => sniffed,
                    Err(e) => break 'plain Err(e.into()),
                };
                if h2 {
                    if let Some(own) = &settings.own_h2 {
                        let given = own_given(own, peer, &active, &settings);
                        let served = crate::h2own::serve(io, given, &signal, first);
                        break 'plain Box::pin(served).await;
                    }
                    let svc = ConnService::new(
                        service,
                        peer.info(&settings),
                        active,
                        settings.alt_svc.clone(),
                    );
                    let h2 = serve_h2(Prefixed::new(first, io), svc, &settings, &signal);
                    break 'plain Box::pin(h2).await;
                }
                let fast = serve_fast_h1(&mut io, (&peer, &active), &settings, &signal, first);
                let Some(buf) = fast.await else {
                    break 'plain Ok(());
                };
                let svc = ConnService::new(
                    service,
                    peer.info(&settings),
                    active,
                    settings.alt_svc.clone(),
                );
                Box::pin(serve_h1(Prefixed::new(buf, io), svc, &settings, &signal)).await
            }
        };
        if let Err(error) = result {
            debug!(%error, "connection ended with an error");
        }
        drop(open);
    }
    .instrument(span)
}

/// A plaintext connection's first bytes, when the listener speaks HTTP/2 too (none read
/// otherwise), and whether they are the HTTP/2 preface.
async fn sniff(
    io: &mut IdleTimeout<TcpStream>,
    settings: &Settings,
) -> io::Result<(bool, Vec<u8>)> {
    if !settings.http.http2 {
        return Ok((false, Vec::new()));
    }
    // A client that sends nothing is closed by `io`'s first wait (the header timeout, which
    // began at the accept a moment ago); one that trickles the preface, by then too.
    let by = deadline(
        tokio::time::Instant::now(),
        settings.http.request_header_timeout,
    );
    sniff_h2(io, by).await
}

/// HTTP/1.1, plain or over TLS, from its `first` bytes (read by the sniff) on: the fast path
/// serves what it takes, when the listener has one; returns the bytes hyper is to serve the
/// rest from, or `None` when the connection is done.
///
/// Only the client's address and its requests in flight are the connection's own (`peer`,
/// `active`); what the fast path is given for the requests is made for each call, and is not
/// kept while the connection waits for its next request.
fn serve_fast_h1<'a, I: Timed>(
    io: &'a mut I,
    (peer, active): (&'a Peer, &'a Arc<ActiveRequests>),
    settings: &'a Settings,
    signal: &'a ShutdownSignal,
    mut first: Vec<u8>,
) -> impl Future<Output = Option<Vec<u8>>> + Send + 'a {
    async move {
        let Some(fast) = &settings.fast else {
            return Some(first);
        };
        loop {
            // A block of its own: what the call is given (`info`: 104 bytes) is not kept while
            // the connection waits below.
            let since = {
                let info = peer.info(settings);
                let conn = Conn {
                    info: &info,
                    http: &settings.http,
                    signal,
                    active,
                    fields: &settings.fields,
                };
                match fast.serve(io, conn, mem::take(&mut first)).await {
                    Left::Done => break,
                    Left::HandOff(buf) => return Some(buf),
                    Left::Idle(since) => since,
                }
            };
            // The header timeout from when it began to wait, which no byte moves: over TLS, a
            // record trickled byte by byte moves bytes but brings no request.
            let until = deadline(since, settings.http.request_header_timeout);
            io.timeout().wait_until(until);
            match next_request(io, signal, active).await {
                Some(bytes) => {
                    io.timeout().request_began();
                    first = bytes;
                }
                // The deadline stands for the close too (a client that stopped reading does
                // not hold it for the idle timeout).
                None => break,
            }
        }
        // As hyper ends a connection: a TLS stream sends its close_notify, so that a body
        // delimited by the close is not taken for a truncated one; the FIN goes out before the
        // close, which sends a reset instead when request bytes are left unread.
        let _ = io.shutdown().await;
        None
    }
}

/// Waits for the next request's first bytes on a connection the fast path left idle (or at the
/// shutdown), as long as `io`'s timer lets it; `None` when the connection should end instead:
/// closed, failed, no request begun in time, or a shutdown. A shutdown that comes before the
/// connection's first request still lets that request arrive in time: it may have been sent a
/// moment before the listener stopped accepting.
///
/// What it holds while it waits is what every idle connection holds, so the read and the
/// shutdown are polled by hand: a `select!` would keep room for both its branches' futures.
fn next_request<'a, I: AsyncRead + Unpin + Send>(
    io: &'a mut I,
    signal: &'a ShutdownSignal,
    active: &'a ActiveRequests,
) -> impl Future<Output = Option<Vec<u8>>> + Send + 'a {
    async move {
        if !signal.is_triggered() {
            let mut shutdown = pin!(signal.wait());
            let read = poll_fn(|cx| match poll_first(io, cx) {
                Poll::Ready(first) => Poll::Ready(Some(first)),
                Poll::Pending => shutdown.as_mut().poll(cx).map(|()| None),
            });
            if let Some(first) = read.await {
                return first;
            }
        }
        // The shutdown: a request already in the socket is served (and the connection closed
        // after it); only an idle connection closes at once.
        let read = poll_fn(|cx| poll_first(io, cx));
        if active.started() {
            read.now_or_never().flatten()
        } else {
            read.await
        }
    }
}

/// Polls one read of a request's first bytes: ready with them, or with `None` at the end of the
/// stream or an error. Nothing of it is kept between polls.
fn poll_first<I: AsyncRead + Unpin>(io: &mut I, cx: &mut Context<'_>) -> Poll<Option<Vec<u8>>> {
    let mut first = None;
    poll_read_first(io, cx, |bytes| first = Some(bytes.to_vec())).map(|_| first)
}

/// What the own HTTP/2 transport is given with a connection.
fn own_given<'a>(
    pipeline: &'a Arc<dyn crate::h2own::Pipeline>,
    peer: Peer,
    active: &'a Arc<ActiveRequests>,
    settings: &'a Settings,
) -> crate::h2own::Given<'a> {
    crate::h2own::Given {
        pipeline,
        info: peer.info(settings),
        http: &settings.http,
        active,
        fields: &settings.fields,
    }
}

/// A client stream served over HTTP/1.1, and the [`IdleTimeout`] that bounds its waits.
trait Timed: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn timeout(&mut self) -> &mut IdleTimeout<TcpStream>;
}

impl Timed for IdleTimeout<TcpStream> {
    fn timeout(&mut self) -> &mut IdleTimeout<TcpStream> {
        self
    }
}

impl Timed for Box<TlsStream<IdleTimeout<TcpStream>>> {
    fn timeout(&mut self) -> &mut IdleTimeout<TcpStream> {
        self.get_mut().0
    }
}

async fn serve_tls<S: HttpService>(
    io: IdleTimeout<TcpStream>,
    acceptor: TlsAcceptor,
    (service, peer, active): (S, Peer, Arc<ActiveRequests>),
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
        if let Some(own) = &settings.own_h2 {
            let given = own_given(own, peer, &active, settings);
            return Box::pin(crate::h2own::serve(tls, given, signal, Vec::new())).await;
        }
        let svc = ConnService::new(
            service,
            peer.info(settings),
            active,
            settings.alt_svc.clone(),
        );
        return Box::pin(serve_h2(tls, svc, settings, signal)).await;
    }
    let fast = serve_fast_h1(&mut tls, (&peer, &active), settings, signal, Vec::new());
    let Some(buf) = fast.await else {
        return Ok(());
    };
    let svc = ConnService::new(
        service,
        peer.info(settings),
        active,
        settings.alt_svc.clone(),
    );
    Box::pin(serve_h1(Prefixed::new(buf, tls), svc, settings, signal)).await
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
    // Only HTTP/1.1 switches protocols: a connection gets its carrier when hyper serves it.
    let carrier = UpgradeCarrier::default();
    let svc = ConnService {
        framing: Some(Arc::clone(&watch)),
        carrier: Some(carrier.clone()),
        ..svc
    };
    let active = Arc::clone(&svc.active);
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
    let svc = ConnService { h2: true, ..svc };
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
/// on HTTP/1 with [`AmbiguousFraming`](sluice_core::checks::AmbiguousFraming) when the guard saw it, and
/// those that ask to switch protocols with the connection's [`UpgradeCarrier`].
#[derive(Clone)]
struct ConnService<S> {
    service: S,
    info: ClientInfo,
    framing: Option<Arc<FramingWatch>>,
    active: Arc<ActiveRequests>,
    carrier: Option<UpgradeCarrier>,
    /// Served over HTTP/2: a response's last data goes to h2 as a copy of its own.
    h2: bool,
    /// The listener's `Alt-Svc`, put on every answer.
    alt_svc: Option<http::HeaderValue>,
}

impl<S> ConnService<S> {
    /// What hyper is given to serve a connection with, when it takes it over.
    /// With the listener's `Alt-Svc`, if it has one.
    fn new(
        service: S,
        info: ClientInfo,
        active: Arc<ActiveRequests>,
        alt_svc: Option<http::HeaderValue>,
    ) -> Self {
        Self {
            service,
            info,
            framing: None,
            active,
            carrier: None,
            h2: false,
            alt_svc,
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
            req.extensions_mut()
                .insert(sluice_core::checks::AmbiguousFraming);
        }
        if let Some(carrier) = &self.carrier {
            if wants_upgrade(req.version(), req.headers()) {
                req.extensions_mut().insert(carrier.clone());
            }
        }
        Tracked::new(
            self.service.clone().serve(req),
            self.active.begin(),
            self.h2,
        )
        .with_alt_svc(self.alt_svc.clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::convert::Infallible;

    use http_body_util::Empty;
    use sluice_net::shutdown::Shutdown;
    use tokio::net::TcpListener;

    use super::*;

    /// What every open connection's task holds, however idle, stays small: a stage that takes
    /// the connection's state (about 200 bytes) by value again, or a local kept across the
    /// wait for the next request, shows here. The task is this future with the proxy's service
    /// (8 bytes more), the listener's counts (16) and Tokio's 104 bytes, in 128-byte steps: at
    /// 512 bytes here it is 640 (it was 768 at 648, before `Peer`; see the idle bench).
    #[tokio::test]
    async fn a_connections_future_stays_small() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let service = tower::service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(Empty::<bytes::Bytes>::new()))
        });
        let http = super::super::default_http_options();
        let settings = Arc::new(Settings::new(&http, None));
        let shutdown = Shutdown::new();
        let peer = Peer {
            addr: ClientInfo::default().peer,
            trusted: false,
        };
        let conn = serve(stream, peer, service, settings, shutdown.signal(), ());
        let size = std::mem::size_of_val(&conn);
        // 464 bytes now (it was 2 232 in the release build when each layer took the state by
        // value).
        assert!(size <= 512, "a connection's future is {size} bytes");
    }
}
