//! A fake acceptor: it parses hellos with `sluice-session`, answers `101` (or what the test's
//! policy says), and then drives each session as an HTTP/1.1 client the test can use.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_sdk::{Acceptor, Backoff, Options};
use sluice_session::{parse_hello, Drain, Hello, Identity, Parsed, Registration, Rejection, Reply};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

/// Fails a test that would otherwise hang; never a timing assertion.
pub(crate) async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("the test hung")
}

/// Decides the answer to each hello: `None` accepts.
pub(crate) type Policy = Arc<dyn Fn(&Hello) -> Option<Rejection> + Send + Sync>;

pub(crate) fn accept_all() -> Policy {
    Arc::new(|_| None)
}

pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// What the fake acceptor saw.
pub(crate) enum Event {
    Registered(Session),
    Drain(Drain),
    Refused(Hello, u16),
}

/// One registered session, seen from the proxy's side. Dropping it closes the connection.
pub(crate) struct Session {
    pub(crate) registration: Registration,
    sender: SendRequest<Full<Bytes>>,
    _close: oneshot::Sender<()>,
}

pub(crate) struct Reply1 {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

impl Session {
    /// Sends `GET path` on this session.
    pub(crate) async fn get(&mut self, path: &str) -> Reply1 {
        let req = Request::get(path)
            .header("host", "app.example")
            .body(Full::default())
            .unwrap();
        let res = self.send(req).await;
        let status = res.status();
        let headers = res.headers().clone();
        let body = within(res.into_body().collect()).await.unwrap().to_bytes();
        Reply1 {
            status,
            headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    pub(crate) async fn send(&mut self, req: Request<Full<Bytes>>) -> Response<Incoming> {
        within(self.sender.ready()).await.unwrap();
        within(self.sender.send_request(req)).await.unwrap()
    }

    /// `GET path`, or `None` when the SDK has closed the session (it may not have seen the
    /// EOF yet: a request sent meanwhile fails).
    pub(crate) async fn try_get(&mut self, path: &str) -> Option<StatusCode> {
        within(self.sender.ready()).await.ok()?;
        let req = Request::get(path)
            .header("host", "app.example")
            .body(Full::default())
            .unwrap();
        let res = within(self.sender.send_request(req)).await.ok()?;
        Some(res.status())
    }

    /// Whether the SDK has closed its end (after a `Connection: close` response).
    pub(crate) async fn wait_closed(&mut self) {
        std::future::poll_fn(|cx| match self.sender.poll_ready(cx) {
            std::task::Poll::Ready(Err(_)) => std::task::Poll::Ready(()),
            std::task::Poll::Ready(Ok(())) => std::task::Poll::Pending,
            std::task::Poll::Pending => std::task::Poll::Pending,
        })
        .await
    }
}

pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    async fn accept(&self) -> Box<dyn Io> {
        match self {
            Listener::Tcp(l) => Box::new(l.accept().await.unwrap().0),
            Listener::Unix(l) => Box::new(l.accept().await.unwrap().0),
        }
    }
}

/// A running fake acceptor; dropping it closes the listener and every connection.
pub(crate) struct Fake {
    events: mpsc::UnboundedReceiver<Event>,
    task: JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    /// A plaintext TCP acceptor on 127.0.0.1:0 that accepts everything.
    pub(crate) async fn tcp() -> (Fake, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (
            Fake::start(Listener::Tcp(listener), None, accept_all()),
            addr,
        )
    }

