//! One exchange of the fast path: the request out on a leased connection (head and body), the
//! response head in (within the cluster's response timeout, once more on a fresh connection
//! when a reused one turns out stale), the response relayed to the client by its framing.
//! Buffers are bounded: 64 KiB per direction.

use std::io;
use std::time::Instant;

use http::Method;
use sluice_wire::h1::{self, Answer, BodyFraming, Chunked, Forward, ParsedResponse, ResponseBody};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::answer::{self, date};
use super::request::{Request, Served};
use crate::error::ProxyError;
use crate::http::IO_BUFFER_BYTES;
use crate::router::Route;
use crate::upstream::static_cluster::raw::RawLease;
use crate::upstream::{is_idempotent, StaticCluster};

/// What an exchange came to, for the connection and for metrics and logs.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Bytes of the caller's buffer used (head and the body bytes it held).
    pub(crate) used: usize,
    pub(crate) served: Served,
    /// The status the client was sent (or would have been).
    pub(crate) status: u16,
    /// The response body's length when known.
    pub(crate) length: Option<u64>,
    /// When the response head was ready.
    pub(crate) head_at: Option<Instant>,
    pub(crate) error: Option<ProxyError>,
}

/// How an attempt to get a response head failed.
enum Failed {
    /// The connection closed or failed before any response byte: a reused one was stale.
    Stale(ProxyError),
    /// Anything else: the client is answered with this error.
    Error(ProxyError),
}

/// One request taken by the fast path, ready to go upstream. Its body (if any) is whole in
/// the client's buffer: the fast path takes no request whose body is still arriving.
pub(crate) struct Exchange<'a> {
    req: &'a Request<'a>,
    route: &'a Route,
    head_request: bool,
    idempotent: bool,
}

impl<'a> Exchange<'a> {
    pub(crate) fn new(req: &'a Request<'a>, route: &'a Route, method: &Method) -> Self {
        Self {
            req,
            route,
            head_request: method == Method::HEAD,
            idempotent: is_idempotent(method),
        }
    }

    /// The bytes of the client's buffer the request occupies (head and body; the fast path
    /// takes only requests whose body is all there).
    fn len(&self) -> usize {
        let head = self.req.head;
        let body = match head.body {
            BodyFraming::Length(n) => usize::try_from(n).unwrap_or(usize::MAX),
            _ => 0,
        };
        head.len.saturating_add(body).min(self.req.buf.len())
    }

    /// Whether the request may go out again after a reused connection failed before any
    /// response byte: idempotent and without a body, the hyper path's rule.
    fn replayable(&self) -> bool {
        self.idempotent && self.len() == self.req.head.len
    }

