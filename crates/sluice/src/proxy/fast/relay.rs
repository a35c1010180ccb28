//! One exchange of the fast path: the request out on a leased connection (head and body), the
//! response head in (within the cluster's response timeout; again on a fresh connection when a
//! reused one turns out stale, and elsewhere when the cluster's retry policy says so), the
//! response relayed to the client by its framing.
//! Buffers are bounded: 64 KiB per direction.

use std::future::Future;
use std::io;
use std::pin::Pin;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use sluice_wire::h1::{self, Answer, BodyFraming, Forward, ParsedResponse};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, Sleep};

use super::answer::{self, date_at};
use super::body::{self, Sink};
use super::request::{timer_at, Request, Scratch, Served};
use crate::router::Route;
use sluice_core::attempts::{self, Attempts, Ended, Next};
use sluice_core::compression::{self, Decision, ResponseFacts};
use sluice_core::error::ProxyError;
use sluice_core::read_ahead::IO_BUFFER_BYTES;
use sluice_core::read_ahead::{self, ReadAhead};
use sluice_core::retry::{self, is_idempotent, Retries};
use sluice_core::trace_context::TRACEPARENT;
use sluice_upstream::leased::Leased;
use sluice_upstream::ServedBy;

/// What an exchange came to, for the connection and for metrics and logs.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Bytes of the caller's buffer used (head and the body bytes it held).
    pub(crate) used: usize,
    pub(crate) served: Served,
    /// The status the client was sent (or would have been); 0 when it hung up before its
    /// answer.
    pub(crate) status: u16,
    /// The response body's bytes that reached the client (`$body_bytes_sent`).
    pub(crate) sent: u64,
    /// Whether the whole body went out.
    pub(crate) complete: bool,
    /// Who served it upstream (the access log's).
    pub(crate) by: ServedBy,
    /// When the response head was ready.
    pub(crate) head_at: Option<Instant>,
    pub(crate) error: Option<ProxyError>,
}

/// The buffers an exchange's attempts work in (the connection's `Scratch`).
struct Tries<'s> {
    /// The request as it goes upstream.
    request: &'s [u8],
    /// The response head as read.
    ubuf: &'s mut Vec<u8>,
    /// Bytes the client pipelines meanwhile.
    pipelined: &'s mut Vec<u8>,
    timer: &'s mut Option<Pin<Box<Sleep>>>,
}

/// What one attempt at a response head came to.
enum Tried {
    Head(h1::ResponseHead),
    /// How it failed (whether it may go again: `sluice_core::retry`), and the error the client is
    /// answered with if not.
    Failed(retry::Failed, ProxyError),
    /// The client hung up while the answer was awaited.
    ClientGone,
}

/// One request taken by the fast path, ready to go upstream. Its body (if any) is whole in
/// the client's buffer: the fast path takes no request whose body is still arriving.
pub(crate) struct Exchange<'a> {
    req: &'a Request<'a>,
    route: &'a Route,
    head_request: bool,
    idempotent: bool,
    /// When the request was taken: the clock reading its timeouts start from.
    started: Instant,
    /// The request's ID (`[request_id]`), set upstream and in Sluice's own answers.
    id: Option<(&'a HeaderName, &'a HeaderValue)>,
    /// The `traceparent` set upstream (`[tracing]`).
    traceparent: Option<&'a HeaderValue>,
    /// The target the route's rewrite made (`None`: the client's goes upstream).
    target: Option<&'a [u8]>,
}

impl<'a> Exchange<'a> {
    pub(crate) fn new(
        req: &'a Request<'a>,
        route: &'a Route,
        method: &Method,
        started: Instant,
        id: Option<(&'a HeaderName, &'a HeaderValue)>,
        traceparent: Option<&'a HeaderValue>,
    ) -> Self {
        Self {
            req,
            route,
            head_request: method == Method::HEAD,
            idempotent: is_idempotent(method),
            started,
            id,
            traceparent,
            target: None,
        }
    }