    pub(crate) fn start(listener: Listener, tls: Option<TlsAcceptor>, policy: Policy) -> Fake {
        let (tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(accept_loop(listener, tls, policy, tx));
        Fake { events, task }
    }

    pub(crate) async fn next(&mut self) -> Event {
        within(self.events.recv()).await.expect("acceptor stopped")
    }

    /// The next registered session (any other event fails the test).
    pub(crate) async fn session(&mut self) -> Session {
        match self.next().await {
            Event::Registered(s) => s,
            Event::Drain(_) => panic!("expected a registration, got a drain"),
            Event::Refused(_, status) => panic!("expected a registration, refused {status}"),
        }
    }

    pub(crate) async fn sessions(&mut self, n: usize) -> Vec<Session> {
        let mut all = Vec::new();
        for _ in 0..n {
            all.push(self.session().await);
        }
        all
    }

    /// Events already queued, without waiting.
    pub(crate) fn pending(&mut self) -> usize {
        let mut n = 0;
        while self.events.try_recv().is_ok() {
            n += 1;
        }
        n
    }
}

async fn accept_loop(
    listener: Listener,
    tls: Option<TlsAcceptor>,
    policy: Policy,
    events: mpsc::UnboundedSender<Event>,
) {
    // Dropped with this task: aborting the acceptor closes every connection too.
    let mut conns = JoinSet::new();
    loop {
        let io = listener.accept().await;
        let (tls, policy, events) = (tls.clone(), policy.clone(), events.clone());
        conns.spawn(async move {
            let io: Box<dyn Io> = match tls {
                Some(tls) => Box::new(tls.accept(io).await.unwrap()),
                None => io,
            };
            connection(io, policy, events).await;
        });
    }
}

async fn connection(mut io: Box<dyn Io>, policy: Policy, events: mpsc::UnboundedSender<Event>) {
    let Some(hello) = read_hello(&mut io).await else {
        return;
    };
    if let Some(rejection) = policy(&hello) {
        let _ = io.write_all(&rejection.encode()).await;
        let _ = io.shutdown().await;
        let _ = events.send(Event::Refused(hello, rejection.status));
        return;
    }
    match hello {
        Hello::Drain(drain) => {
            let _ = events.send(Event::Drain(drain));
            io.write_all(&Reply::drained()).await.unwrap();
            let _ = io.shutdown().await;
        }
        Hello::Register(registration) => session(io, registration, events).await,
        // The fake is one node: it has no control links, as an older acceptor.
        Hello::Control(_) => {
            let refusal = sluice_session::Rejection::bad_request("no control links here");
            let _ = io.write_all(&refusal.encode()).await;
        }
    }
}

async fn session(
    mut io: Box<dyn Io>,
    registration: Registration,
    events: mpsc::UnboundedSender<Event>,
) {
    io.write_all(&Reply::switching_protocols()).await.unwrap();
    io.flush().await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    let (close, closed) = oneshot::channel();
    let _ = events.send(Event::Registered(Session {
        registration,
        sender,
        _close: close,
    }));
    tokio::select! {
        _ = conn.with_upgrades() => {}
        _ = closed => {}
    }
}

/// Reads one hello; `None` if the peer went away first.
pub(crate) async fn read_hello(io: &mut (impl AsyncRead + Unpin)) -> Option<Hello> {
    let mut buf = BytesMut::new();
    loop {
        if io.read_buf(&mut buf).await.ok()? == 0 {
            return None;
        }
        if let Parsed::Complete(hello, _) = parse_hello(&buf, 8192).unwrap() {
            return Some(hello);
        }
    }
}

/// The identity every test registers with.
pub(crate) fn identity() -> Identity {
    Identity {
        service: "hello".into(),
        slice: "fast".into(),
        instance: Some("i-1".into()),
        token: Some("t0ken".into()),
    }
}

/// Options with quick backoff so retry tests do not dawdle.
pub(crate) fn options(acceptor: impl Into<Acceptor>, capacity: usize) -> Options {
    let mut options = Options::new(acceptor, identity());
    options.capacity = capacity;
    options.backoff = Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(50),
        jitter: 0.5,
    };
    options
}

/// The user's service: `hello <path>`.
pub(crate) async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = format!("hello {}", req.uri().path());
    Ok(Response::new(Full::new(Bytes::from(body))))
}

/// Waits until the SDK reports `n` registered sessions.
pub(crate) async fn registered(sessions: &sluice_sdk::Sessions, n: usize) {
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.registered == n))
        .await
        .unwrap();
}