    /// Runs the exchange to its end.
    pub(crate) async fn run<C>(&self, client: &mut C, cluster: StaticCluster) -> Outcome
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let used = self.len();
        let mut lease = match cluster.lease_raw().await {
            Ok(lease) => lease,
            Err(e) => return self.refuse(client, e, used).await,
        };
        let out = self.upstream_request();
        let mut ubuf = Vec::with_capacity(IO_BUFFER_BYTES);
        let mut retried = false;
        let head = loop {
            match self.attempt(&mut lease, &out, &mut ubuf).await {
                Ok(head) => break head,
                // A reused connection that failed before any response byte was stale: a
                // replayable request goes out once more, on a fresh one.
                Err(Failed::Stale(_)) if !retried && lease.is_reused() && self.replayable() => {
                    retried = true;
                    if let Err(e) = lease.reconnect().await {
                        lease.log_failure(&e);
                        return self.refuse(client, e, used).await;
                    }
                }
                Err(Failed::Stale(e) | Failed::Error(e)) => {
                    lease.log_failure(&e);
                    return self.refuse(client, e, used).await;
                }
            }
        };
        self.respond(client, lease, &ubuf, head, used).await
    }

    /// The request to send upstream: its head with the proxy's edits, then its body.
    fn upstream_request(&self) -> Vec<u8> {
        let (buf, head) = (self.req.buf, self.req.head);
        let forward = Forward {
            client: self.req.client.peer.ip(),
            tls: self.req.client.tls,
            trusted: self.req.client.trusted,
            remove: &self.route.request_headers.remove,
            set: &self.route.request_headers.set,
        };
        let mut out = Vec::with_capacity(self.len() + 256);
        h1::write_head(buf, head, &forward, &mut out);
        out.extend_from_slice(&buf[head.len..self.len()]);
        out
    }

    /// Sends the request and reads the response head into `ubuf`, all within the cluster's
    /// response timeout (as hyper's client path times a request from sending to its head).
    async fn attempt(
        &self,
        lease: &mut RawLease,
        out: &[u8],
        ubuf: &mut Vec<u8>,
    ) -> Result<h1::ResponseHead, Failed> {
        let timeout = lease.response_timeout();
        let head_request = self.head_request;
        let stream = &mut lease.conn.stream;
        let exchange = async move {
            if stream.write_all(out).await.is_err() {
                return Err(Failed::Stale(ProxyError::UpstreamInvalid(
                    "connection failed",
                )));
            }
            read_head(stream, ubuf, head_request).await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_elapsed) => Err(Failed::Error(ProxyError::ResponseTimeout)),
        }
    }

    /// Answers the client with `e` (the request never reached an upstream response).
    async fn refuse<C>(&self, client: &mut C, e: ProxyError, used: usize) -> Outcome
    where
        C: AsyncWrite + Unpin,
    {
        let close = e.closes_connection() || self.closes();
        let bytes = answer::error(&e, close, self.head_request);
        let served = match client.write_all(&bytes).await {
            Ok(()) if !close => Served::KeepAlive,
            _ => Served::Close,
        };
        Outcome {
            used,
            served,
            status: e.status().as_u16(),
            length: None,
            head_at: Some(Instant::now()),
            error: Some(e),
        }
    }

    /// Whether the client connection closes after this exchange: the client asked, or the
    /// server is shutting down (the response then says so, as hyper's does).
    fn closes(&self) -> bool {
        !self.req.head.keep_alive || self.req.shutdown.is_triggered()
    }

    /// Relays the response whose head is in `ubuf`, then gives the connection back.
    async fn respond<C>(
        &self,
        client: &mut C,
        mut lease: RawLease,
        ubuf: &[u8],
        head: h1::ResponseHead,
        used: usize,
    ) -> Outcome
    where
        C: AsyncWrite + Unpin,
    {
        let head_at = Some(Instant::now());
        let close = self.closes() || head.ends_with_close();
        let date = date();
        let answer = Answer {
            head_request: self.head_request,
            close,
            date: date.as_bytes(),
            remove: &self.route.response_headers.remove,
            set: &self.route.response_headers.set,
        };
        let mut out = Vec::with_capacity(head.len + 64);
        h1::write_response_head(ubuf, &head, &answer, &mut out);
        let early = &ubuf[head.len..];
        let relayed = relay_body(&mut lease, client, &head, early, out).await;
        let length = match head.body {
            ResponseBody::Length(n) => Some(n),
            ResponseBody::None => Some(0),
            _ => None,
        };
        let served = match relayed {
            Ok(clean) => {
                lease.release(clean && head.reusable);
                if close {
                    Served::Close
                } else {
                    Served::KeepAlive
                }
            }
            Err(_) => Served::Close,
        };
        Outcome {
            used,
            served,
            status: head.status,
            length,
            head_at,
            error: None,
        }
    }
}

/// Reads until a whole response head is in `ubuf` (informational responses skipped).
async fn read_head<U>(
    upstream: &mut U,
    ubuf: &mut Vec<u8>,
    head_request: bool,
) -> Result<h1::ResponseHead, Failed>
where
    U: AsyncRead + Unpin,
{
    ubuf.clear();
    loop {
        if ubuf.len() == ubuf.capacity() {
            return Err(Failed::Error(ProxyError::UpstreamInvalid(
                "response head too large",
            )));
        }
        match upstream.read_buf(ubuf).await {
            Ok(0) if ubuf.is_empty() => {
                return Err(Failed::Stale(ProxyError::UpstreamInvalid(
                    "closed before responding",
                )))
            }
            Err(_) if ubuf.is_empty() => {
                return Err(Failed::Stale(ProxyError::UpstreamInvalid(
                    "connection failed",
                )))
            }
            Ok(0) | Err(_) => {
                return Err(Failed::Error(ProxyError::UpstreamInvalid(
                    "closed during the response head",
                )))
            }
            Ok(_) => {}
        }
        match h1::parse_response(ubuf, head_request, IO_BUFFER_BYTES) {
            ParsedResponse::Partial => {}
            ParsedResponse::Head(head) => return Ok(head),
            ParsedResponse::Invalid(why) => {
                return Err(Failed::Error(ProxyError::UpstreamInvalid(why)))
            }
        }
    }
}

