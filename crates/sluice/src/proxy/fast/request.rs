//! What the server hands the fast path ([`Request`], and a connection's [`Scratch`]) and what
//! it gets back ([`Served`]).

use std::mem;
use std::pin::Pin;

use sluice_net::shutdown::ShutdownSignal;
use sluice_wire::h1::{ClientIp, RequestHead};
use tokio::time::{Instant, Sleep};

use crate::metrics::RouteCounters;
use sluice_core::read_ahead::IO_BUFFER_BYTES;
use sluice_core::ClientInfo;

use super::pool;

/// What became of a request the fast path was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// Answered; the connection may carry another request.
    KeepAlive,
    /// Answered (or the client went away); the connection closes.
    Close,
    /// Not for the fast path (and why): nothing was read or written, hyper serves it.
    HandOff(&'static str),
}

/// A request the fast path took, with what routing and logging need.
pub(crate) struct Request<'a> {
    /// The client's bytes, starting with the head.
    pub(crate) buf: &'a [u8],
    /// The parsed head.
    pub(crate) head: &'a RequestHead,
    /// The connection's client.
    pub(crate) client: &'a ClientInfo,
    /// The client's address as the forwarding fields name it (formatted once per connection).
    pub(crate) client_ip: &'a ClientIp,
    /// The client's address as a session's `Sluice-Client-Addr` carries it (likewise).
    pub(crate) client_addr: &'a str,
    /// The server's shutdown: once triggered, responses close their connection.
    pub(crate) shutdown: &'a ShutdownSignal,
    /// Whether it is the connection's last (`max_requests_per_connection`): its response
    /// closes the connection.
    pub(crate) last: bool,
    /// Fields the listener puts on every answer, over any of the same name (`Alt-Svc`).
    pub(crate) fields: &'a [(http::HeaderName, http::HeaderValue)],
}

/// What a client connection's fast-path requests work in. The buffers are lent from the
/// worker's pool ([`lend`](Self::lend)) while a request is in flight and given back after it
/// ([`give_back`](Self::give_back)): an idle connection holds none. Each stays within what one
/// request needs (64 KiB and some); one that grew past that (a session's long read-ahead) is
/// freed rather than kept. The timer and the metrics handle stay with the connection.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Bytes the client pipelines while a request waits (up to [`PIPELINED_BYTES`]).
    pub(crate) pipelined: Vec<u8>,
    /// The request as it goes upstream.
    pub(super) request: Vec<u8>,
    /// The response head as read, and what came with it.
    pub(super) response: Vec<u8>,
    /// The answer to the client as it is put together.
    pub(super) answer: Vec<u8>,
    /// The upstream's reads of a body, while the client takes the answer.
    pub(super) spare: Vec<u8>,
    /// The connection's one timer: its response timer while a request is in flight, its wait
    /// for the next between requests (up to `IDLE_AFTER`, or the header timeout if shorter;
    /// never both at once).
    pub(super) timer: Option<Pin<Box<Sleep>>>,
    /// The metrics of the route the connection's last request took.
    pub(super) counted: Option<RouteCounters>,
}

/// How much a client may pipeline while its request waits before the proxy stops reading it
/// (and with that, stops noticing a hang-up until the answer).
const PIPELINED_BYTES: usize = 8 * 1024;

impl Scratch {
    /// Ready for a request: its buffers lent from the worker's pool, with room to keep what
    /// the client pipelines.
    pub(crate) fn lend(&mut self) {
        let [pipelined, request, response, answer, spare] = pool::set();
        (self.pipelined, self.request, self.response) = (pipelined, request, response);
        (self.answer, self.spare) = (answer, spare);
        self.pipelined.reserve(PIPELINED_BYTES);
    }

    /// After a request (what the client pipelined taken out of `pipelined` first): its buffers
    /// go back to the worker's pool, except those that grew past what one request needs.
    pub(crate) fn give_back(&mut self) {
        let mut set = [
            mem::take(&mut self.pipelined),
            mem::take(&mut self.request),
            mem::take(&mut self.response),
            mem::take(&mut self.answer),
            mem::take(&mut self.spare),
        ];
        for buf in &mut set {
            if buf.capacity() > 2 * IO_BUFFER_BYTES {
                *buf = Vec::new();
            }
        }
        pool::give_set(set);
    }

    /// Whether it holds no buffer (as between requests).
    #[cfg(test)]
    pub(crate) fn holds_no_buffer(&self) -> bool {
        let bufs = [
            &self.pipelined,
            &self.request,
            &self.response,
            &self.answer,
            &self.spare,
        ];
        bufs.iter().all(|b| b.capacity() == 0)
    }
}

/// A connection's timer (its response timer, its wait for a request), set to `deadline`. One timer
/// serves all of a connection's requests: moving it later is a store, where a timer per
/// request would be entered into and taken out of Tokio's timer wheel every time.
pub(crate) fn timer_at(timer: &mut Option<Pin<Box<Sleep>>>, deadline: Instant) -> Pin<&mut Sleep> {
    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
    timer.as_mut().reset(deadline);
    timer.as_mut()
}
