//! Connections to the acceptor (or to one node of many): TCP (no Nagle, keepalive), UNIX or
//! TLS, then the registration (HTTP/1.1 or HTTP/2), drain or control-link handshake of
//! `protocol/README.md`, bounded by `handshake_timeout`.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sluice_session::{parse_reply, Drain, Parsed, Registration, Reply, SplitBy};
use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;

use crate::error::Error;
use crate::options::{Acceptor, Options};
use sluice_session::Prefixed;

/// How long a session may sit silent before the kernel starts probing it.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);

/// Any byte stream to the acceptor.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A registered session: the stream, with bytes read past the `101` put back in front.
pub(crate) type SessionIo = Prefixed<Box<dyn Io>>;

/// Where a connection goes: the one acceptor of the options, or one node of many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Acceptor,
    Node(SocketAddr),
}

/// A control link's answer (many nodes).
pub(crate) enum Control {
    /// `101`: the link is up; `rest` holds its first lines.
    Up { io: Box<dyn Io>, rest: Bytes },
    /// `400`: an acceptor without control links.
    Unsupported,
}

/// A registered session and the acceptor's address on it (`None` over a UNIX socket).
pub(crate) struct Registered {
    pub(crate) io: SessionIo,
    pub(crate) peer: Option<SocketAddr>,
}

fn registration(options: &Options, capacity: usize) -> Registration {
    Registration {
        identity: options.identity.clone(),
        capacity: Some(u32::try_from(capacity).unwrap_or(u32::MAX)),
        streams: options.streams,
    }
}

/// Dials and registers one session; `capacity` goes into `Sluice-Capacity`, and
/// [`Options::streams`] makes it an HTTP/2 one, whose `101` must say `Sluice-Protocol: h2`.
pub(crate) async fn register(
    options: &Options,
    to: Endpoint,
    capacity: usize,
) -> Result<Registered, Error> {
    let registration = registration(options, capacity);
    within(options.handshake_timeout, async {
        let (mut io, peer) = connect(options, to).await?;
        send(&mut io, &registration.encode()).await?;
        let h2 = registration.streams.is_some();
        match read_reply(&mut io).await? {
            (Reply::Switched, rest) if !h2 => Ok(Registered {
                io: Prefixed::new(rest, io),
                peer,
            }),
            (Reply::SwitchedH2, rest) if h2 => Ok(Registered {
                io: Prefixed::new(rest, io),
                peer,
            }),
            // An acceptor older than HTTP/2 sessions: never speak HTTP/2 to it.
            (Reply::Switched, _) => Err(Error::Http2Unsupported),
            (Reply::SwitchedH2, _) => Err(unexpected(
                "an HTTP/2 session's 101 to an HTTP/1.1 registration",
            )),
            (Reply::Refused(status), rest) => Err(refused(&mut io, status, rest).await),
            (Reply::Drained, _) => Err(unexpected("200 to a registration")),
            (Reply::Control, _) => Err(unexpected("a control link's 101 to a registration")),
        }
    })
    .await
}

/// Dials a node's control link (`GET /.sluice/v1/control`); `capacity` goes into
/// `Sluice-Capacity`, and `Sluice-Split: service` asks the node for `FLOOR` lines. A `400` is an acceptor without control links, not an error.
pub(crate) async fn control(
    options: &Options,
    node: SocketAddr,
    capacity: usize,
) -> Result<Control, Error> {
    // This SDK keeps its floor per service: nodes say where they count on it (`FLOOR`).
    let request = registration(options, capacity).encode_control_split(SplitBy::Service);
    within(options.handshake_timeout, async {
        let (mut io, _) = connect(options, Endpoint::Node(node)).await?;
        send(&mut io, &request).await?;
        match read_reply(&mut io).await? {
            (Reply::Control, rest) => Ok(Control::Up { io, rest }),
            (Reply::Refused(400), _) => Ok(Control::Unsupported),
            (Reply::Refused(status), rest) => Err(refused(&mut io, status, rest).await),
            (Reply::Switched | Reply::SwitchedH2, _) => {
                Err(unexpected("a session's 101 to a control request"))
            }
            (Reply::Drained, _) => Err(unexpected("200 to a control request")),
        }
    })
    .await
}