    /// The exchange sending `target` upstream instead of the client's (a route's rewrite).
    pub(crate) fn to(self, target: Option<&'a [u8]>) -> Self {
        Self { target, ..self }
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

    /// How the request's body counts for going out again. It is whole in the client's buffer,
    /// but counts as kept only where the hyper path would have it in memory too (a session's,
    /// read ahead): one rule for both.
    fn body<L: Leased>(&self, lease: &L) -> retry::Body {
        let body = self.len() - self.req.head.len;
        if body == 0 || lease.replays_bodies(body) {
            retry::Body::Kept
        } else {
            retry::Body::Streamed
        }
    }

    /// Runs the exchange to its end on what `lease` leases (`client_addr`: a reverse slice's
    /// `Sluice-Client-Addr`, set last with the request's ID and `traceparent`). While the request waits for a lease
    /// or for its answer, the client is watched: bytes it pipelines are kept in `scratch`, and
    /// if it hangs up the request is given up (a place in a queue freed at once; an answer
    /// already asked for read off by a task of its own, so that the connection or session
    /// goes back).
    pub(crate) async fn run<C, L>(
        &self,
        client: &mut C,
        scratch: &mut Scratch,
        lease: impl Future<Output = Result<L, ProxyError>>,
        client_addr: Option<(&str, &[u8])>,
    ) -> Outcome
    where
        C: AsyncRead + AsyncWrite + Unpin,
        L: Leased + 'static,
    {
        let used = self.len();
        let Scratch {
            pipelined,
            request,
            response: ubuf,
            answer,
            spare,
            timer,
            ..
        } = scratch;
        let leased = tokio::select! {
            biased;
            leased = lease => leased,
            () = client_gone(client, pipelined) => return self.abandoned(used),
        };
        let lease = match leased {
            Ok(lease) => lease,
            // Nothing was read past the request or written: hyper's path takes it from here.
            Err(ProxyError::HandedBack) => return self.handed_back(),
            Err(e) => return self.refuse(client, e, used).await,
        };
        self.upstream_request(client_addr, request);
        let tries = Tries {
            request,
            ubuf,
            pipelined,
            timer,
        };
        let (lease, head) = match self.attempts(client, lease, tries).await {
            Ok(answered) => answered,
            Err(outcome) => return outcome,
        };
        let bufs = (std::mem::take(answer), std::mem::take(spare));
        let (outcome, bufs) = self.respond(client, lease, ubuf, head, bufs, used).await;
        (*answer, *spare) = bufs;
        outcome
    }

    /// Attempts the request on `lease`, and on the leases the retry rules grant
    /// (`sluice_core::attempts::drive`, as every data path), until an answer's head is the
    /// client's (with the lease it came on); or how it ended otherwise (refused, or the client
    /// gone).
    async fn attempts<C, L>(
        &self,
        client: &mut C,
        lease: L,
        tries: Tries<'_>,
    ) -> Result<(L, h1::ResponseHead), Outcome>
    where
        C: AsyncRead + AsyncWrite + Unpin,
        L: Leased + 'static,
    {
        let used = self.len();
        // Dropped on return: the budget counts requests until their answer's head, as the hyper
        // path's does.
        let mut retries = Retries::new(lease.retry_policy(), self.idempotent);
        let mut up = Relay {
            ex: self,
            client: &mut *client,
            tries,
            // The first attempt's time runs from when the request was taken (a clock read
            // saved).
            from: Some(self.started),
            leases: std::marker::PhantomData,
        };
        match attempts::drive(&mut up, lease, &mut retries).await {
            Ended::Answered(answered) => Ok((answered.lease, answered.head)),
            Ended::Failed(e) => Err(self.refuse(client, e, used).await),
            Ended::Gone => Err(self.abandoned(used)),
        }
    }

    /// Sends `request` and reads the response head into `ubuf`, both before `timer` fires,
    /// watching the client meanwhile (what it pipelines goes to `pipelined`).
    async fn attempt<C, L>(
        &self,
        client: &mut C,
        lease: &mut L,
        request: &[u8],
        ubuf: &mut Vec<u8>,
        pipelined: &mut Vec<u8>,
        mut timer: Pin<&mut Sleep>,
    ) -> Tried
    where
        C: AsyncRead + Unpin,
        L: Leased,
    {
        let sent = tokio::select! {
            biased;
            sent = lease.io().write_all(request) => sent,
            () = timer.as_mut() => {
                return Tried::Failed(retry::Failed::Later, ProxyError::ResponseTimeout);
            }
        };
        if sent.is_err() {
            let e = ProxyError::UpstreamInvalid("connection failed");
            return Tried::Failed(retry::Failed::BeforeResponse, e);
        }
        ubuf.clear();
        tokio::select! {
            biased;
            head = read_head(lease.io(), ubuf, self.head_request) => match head {
                Ok(head) => Tried::Head(head),
                Err((failed, e)) => Tried::Failed(failed, e),
            },
            () = timer => Tried::Failed(retry::Failed::Later, ProxyError::ResponseTimeout),
            () = client_gone(client, pipelined) => Tried::ClientGone,
        }
    }

    /// The request to send upstream, into `out`: its head with the proxy's edits, then its
    /// body.
    fn upstream_request(&self, client_addr: Option<(&str, &[u8])>, out: &mut Vec<u8>) {
        let (buf, head) = (self.req.buf, self.req.head);
        let id = self.id.map(|(n, v)| (n.as_str(), v.as_bytes()));
        let trace = self.traceparent.map(|v| (TRACEPARENT, v.as_bytes()));
        let mut stamps = [("", &b""[..]); 3];
        let mut n = 0;
        for stamp in [client_addr, id, trace].into_iter().flatten() {
            stamps[n] = stamp;
            n += 1;
        }
        let forward = Forward {
            target: self.target,
            client: self.req.client_ip,
            tls: self.req.client.tls,
            trusted: self.req.client.trusted,
            remove: &self.route.request_headers.remove,
            set: &self.route.request_headers.set,
            stamps: &stamps[..n],
        };
        out.clear();
        h1::write_head(buf, head, &forward, out);
        out.extend_from_slice(&buf[head.len..self.len()]);
    }

    /// The outcome of a request whose client hung up before its answer: nothing more is sent
    /// on the connection, which closes.
    fn abandoned(&self, used: usize) -> Outcome {
        Self::unanswered(used, Served::Close)
    }

    /// The request goes to hyper's path, unanswered here (see [`ProxyError::HandedBack`]).
    fn handed_back(&self) -> Outcome {
        Self::unanswered(0, Served::HandOff("session"))
    }

    /// A request this exchange did not answer, and what follows on its connection.
    fn unanswered(used: usize, served: Served) -> Outcome {
        Outcome {
            used,
            served,
            status: 0,
            sent: 0,
            complete: false,
            by: ServedBy::default(),
            head_at: None,
            error: None,
        }
    }

    /// Answers the client with `e` (the request never reached an upstream response).
    async fn refuse<C>(&self, client: &mut C, e: ProxyError, used: usize) -> Outcome
    where
        C: AsyncWrite + Unpin,
    {
        let close = e.closes_connection() || self.closes();
        let (bytes, body) = answer::error(&e, close, self.head_request, self.id, self.req.fields);
        let status = e.status().as_u16();
        let mut outcome = self
            .write_answer(client, &bytes, (status, body), close, used)
            .await;
        outcome.error = Some(e);
        outcome
    }

    /// Answers the client with a route's fixed response ([`crate::proxy::direct_response`],
    /// its edits applied), or with the error that stood in its way.
    pub(crate) async fn answer<C>(
        &self,
        client: &mut C,
        answered: Result<http::Response<Bytes>, ProxyError>,
    ) -> Outcome
    where
        C: AsyncWrite + Unpin,
    {
        let used = self.len();
        let res = match answered {
            Ok(res) => res,
            Err(e) => return self.refuse(client, e, used).await,
        };
        let close = self.closes();
        let (bytes, body) = answer::render(
            res.status(),
            answer::with_listeners(res.headers(), self.req.fields),
            res.body(),
            close,
            self.head_request,
        );
        let status = res.status().as_u16();
        self.write_answer(client, &bytes, (status, body), close, used)
            .await
    }

    /// Writes an answer of Sluice's own of `status` whose body is `body` bytes long (none of
    /// them sent to `HEAD`).
    async fn write_answer<C>(
        &self,
        client: &mut C,
        bytes: &[u8],
        (status, body): (u16, usize),
        close: bool,
        used: usize,
    ) -> Outcome
    where
        C: AsyncWrite + Unpin,
    {
        let written = async {
            client.write_all(bytes).await?;
            client.flush().await
        };
        let (served, written) = match written.await {
            Ok(()) if !close => (Served::KeepAlive, true),
            Ok(()) => (Served::Close, true),
            Err(_) => (Served::Close, false),
        };
        let sent = if written && !self.head_request {
            body
        } else {
            0
        };
        Outcome {
            used,
            served,
            status,
            sent: sent as u64,
            complete: written,
            by: ServedBy::default(),
            head_at: Some(Instant::now()),
            error: None,
        }
    }

    /// Whether the client connection closes after this exchange: the client asked, it is the
    /// connection's last request, or the server is shutting down (the response then says so,
    /// as hyper's does).
    fn closes(&self) -> bool {
        !self.req.head.keep_alive || self.req.last || self.req.shutdown.is_triggered()
    }

    /// `Vary: Accept-Encoding` for a response that a compressing route would have compressed
    /// for a client that accepted an encoding (one that does goes to hyper's path), unless its
    /// `Vary` says so already; else nothing.
    fn vary(&self, ubuf: &[u8], head: &h1::ResponseHead) -> &'static [u8] {
        let Some(config) = &self.route.compression else {
            return b"";
        };
        let named = |name: &'static [u8]| {
            let fields = head.fields.iter();
            let named = fields.filter(move |f| ubuf[f.name.clone()].eq_ignore_ascii_case(name));
            named.map(|f| &ubuf[f.value.clone()])
        };
        let facts = ResponseFacts {
            status: head.status,
            head_request: self.head_request,
            content_type: named(b"content-type").next(),
            encoded: named(b"content-encoding").next().is_some(),
            no_transform: named(b"cache-control").any(compression::no_transform),
            range: named(b"content-range").next().is_some(),
            length: match head.body {
                h1::ResponseBody::None => Some(0),
                h1::ResponseBody::Length(n) => Some(n),
                h1::ResponseBody::Chunked | h1::ResponseBody::UntilClose => None,
            },
        };
        let vary = compression::decide(config, None, &facts) == Decision::Vary;
        if vary && !compression::varies(named(b"vary")) {
            compression::VARY_LINE
        } else {
            b""
        }
    }

    /// Relays the response whose head is in `ubuf`, gives the lease back as soon as the body
    /// has been read off it, then sends the client what is left. `bufs` are the buffers the
    /// answer is put together in and the upstream read into, given back emptied.
    async fn respond<C, L>(
        &self,
        client: &mut C,
        mut lease: L,
        ubuf: &[u8],
        head: h1::ResponseHead,
        (mut out, spare): (Vec<u8>, Vec<u8>),
        used: usize,
    ) -> (Outcome, (Vec<u8>, Vec<u8>))
    where
        C: AsyncWrite + Unpin,
        L: Leased,
    {
        let now = Instant::now();
        let head_at = Some(now);
        lease.observe_response(head.status, now.saturating_duration_since(self.started));
        let close = self.closes() || head.ends_with_close();
        let date = date_at(now.into_std());
        let answer = Answer {
            head_request: self.head_request,
            close,
            date: date.as_bytes(),
            remove: &self.route.response_headers.remove,
            set: &self.route.response_headers.set,
            append: self.vary(ubuf, &head),
            listener: self.req.fields,
        };
        out.clear();
        h1::write_response_head(ubuf, &head, &answer, &mut out);
        // Events must reach the client as the service sends them: never read ahead.
        let ahead = if body::is_event_stream(ubuf, &head) {
            None
        } else {
            lease.read_ahead().map(ReadAhead::response)
        };
        let mut sink = Sink::new(client, (out, spare), &head, self.head_request, ahead);
        let early = &ubuf[head.len..];
        let relayed = body::relay(lease.io(), &mut sink, &head, early).await;
        let by = lease.served_by();
        let (served, complete) = match relayed {
            Ok(clean) => {
                lease.release(clean && head.reusable);
                match sink.send().await {
                    Ok(()) if !close => (Served::KeepAlive, true),
                    Ok(()) => (Served::Close, true),
                    Err(_) => (Served::Close, false),
                }
            }
            Err(_) if sink.wrote || ahead.is_none() => {
                sink.fail().await;
                (Served::Close, false)
            }
            // A body that failed while it was read ahead, before the client got any of it, is
            // answered 502, as the hyper path answers it.
            Err(e) => {
                let bufs = sink.into_buffers();
                let why = if e.kind() == io::ErrorKind::UnexpectedEof {
                    "closed during the response body"
                } else {
                    "invalid response body"
                };
                let e = ProxyError::UpstreamInvalid(why);
                lease.log_failure(&e);
                drop(lease);
                return (self.refuse(client, e, used).await, bufs);
            }
        };
        let outcome = Outcome {
            used,
            served,
            status: head.status,
            sent: sink.data_sent(complete),
            complete,
            by,
            head_at,
            error: None,
        };
        (outcome, sink.into_buffers())
    }
}