/// Sends `out` (the response head) and the body: what `early` holds first, then what the
/// upstream sends, by the response's framing. `Ok(true)` when the body ended cleanly with
/// nothing after it (the upstream connection may carry another request).
async fn relay_body<C>(
    lease: &mut RawLease,
    client: &mut C,
    head: &h1::ResponseHead,
    early: &[u8],
    mut out: Vec<u8>,
) -> io::Result<bool>
where
    C: AsyncWrite + Unpin,
{
    let upstream = &mut lease.conn.stream;
    match head.body {
        ResponseBody::None => {
            client.write_all(&out).await?;
            Ok(early.is_empty())
        }
        ResponseBody::Length(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            let now = n.min(early.len());
            out.extend_from_slice(&early[..now]);
            let mut rest = (n - now) as u64;
            if now > 0 || rest == 0 {
                client.write_all(&out).await?;
                out.clear();
            }
            relay_exact(upstream, client, &mut rest, out).await?;
            Ok(early.len() <= n)
        }
        ResponseBody::Chunked => relay_chunked(upstream, client, early, out).await,
        ResponseBody::UntilClose => {
            relay_until_close(upstream, client, early, out, head.http11).await?;
            Ok(false)
        }
    }
}

/// Sends `pending` (a head still unsent, or nothing) with the first of the `rest` bytes the
/// upstream sends, then copies the others: as hyper's server, which writes a head with its
/// body's first bytes, so an upstream that fails before any leaves no half answer.
async fn relay_exact<U, C>(
    upstream: &mut U,
    client: &mut C,
    rest: &mut u64,
    mut pending: Vec<u8>,
) -> io::Result<()>
where
    U: AsyncRead + Unpin,
    C: AsyncWrite + Unpin,
{
    let mut chunk = vec![0u8; IO_BUFFER_BYTES.min(usize::try_from(*rest).unwrap_or(usize::MAX))];
    while *rest > 0 {
        let want = chunk
            .len()
            .min(usize::try_from(*rest).unwrap_or(usize::MAX));
        let n = upstream.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if pending.is_empty() {
            client.write_all(&chunk[..n]).await?;
        } else {
            pending.extend_from_slice(&chunk[..n]);
            client.write_all(&pending).await?;
            pending = Vec::new();
        }
        *rest -= n as u64;
    }
    Ok(())
}

/// Decodes the upstream's chunked body and sends it on re-chunked (extensions and trailer
/// fields dropped, as hyper's server drops them).
async fn relay_chunked<U, C>(
    upstream: &mut U,
    client: &mut C,
    early: &[u8],
    mut out: Vec<u8>,
) -> io::Result<bool>
where
    U: AsyncRead + Unpin,
    C: AsyncWrite + Unpin,
{
    let mut decoder = Chunked::new(IO_BUFFER_BYTES);
    let mut input = early.to_vec();
    let mut chunk = vec![0u8; IO_BUFFER_BYTES];
    // As hyper's server: the head goes out with the first data, so a body refused before any
    // leaves the client without an answer rather than with a head and nothing after it.
    let mut sent_data = false;
    loop {
        let mut at = 0;
        while at < input.len() && !decoder.is_done() {
            let progress = match decoder.feed(&input[at..]) {
                Ok(progress) => progress,
                Err(e) => {
                    if sent_data {
                        client.write_all(&out).await?;
                    }
                    return Err(io::Error::other(e));
                }
            };
            let data = &input[at..][progress.data];
            if !data.is_empty() {
                answer::chunk(&mut out, data);
                sent_data = true;
            }
            at += progress.consumed;
        }
        if decoder.is_done() {
            out.extend_from_slice(b"0\r\n\r\n");
            client.write_all(&out).await?;
            return Ok(at == input.len());
        }
        if sent_data {
            client.write_all(&out).await?;
            out.clear();
        }
        let n = upstream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        input.clear();
        input.extend_from_slice(&chunk[..n]);
    }
}

/// Sends everything until the upstream closes: chunked to an HTTP/1.1 answer, as it comes to
/// an HTTP/1.0 one (whose end is the client connection's).
async fn relay_until_close<U, C>(
    upstream: &mut U,
    client: &mut C,
    early: &[u8],
    mut out: Vec<u8>,
    chunked: bool,
) -> io::Result<()>
where
    U: AsyncRead + Unpin,
    C: AsyncWrite + Unpin,
{
    let mut chunk = vec![0u8; IO_BUFFER_BYTES];
    let mut piece = early.to_vec();
    loop {
        if !piece.is_empty() {
            if chunked {
                answer::chunk(&mut out, &piece);
            } else {
                out.extend_from_slice(&piece);
            }
        }
        client.write_all(&out).await?;
        out.clear();
        let n = upstream.read(&mut chunk).await?;
        if n == 0 {
            if chunked {
                client.write_all(b"0\r\n\r\n").await?;
            }
            return Ok(());
        }
        piece.clear();
        piece.extend_from_slice(&chunk[..n]);
    }
}
