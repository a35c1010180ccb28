//! A fake acceptor of HTTP/2 sessions: it answers every registration with the `101` that names
//! `h2` and then drives the session with hyper's HTTP/2 client, as Sluice does.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_sdk::Options;
use sluice_session::{Hello, Registration, Reply};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{options, read_hello, within};

/// One HTTP/2 session, seen from the proxy's side: `sender` opens streams on it, and aborting
/// `conn` (the client's side of the connection) closes it.
pub(crate) struct Session {
    pub(crate) registration: Registration,
    pub(crate) sender: SendRequest<Full<Bytes>>,
    pub(crate) conn: JoinHandle<()>,
}

pub(crate) enum Event {
    Registered(Session),
    Drain,
}

/// An acceptor that answers every registration with an HTTP/2 session's `101` and every drain
/// with `200` — and closes no session on a drain: the SDK must. Dropping it stops accepting.
pub(crate) struct H2Acceptor {
    pub(crate) addr: SocketAddr,
    pub(crate) events: mpsc::UnboundedReceiver<Event>,
    task: JoinHandle<()>,
}

impl Drop for H2Acceptor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl H2Acceptor {
    pub(crate) async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(connection(stream, tx.clone()));
            }
        });
        Self { addr, events, task }
    }

    pub(crate) async fn next(&mut self) -> Event {
        within(self.events.recv()).await.expect("acceptor stopped")
    }

    pub(crate) async fn session(&mut self) -> Session {
        match self.next().await {
            Event::Registered(session) => session,
            Event::Drain => panic!("expected a registration, got a drain"),
        }
    }
}

async fn connection(mut stream: TcpStream, events: mpsc::UnboundedSender<Event>) {
    let Some(hello) = read_hello(&mut stream).await else {
        return;
    };
    match hello {
        Hello::Register(registration) => {
            stream
                .write_all(&Reply::switching_protocols_h2())
                .await
                .unwrap();
            let io = TokioIo::new(stream);
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            let conn = tokio::spawn(async move {
                let _ = conn.await;
            });
            let _ = events.send(Event::Registered(Session {
                registration,
                sender,
                conn,
            }));
        }
        Hello::Drain(_) => {
            stream.write_all(&Reply::drained()).await.unwrap();
            let _ = stream.shutdown().await;
            let _ = events.send(Event::Drain);
        }
        Hello::Control(..) => panic!("one acceptor: no control link expected"),
    }
}

/// Options for `capacity` HTTP/2 sessions of `streams` streams each, with quick backoff.
pub(crate) fn h2_options(acceptor: SocketAddr, capacity: usize, streams: u32) -> Options {
    let mut options = options(acceptor, capacity);
    options.streams = Some(streams);
    options
}