/// One request's attempts on the fast path: the exchange, its client (watched while the
/// request waits), and the buffers the attempts work in.
struct Relay<'x, 'a, C, L> {
    ex: &'x Exchange<'a>,
    client: &'x mut C,
    tries: Tries<'x>,
    /// When the first attempt's time started (later ones start when they do).
    from: Option<Instant>,
    /// What its attempts go out on.
    leases: std::marker::PhantomData<fn(L)>,
}

/// An answer's head, the lease it came on, the deadline it is read off by if a retry replaces
/// it, and how long it took.
struct Answered<L> {
    lease: L,
    head: h1::ResponseHead,
    deadline: Instant,
    elapsed: std::time::Duration,
}

impl<C, L> Relay<'_, '_, C, L>
where
    C: AsyncRead + Unpin,
    L: Leased + 'static,
{
    /// The lease `another` gives, the client watched meanwhile.
    async fn wait(
        &mut self,
        another: impl Future<Output = Result<L, ProxyError>>,
    ) -> Next<L, Answered<L>> {
        tokio::select! {
            biased;
            leased = another => match leased {
                Ok(lease) => Next::Lease(lease),
                Err(e) => Next::Failed(e),
            },
            () = client_gone(self.client, self.tries.pipelined) => Next::Gone,
        }
    }

    /// Reads `answered` off by a task of its own.
    fn read_off(&mut self, answered: Answered<L>) {
        let ubuf = std::mem::take(self.tries.ubuf);
        let Answered {
            lease,
            head,
            deadline,
            ..
        } = answered;
        read_off(lease, ubuf, Some(head), self.ex.head_request, deadline);
    }
}