/// Sends `POST /.sluice/v1/drain` for the instance on a new connection and expects `200`.
pub(crate) async fn drain(options: &Options, to: Endpoint) -> Result<(), Error> {
    let drain = Drain {
        identity: options.identity.clone(),
    };
    within(options.handshake_timeout, async {
        let (mut io, _) = connect(options, to).await?;
        send(&mut io, &drain.encode()).await?;
        match read_reply(&mut io).await? {
            (Reply::Drained, _) => Ok(()),
            (Reply::Refused(status), rest) => Err(refused(&mut io, status, rest).await),
            (Reply::Switched | Reply::SwitchedH2 | Reply::Control, _) => {
                Err(unexpected("101 to a drain request"))
            }
        }
    })
    .await
}

async fn within<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| Error::Timeout(limit))?
}

/// Connects (and shakes TLS hands); returns the stream and its peer's address, if TCP. A
/// node is checked against the TLS options' server name as the one acceptor is.
async fn connect(
    options: &Options,
    to: Endpoint,
) -> Result<(Box<dyn Io>, Option<SocketAddr>), Error> {
    let connect_error = |e: io::Error| Error::Connect {
        acceptor: match to {
            Endpoint::Acceptor => options.acceptor.to_string(),
            Endpoint::Node(addr) => addr.to_string(),
        },
        source: Arc::new(e),
    };
    let (io, peer): (Box<dyn Io>, _) = match (to, &options.acceptor) {
        (Endpoint::Node(addr), _) => {
            let stream = connect_tcp(addr).await.map_err(connect_error)?;
            (Box::new(stream), Some(addr))
        }
        (Endpoint::Acceptor, Acceptor::Tcp(addr)) => {
            let stream = connect_tcp(addr.as_str()).await.map_err(connect_error)?;
            let peer = stream.peer_addr().ok();
            (Box::new(stream), peer)
        }
        (Endpoint::Acceptor, Acceptor::Unix(path)) => {
            let stream = UnixStream::connect(path).await.map_err(connect_error)?;
            (Box::new(stream), None)
        }
        (Endpoint::Acceptor, many) => {
            return Err(Error::Config(format!("{many} names many nodes; dial one")))
        }
    };
    let Some(tls) = &options.tls else {
        return Ok((io, peer));
    };
    let tls_io = TlsConnector::from(tls.config.clone())
        .connect(tls.server_name.clone(), io)
        .await
        .map_err(|e| Error::Tls(Arc::new(e)))?;
    Ok((Box::new(tls_io), peer))
}

async fn connect_tcp(addr: impl tokio::net::ToSocketAddrs) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    // A session idles for long stretches; keepalive finds one whose peer vanished.
    SockRef::from(&stream).set_tcp_keepalive(&TcpKeepalive::new().with_time(KEEPALIVE_IDLE))?;
    Ok(stream)
}

async fn send(io: &mut Box<dyn Io>, bytes: &[u8]) -> Result<(), Error> {
    io.write_all(bytes).await?;
    // TLS holds records until flushed.
    io.flush().await?;
    Ok(())
}

/// Reads the answer's head; returns it with whatever was read past it.
async fn read_reply(io: &mut Box<dyn Io>) -> Result<(Reply, Bytes), Error> {
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        if io.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the acceptor closed the connection before answering",
            )
            .into());
        }
        // `parse_reply` bounds the head, so `buf` cannot grow without limit.
        if let Parsed::Complete(reply, len) = parse_reply(&buf).map_err(Error::Protocol)? {
            return Ok((reply, buf.split_off(len).freeze()));
        }
    }
}

/// The longest reason read from a refusal's body.
const MAX_REASON: usize = 512;

/// How long to wait for a refusal's reason after its head: an acceptor sends both at once, and
/// anything else may never end its body.
const REASON_WAIT: Duration = Duration::from_millis(250);

/// A refusal with the acceptor's reason: the first line of its body (the acceptor sends one
/// line and closes), at most [`MAX_REASON`] bytes of printable text.
async fn refused(io: &mut Box<dyn Io>, status: u16, rest: Bytes) -> Error {
    let mut body = rest.to_vec();
    let mut chunk = [0u8; MAX_REASON];
    let read = async {
        while body.len() < MAX_REASON && !body.contains(&b'\n') {
            match io.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(REASON_WAIT, read).await;
    body.truncate(MAX_REASON);
    let text = String::from_utf8_lossy(&body);
    let line = text.lines().next().unwrap_or("").trim();
    let reason: String = line.chars().filter(|c| !c.is_control()).collect();
    Error::Refused {
        status,
        reason: if reason.is_empty() {
            "(no reason given)".to_owned()
        } else {
            reason
        },
    }
}

fn unexpected(what: &str) -> Error {
    Error::Protocol(sluice_session::Rejection::bad_request(what))
}
