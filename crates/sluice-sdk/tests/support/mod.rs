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
use sluice_session::control::{LineReader, NodeLine, ReadLineError, ServiceLine};
use sluice_session::{
    parse_hello, Drain, Hello, Identity, Parsed, Registration, Rejection, Reply, SplitBy,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

pub(crate) mod h2;

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

    /// Waits until the SDK has closed its end (after a `Connection: close` response, or
    /// idle). hyper's `poll_ready` is not woken by a close, so this looks every few ms.
    pub(crate) async fn wait_closed(&mut self) {
        within(async {
            while !self.sender.is_closed() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
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

/// A control link as the fake node holds it: the test writes the node's lines and reads the
/// service's. The last `DEMAND` is repeated every half second, as a node's heartbeat (so a
/// slow test never looks silent), until [`Link::silence`]. Dropping it closes the link.
pub(crate) struct Link {
    pub(crate) registration: Registration,
    /// How the service said it splits (`Sluice-Split`).
    pub(crate) split: SplitBy,
    lines: LineReader<ReadHalf<Box<dyn Io>>>,
    out: mpsc::UnboundedSender<Out>,
    writer: JoinHandle<()>,
}

/// What the test asks a link's writer to do.
enum Out {
    Bytes(Vec<u8>),
    /// Stop the heartbeat: the node falls silent, its link still open.
    Silence,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

impl Link {
    fn new(registration: Registration, split: SplitBy, io: Box<dyn Io>) -> Self {
        let (read, write) = tokio::io::split(io);
        let (out, rx) = mpsc::unbounded_channel();
        Self {
            registration,
            split,
            lines: LineReader::new(read, b""),
            out,
            writer: tokio::spawn(heartbeat(write, rx)),
        }
    }

    pub(crate) async fn send(&mut self, line: NodeLine) {
        self.send_raw(&line.encode()).await;
    }

    pub(crate) async fn send_raw(&mut self, bytes: &[u8]) {
        // The SDK may have closed the link already; a test that cares looks at `closed`.
        let _ = self.out.send(Out::Bytes(bytes.to_vec()));
    }

    /// The node says nothing more on this link (a hung node, or a partition), which stays
    /// open: the SDK notices by its silence.
    pub(crate) fn silence(&mut self) {
        let _ = self.out.send(Out::Silence);
    }

    /// The service's next line.
    pub(crate) async fn next(&mut self) -> ServiceLine {
        let line = within(self.lines.next_line()).await.unwrap();
        ServiceLine::parse(&line).unwrap()
    }

    /// The service's next `RETIRE`, skipping `CAPACITY` lines.
    pub(crate) async fn retire(&mut self) -> u64 {
        loop {
            if let ServiceLine::Retire(n) = self.next().await {
                return n;
            }
        }
    }

    /// Waits until the service closes the link (skipping its lines).
    pub(crate) async fn closed(&mut self) {
        loop {
            match within(self.lines.next_line()).await {
                Ok(_) => {}
                Err(ReadLineError::Closed | ReadLineError::Io(_)) => return,
                Err(e) => panic!("{e}"),
            }
        }
    }
}

/// Writes what the test sends, and the last `DEMAND` again every half second.
async fn heartbeat(mut write: WriteHalf<Box<dyn Io>>, mut rx: mpsc::UnboundedReceiver<Out>) {
    let mut last: Option<Vec<u8>> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        let bytes = tokio::select! {
            out = rx.recv() => match out {
                Some(Out::Bytes(out)) => {
                    if out.starts_with(b"DEMAND ") {
                        last = Some(out.clone());
                    }
                    out
                }
                Some(Out::Silence) => {
                    last = None;
                    continue;
                }
                None => return,
            },
            _ = tick.tick() => match &last {
                Some(again) => again.clone(),
                None => continue,
            },
        };
        if write.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// A running fake acceptor; dropping it closes the listener and every connection.
pub(crate) struct Fake {
    events: mpsc::UnboundedReceiver<Event>,
    links: mpsc::UnboundedReceiver<Link>,
    task: JoinHandle<()>,
    /// `true`: connections are taken but not answered, as while a hot restart hands the
    /// listening socket to a new process (connects queue; none is refused).
    hold: watch::Sender<bool>,
    /// One `()` per connection held unanswered.
    held: mpsc::UnboundedReceiver<()>,
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

    /// A plaintext TCP node on 127.0.0.1:0 with control links (each reaches [`Fake::link`]).
    pub(crate) async fn node() -> (Fake, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (events, events_rx) = mpsc::unbounded_channel();
        let (links, links_rx) = mpsc::unbounded_channel();
        let to = Sinks {
            events,
            links: Some(links),
        };
        let (gate, hold, held) = Gate::new();
        let listener = Listener::Tcp(listener);
        let task = tokio::spawn(accept_loop(listener, None, accept_all(), to, gate));
        let fake = Fake {
            events: events_rx,
            links: links_rx,
            task,
            hold,
            held,
        };
        (fake, addr)
    }

    /// From now on, connections are taken but not answered until [`Fake::answer`].
    pub(crate) fn hold(&self) {
        self.hold.send_replace(true);
    }

    /// Answers the connections held, and every one after.
    pub(crate) fn answer(&self) {
        self.hold.send_replace(false);
    }

    /// Waits until a connection is held unanswered.
    pub(crate) async fn held(&mut self) {
        within(self.held.recv()).await.expect("acceptor stopped");
    }

    /// An acceptor without control links (it answers them `400`, as an older one does).
    pub(crate) fn start(listener: Listener, tls: Option<TlsAcceptor>, policy: Policy) -> Fake {
        let (events, events_rx) = mpsc::unbounded_channel();
        let (_, links_rx) = mpsc::unbounded_channel();
        let to = Sinks {
            events,
            links: None,
        };
        let (gate, hold, held) = Gate::new();
        let task = tokio::spawn(accept_loop(listener, tls, policy, to, gate));
        Fake {
            events: events_rx,
            links: links_rx,
            task,
            hold,
            held,
        }
    }

    /// The next control link the service opened.
    pub(crate) async fn link(&mut self) -> Link {
        within(self.links.recv()).await.expect("acceptor stopped")
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

/// Where the fake reports what it saw.
#[derive(Clone)]
struct Sinks {
    events: mpsc::UnboundedSender<Event>,
    /// `None`: no control links (`400`).
    links: Option<mpsc::UnboundedSender<Link>>,
}

/// Holds connections unanswered while the test says so ([`Fake::hold`]).
#[derive(Clone)]
struct Gate {
    hold: watch::Receiver<bool>,
    held: mpsc::UnboundedSender<()>,
}

impl Gate {
    fn new() -> (Self, watch::Sender<bool>, mpsc::UnboundedReceiver<()>) {
        let (hold, hold_rx) = watch::channel(false);
        let (held, held_rx) = mpsc::unbounded_channel();
        let gate = Gate {
            hold: hold_rx,
            held,
        };
        (gate, hold, held_rx)
    }

    async fn pass(mut self) {
        if *self.hold.borrow_and_update() {
            let _ = self.held.send(());
            let _ = self.hold.wait_for(|hold| !hold).await;
        }
    }
}

async fn accept_loop(
    listener: Listener,
    tls: Option<TlsAcceptor>,
    policy: Policy,
    to: Sinks,
    gate: Gate,
) {
    // Dropped with this task: aborting the acceptor closes every connection too.
    let mut conns = JoinSet::new();
    loop {
        let io = listener.accept().await;
        let (tls, policy, to, gate) = (tls.clone(), policy.clone(), to.clone(), gate.clone());
        conns.spawn(async move {
            gate.pass().await;
            let io: Box<dyn Io> = match tls {
                Some(tls) => Box::new(tls.accept(io).await.unwrap()),
                None => io,
            };
            connection(io, policy, to).await;
        });
    }
}

async fn connection(mut io: Box<dyn Io>, policy: Policy, to: Sinks) {
    let events = to.events;
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
        Hello::Control(registration, split) => match to.links {
            Some(links) => control(io, registration, split, links).await,
            // An acceptor without control links, as an older one.
            None => {
                let refusal = sluice_session::Rejection::bad_request("no control links here");
                let _ = io.write_all(&refusal.encode()).await;
            }
        },
    }
}

/// Answers a control link `101` and hands it to the test: the link lives while the test
/// holds the [`Link`] (dropping the fake does not close it).
async fn control(
    mut io: Box<dyn Io>,
    registration: Registration,
    split: SplitBy,
    links: mpsc::UnboundedSender<Link>,
) {
    io.write_all(&Reply::control_switching()).await.unwrap();
    let _ = links.send(Link::new(registration, split, io));
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

/// Options for many nodes at `addrs` (a list), with quick backoff and a short grace.
pub(crate) fn many(addrs: &[SocketAddr], capacity: usize) -> Options {
    let list = addrs.iter().map(ToString::to_string).collect();
    let mut options = options(Acceptor::List(list), capacity);
    options.node_grace = Duration::from_millis(300);
    options
}

/// The most sessions held across all nodes in any status the SDK published (the SDK
/// publishes under the lock its rules run under, so each is a state it passed through).
pub(crate) struct MaxHeld {
    max: Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl MaxHeld {
    pub(crate) fn watch(sessions: &sluice_sdk::Sessions) -> Self {
        let mut status = sessions.subscribe();
        let max = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = max.clone();
        let task = tokio::spawn(async move {
            loop {
                let held: usize = status
                    .borrow_and_update()
                    .nodes
                    .iter()
                    .map(|n| n.held)
                    .sum();
                seen.fetch_max(held, std::sync::atomic::Ordering::SeqCst);
                if status.changed().await.is_err() {
                    return;
                }
            }
        });
        Self { max, task }
    }

    pub(crate) fn get(&self) -> usize {
        self.max.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for MaxHeld {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until the SDK's nodes satisfy `ready`.
pub(crate) async fn nodes_until(
    sessions: &sluice_sdk::Sessions,
    ready: impl Fn(&[sluice_sdk::NodeStatus]) -> bool,
) -> Vec<sluice_sdk::NodeStatus> {
    let mut status = sessions.subscribe();
    let status = within(status.wait_for(|s| ready(&s.nodes))).await.unwrap();
    status.nodes.clone()
}

/// Waits until the SDK reports `n` registered sessions.
pub(crate) async fn registered(sessions: &sluice_sdk::Sessions, n: usize) {
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.registered == n))
        .await
        .unwrap();
}