impl<C, L> Attempts for Relay<'_, '_, C, L>
where
    C: AsyncRead + Unpin,
    L: Leased + 'static,
{
    type Lease = L;
    type Answer = Answered<L>;
    type Back = L;

    async fn attempt(&mut self, mut lease: L) -> attempts::Tried<Answered<L>, L> {
        let from = self.from.take().unwrap_or_else(Instant::now);
        let deadline = from + lease.response_timeout();
        let Tries {
            request,
            ubuf,
            pipelined,
            timer,
        } = &mut self.tries;
        let timer = timer_at(timer, deadline);
        let tried = self
            .ex
            .attempt(self.client, &mut lease, request, ubuf, pipelined, timer)
            .await;
        let body = self.ex.body(&lease);
        match tried {
            Tried::Head(head) => attempts::Tried::Answer {
                status: head.status,
                len: match head.body {
                    h1::ResponseBody::None => Some(0),
                    h1::ResponseBody::Length(n) => Some(n),
                    h1::ResponseBody::Chunked | h1::ResponseBody::UntilClose => None,
                },
                body,
                answer: Answered {
                    lease,
                    head,
                    deadline,
                    elapsed: Instant::now().saturating_duration_since(from),
                },
            },
            Tried::ClientGone => {
                let ubuf = std::mem::take(*ubuf);
                read_off(lease, ubuf, None, self.ex.head_request, deadline);
                attempts::Tried::Gone
            }
            Tried::Failed(failed, error) => attempts::Tried::Failed(attempts::Failure {
                failed,
                error,
                stale: lease.may_be_stale(),
                body,
                refused: false,
                back: lease,
            }),
        }
    }

    /// A reused connection that failed before any response byte was stale: another of the
    /// same upstream will do.
    async fn renew(&mut self, mut lease: L, _: ProxyError) -> Next<L, Answered<L>> {
        match lease.renew().await {
            Ok(()) => Next::Lease(lease),
            Err(e) => {
                lease.log_failure(&e);
                Next::Failed(e)
            }
        }
    }

    /// Elsewhere; this one failed, and goes (a session's place with it) before the request
    /// waits for another.
    async fn elsewhere(&mut self, lease: L, _: ProxyError) -> Next<L, Answered<L>> {
        let another = lease.another();
        drop(lease);
        self.wait(another).await
    }

    /// A static connection is held until the next attempt has its own (if none can be had,
    /// the client gets this answer); a session is read off first, since it is capacity and may
    /// be the one the next attempt needs. The answer is read off by a task of its own either
    /// way.
    async fn replace(&mut self, answered: Answered<L>) -> Next<L, Answered<L>> {
        let lease = &answered.lease;
        lease.observe_response(answered.head.status, answered.elapsed);
        let another = lease.another();
        if lease.frees_first() {
            self.read_off(answered);
            return self.wait(another).await;
        }
        let next = tokio::select! {
            biased;
            leased = another => leased,
            () = client_gone(self.client, self.tries.pipelined) => {
                self.read_off(answered);
                return Next::Gone;
            }
        };
        match next {
            Ok(next) => {
                self.read_off(answered);
                Next::Lease(next)
            }
            Err(_) => Next::Answer(answered),
        }
    }

    fn failed(&mut self, lease: L, error: &ProxyError) {
        lease.log_failure(error);
    }
}

/// Resolves when the client hangs up (or its connection fails) while its request is in the
/// proxy's hands; what it pipelines meanwhile is kept in `extra`, and once that is full the
/// client is no longer watched.
async fn client_gone<C>(client: &mut C, extra: &mut Vec<u8>)
where
    C: AsyncRead + Unpin,
{
    while extra.len() < extra.capacity() {
        match client.read_buf(extra).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    std::future::pending().await
}

/// The answer to a request whose client hung up (or that a retry replaces), read off its
/// connection or session by a task of its own (by the request's deadline, up to
/// `read_ahead::read_off_limit`), so that it goes back to its pool as if the client had read
/// it, as the hyper path does. `ubuf` holds what had come of the answer (all its `head`, when
/// that has been read).
fn read_off<L: Leased + 'static>(
    mut lease: L,
    mut ubuf: Vec<u8>,
    head: Option<h1::ResponseHead>,
    head_request: bool,
    deadline: Instant,
) {
    let limit = read_ahead::read_off_limit(lease.read_ahead()) as u64;
    tokio::spawn(async move {
        let read = async {
            let head = match head {
                Some(head) => head,
                None => read_head(lease.io(), &mut ubuf, head_request).await.ok()?,
            };
            if body::is_event_stream(&ubuf, &head) {
                return None;
            }
            let mut discard = tokio::io::sink();
            let bufs = (Vec::new(), Vec::new());
            let mut sink = Sink::new(&mut discard, bufs, &head, head_request, None);
            let early = &ubuf[head.len..];
            // Past the limit the body seems to end early: a failed relay, and the lease closes.
            let mut upstream = lease.io().take(limit);
            let clean = body::relay(&mut upstream, &mut sink, &head, early)
                .await
                .ok()?;
            Some(clean && head.reusable)
        };
        if let Ok(Some(reusable)) = tokio::time::timeout_at(deadline, read).await {
            lease.release(reusable);
        }
    });
}

/// Reads until a whole response head is in `ubuf` (informational responses skipped).
async fn read_head<U>(
    upstream: &mut U,
    ubuf: &mut Vec<u8>,
    head_request: bool,
) -> Result<h1::ResponseHead, (retry::Failed, ProxyError)>
where
    U: AsyncRead + Unpin,
{
    loop {
        if ubuf.len() == ubuf.capacity() {
            // Grown as needed (most heads fit the first 4 KiB), up to hyper's limit.
            let room = IO_BUFFER_BYTES.saturating_sub(ubuf.capacity());
            if room == 0 {
                let e = ProxyError::UpstreamInvalid("response head too large");
                return Err((retry::Failed::Later, e));
            }
            ubuf.reserve_exact(ubuf.capacity().max(4096).min(room));
        }
        let read = upstream.read_buf(ubuf).await;
        if matches!(read, Ok(0) | Err(_)) {
            return Err(cut_short(&read, ubuf.is_empty()));
        }
        match h1::parse_response(ubuf, head_request, IO_BUFFER_BYTES) {
            ParsedResponse::Partial => {}
            ParsedResponse::Head(head) => return Ok(head),
            ParsedResponse::Invalid(why) => {
                return Err((retry::Failed::Later, ProxyError::UpstreamInvalid(why)))
            }
        }
    }
}

/// How a response head that the upstream's connection ended (`read`) failed: before a whole
/// head, as hyper's client counts it too (its "incomplete message", whether or not bytes came),
/// so the retry rule decides alike on both paths: only an idempotent request goes again after
/// it. `nothing`: no byte came.
fn cut_short(read: &io::Result<usize>, nothing: bool) -> (retry::Failed, ProxyError) {
    let (failed, why) = match (read, nothing) {
        (Ok(_), true) => (retry::Failed::BeforeResponse, "closed before responding"),
        (Err(_), true) => (retry::Failed::BeforeResponse, "connection failed"),
        _ => (
            retry::Failed::BeforeResponse,
            "closed during the response head",
        ),
    };
    (failed, ProxyError::UpstreamInvalid(why))
}
