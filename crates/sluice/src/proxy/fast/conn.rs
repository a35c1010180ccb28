//! An HTTP/1.1 connection (plain, or over TLS) served by the proxy's [`FastPath`] for as long
//! as it takes the requests, then by hyper from the first one it leaves: a head that does not
//! arrive whole in the bytes read so far (slow or large heads, and with them the header timeout
//! and its 408), a request the parser defers, or one routed where the fast path does not go.
//! The hand-over happens at a request boundary with nothing of that request consumed. The
//! server runs it through [`FastHttp1`], the trait it defines.

use std::any::TypeId;
use std::future::{poll_fn, Future};
use std::io;
use std::mem;
use std::pin::Pin;
use std::time::Duration;

use futures_util::FutureExt;
use sluice_net::http::HttpOptions;
use sluice_wire::h1::{self, ClientIp, Parsed};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::{pool, timer_at, FastPath, Request, Scratch, Served};
use sluice_core::ClientInfo;
use sluice_server::fast::{ActiveRequests, Conn, ConnIo, FastHttp1, Left, Serving};
use sluice_server::io::{deadline, poll_read_first};

impl FastHttp1 for FastPath {
    fn serve<'a>(
        &'a self,
        mut io: &'a mut dyn ConnIo,
        conn: Conn<'a>,
        first: Vec<u8>,
    ) -> Serving<'a> {
        // The server's read (the sniff's, an idle connection's next request): into a buffer of
        // the pool, which reads on where it ends.
        let mut held = Held::default();
        if !first.is_empty() {
            held.buf = pool::read_buffer();
            held.buf.extend_from_slice(&first);
        }
        Box::pin(async move { serve(&mut io, self, conn, &mut held).await })
    }

    fn service_type(&self) -> TypeId {
        self.service
    }
}

/// How long a connection waits for its next request with its fast-path state (the client's
/// address as text, its timer, its wait for the shutdown, room for a request's state) before
/// it gives that back ([`Left::Idle`]) and the server waits on with only its own: long enough
/// that a busy connection keeps it from one request to the next, short enough that one left
/// idle by its client soon costs only what an idle connection must. A header timeout shorter
/// than this ends the wait first (and the server closes the connection).
pub(crate) const IDLE_AFTER: Duration = Duration::from_millis(500);

/// What a connection holds: the client's bytes (a pool buffer while a head is read or
/// pipelined bytes wait; a copy of their own size while a small request is served) and its
/// [`Scratch`], whose buffers are lent only while a request is in flight.
#[derive(Default)]
struct Held {
    buf: Vec<u8>,
    scratch: Scratch,
}

/// Serves requests on `io` until the connection ends, a request is handed over, or no request
/// comes for [`IDLE_AFTER`] (or the shutdown comes while it waits). The client's bytes and the
/// request's buffers are lent from the worker's pool when a request begins and given back when
/// the connection goes idle (the client's, for a small request, once it is read:
/// [`own_copy`]): between requests it holds no buffer.
async fn serve<I>(io: &mut I, fast: &FastPath, conn: Conn<'_>, held: &mut Held) -> Left
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let Conn {
        info,
        http,
        signal,
        active,
        fields,
    } = conn;
    let Held { buf, scratch } = held;
    // The client's address as the upstream is told it, formatted once for all its requests.
    let client_ip = ClientIp::new(info.peer.ip());
    let client_addr = sluice_session::client_addr_value(info.peer);
    // One wait for the shutdown serves every wait for a request, as one timer does: a wait
    // made per request cost a registration with the signal and its removal each time. Once
    // it resolves, the connection is left to the server: it is never polled again.
    let shutdown = signal.wait();
    tokio::pin!(shutdown);
    loop {
        if buf.is_empty() {
            let waits = (shutdown.as_mut(), &mut scratch.timer);
            match next_bytes(io, buf, http, waits).await {
                Wait::Bytes => {}
                Wait::End => return Left::Done,
                Wait::Idle(since) => return Left::Idle(since),
            }
        }
        let head = match parse(io, buf, http, info).await {
            Parsed::Take(head) => head,
            Parsed::Defer(why) => return hand_over(fast, active, buf, why.as_str()),
            Parsed::Partial => return hand_over(fast, active, buf, "partial_head"),
        };
        let guard = active.begin();
        let pooled = own_copy(buf);
        let req = Request {
            last: active.at_limit(),
            buf,
            head: &head,
            client: info,
            client_ip: &client_ip,
            client_addr: &client_addr,
            shutdown: signal,
            fields,
        };
        scratch.lend();
        // Boxed: the exchange's state (kilobytes of relay futures) exists while a request is in
        // flight, not for as long as the connection.
        let served = Box::pin(fast.serve(io, req, scratch)).await;
        match served {
            (_, Served::HandOff(_)) => {
                guard.given_back();
                active.handed_over();
                buf.append(&mut scratch.pipelined);
                scratch.give_back();
                return Left::HandOff(mem::take(buf));
            }
            (_, Served::Close) => {
                scratch.give_back();
                pool::give_read_buffer(mem::take(buf));
                return Left::Done;
            }
            (used, Served::KeepAlive) => keep_alive(buf, scratch, used, pooled),
        }
    }
}

/// Leaves the connection to hyper from the request in `buf` on, counting why.
fn hand_over(
    fast: &FastPath,
    active: &ActiveRequests,
    buf: &mut Vec<u8>,
    why: &'static str,
) -> Left {
    fast.hand_off(why);
    active.handed_over();
    Left::HandOff(mem::take(buf))
}

/// After a request whose `used` bytes were answered: what follows it (bytes the client
/// pipelined) is kept for the next one, in a buffer of the pool's (`pooled`: `buf` is one),
/// and the request's buffers go back.
fn keep_alive(buf: &mut Vec<u8>, scratch: &mut Scratch, used: usize, pooled: bool) {
    buf.drain(..used);
    buf.append(&mut scratch.pipelined);
    scratch.give_back();
    if buf.is_empty() {
        pool::give_read_buffer(mem::take(buf));
    } else if !pooled {
        // A next request is there: parsed on in a buffer with the pool's room.
        let mut lent = pool::read_buffer();
        lent.extend_from_slice(buf);
        *buf = lent;
    }
}

/// A request is served from a copy of its own bytes when they, with whatever came with them
/// (pipelined bytes), are no more than this.
const OWN_COPY_BYTES: usize = 4 * 1024;

/// Gives the pool's buffer back while a small request is served, its bytes kept in a copy of
/// their size: an exchange may last as long as its client takes to read the response (500
/// slow clients held 500 × 64 KiB this way), and the head's fields, which routing, the
/// response and the access log read, are ranges into these bytes until it ends. Whether `buf`
/// is still the pool's.
fn own_copy(buf: &mut Vec<u8>) -> bool {
    if buf.len() > OWN_COPY_BYTES {
        return true;
    }
    let lent = mem::replace(buf, buf.as_slice().to_vec());
    pool::give_read_buffer(lent);
    false
}

/// Parses the head at the start of `buf`, reading on while more bytes are already there (the
/// rest of a head split across reads: after the HTTP/2 sniff, for one); a head that would need
/// a wait is left to hyper, whose header timeout covers it.
async fn parse<I>(io: &mut I, buf: &mut Vec<u8>, http: &HttpOptions, info: &ClientInfo) -> Parsed
where
    I: AsyncRead + Unpin,
{
    loop {
        let parsed = h1::parse_request(buf, http.max_header_bytes, info.rules);
        if parsed != Parsed::Partial || buf.len() == buf.capacity() {
            return parsed;
        }
        match io.read_buf(buf).now_or_never() {
            Some(Ok(n)) if n > 0 => {}
            _ => return parsed,
        }
    }
}

/// How a wait for a request's first bytes ended.
enum Wait {
    /// They came.
    Bytes,
    /// The connection ends: closed or failed.
    End,
    /// None came within [`IDLE_AFTER`] (or the header timeout, if shorter) of the wait's start
    /// (the instant given), or the shutdown came: the server waits on for them, and holds the
    /// header timeout and what a shutdown leaves of the connection.
    Idle(Instant),
}

/// Waits for the next request's first bytes, for up to [`IDLE_AFTER`] (or the header timeout,
/// when that is shorter: the server then closes the connection at once) and until the
/// shutdown.
///
/// `waits`: the connection's wait for the shutdown and its timer.
async fn next_bytes<I, S>(
    io: &mut I,
    buf: &mut Vec<u8>,
    http: &HttpOptions,
    (shutdown, timer): (Pin<&mut S>, &mut Option<Pin<Box<Sleep>>>),
) -> Wait
where
    I: AsyncRead + Unpin,
    S: Future<Output = ()>,
{
    let came = |read: io::Result<usize>| match read {
        Ok(n) if n > 0 => Wait::Bytes,
        _ => Wait::End,
    };
    // The socket is read first: when the request is there (sent with the connect, pipelined,
    // or a head the sniff read), no timer is set and the shutdown is not polled at all.
    if let Some(read) = read_lent(io, buf).now_or_never() {
        return came(read);
    }
    // hyper's header timer runs from the moment it waits for a head, on a new connection and
    // between requests alike: a client that does not begin one within it is closed silently
    // (by the server, which is given the wait's start). The connection's one timer is moved
    // for each wait.
    let since = Instant::now();
    let until = deadline(since, IDLE_AFTER.min(http.request_header_timeout));
    tokio::select! {
        biased;
        read = read_lent(io, buf) => came(read),
        () = timer_at(timer, until) => Wait::Idle(since),
        () = shutdown => Wait::Idle(since),
    }
}

/// Reads a request's first bytes into `buf`, which holds no allocation: they are read onto the
/// stack ([`poll_read_first`]) and copied into a buffer lent from the worker's pool (the rest
/// of a longer head is read into that by [`parse`]). An idle connection waits for its next
/// request with no buffer.
async fn read_lent<I>(io: &mut I, buf: &mut Vec<u8>) -> io::Result<usize>
where
    I: AsyncRead + Unpin,
{
    poll_fn(|cx| {
        poll_read_first(io, cx, |bytes| {
            *buf = pool::read_buffer();
            buf.extend_from_slice(bytes);
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;
    use std::sync::Arc;

    use sluice_net::shutdown::Shutdown;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// An upstream that answers every request on a connection with `answer`.
    async fn upstream(answer: &'static [u8]) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0; 4096];
            while conn.read(&mut buf).await.unwrap() > 0 {
                if conn.write_all(answer).await.is_err() {
                    return;
                }
            }
        });
        addr
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

    /// A fast path to `upstream()`, and what it is given with a connection.
    struct Setup {
        fast: FastPath,
        info: ClientInfo,
        http: HttpOptions,
        _shutdown: Shutdown,
        signal: sluice_net::shutdown::ShutdownSignal,
        active: Arc<ActiveRequests>,
    }

    impl Setup {
        async fn to_upstream() -> Self {
            Self::answering(OK).await
        }

        async fn answering(answer: &'static [u8]) -> Self {
            let text = format!(
                "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\n\
                 [[route]]\ncluster = \"b\"\n\
                 [cluster.b]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
                upstream(answer).await
            );
            let config = sluice_config::parse_str(&text, "t.toml", Path::new(".")).unwrap();
            let shutdown = Shutdown::new();
            Self {
                fast: crate::Proxy::bind(&config).await.unwrap().fast_path(),
                info: ClientInfo::default(),
                http: config.listeners[0].http.clone(),
                signal: shutdown.signal(),
                _shutdown: shutdown,
                active: Arc::new(ActiveRequests::default()),
            }
        }

        fn conn(&self) -> Conn<'_> {
            Conn {
                info: &self.info,
                http: &self.http,
                signal: &self.signal,
                active: &self.active,
                fields: &[],
            }
        }
    }

    /// Reads the answer `OK` to one request.
    async fn read_answer(client: &mut tokio::io::DuplexStream) {
        let (mut answer, mut got) = (vec![0; 1024], Vec::new());
        while !got.ends_with(b"\r\n\r\nok") {
            let n = client.read(&mut answer).await.unwrap();
            got.extend_from_slice(&answer[..n]);
        }
    }

    /// A connection whose client sends no next request for [`IDLE_AFTER`] is given back to
    /// the server (which waits on, with the header timeout's rest): what the fast path holds
    /// for it goes with its future.
    #[tokio::test]
    async fn a_connection_with_no_next_request_is_given_back_to_the_server() {
        let setup = Setup::to_upstream().await;
        let conn = setup.conn();
        let (mut client, mut io) = tokio::io::duplex(64 * 1024);
        let first = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        let serving = FastHttp1::serve(&setup.fast, &mut io, conn, first);
        let answered = async {
            read_answer(&mut client).await;
        };
        let (left, ()) = tokio::join!(serving, answered);
        assert!(matches!(left, Left::Idle(_)), "{left:?}");
    }

    #[tokio::test]
    async fn an_idle_connection_holds_no_buffer_after_its_request() {
        let setup = Setup::to_upstream().await;
        let conn = setup.conn();
        let (mut client, mut io) = tokio::io::duplex(64 * 1024);
        let mut held = Held::default();
        let exchange = async {
            client
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            read_answer(&mut client).await;
            // The connection is idle now: one more turn lets it reach its wait for the next.
            tokio::task::yield_now().await;
        };
        tokio::select! {
            biased;
            () = exchange => {}
            left = serve(&mut io, &setup.fast, conn, &mut held) => panic!("ended: {left:?}"),
        }
        assert_eq!(
            held.buf.capacity(),
            0,
            "the client's read buffer is kept while idle"
        );
        assert!(held.scratch.holds_no_buffer(), "{:?}", held.scratch);
    }

    /// While a response is relayed, for as long as its client takes to read it, the
    /// connection holds no buffer of the pool's size for the client's bytes: a small request
    /// is served from a copy of its own size.
    #[tokio::test]
    async fn a_response_being_relayed_holds_no_read_buffer_of_the_pool() {
        static LONG: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\nbody";
        let setup = Setup::answering(LONG).await;
        let conn = setup.conn();
        // The upstream sends the head and 4 bytes of 100 MB, then nothing: the exchange goes
        // on for as long as it stalls (as it would for a client that reads slowly).
        let (mut client, mut io) = tokio::io::duplex(1024);
        let mut held = Held::default();
        let kept = pool::kept_read_buffers();
        let exchange = async {
            client
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut first = [0; 12];
            client.read_exact(&mut first).await.unwrap();
            assert_eq!(&first, b"HTTP/1.1 200");
            pool::kept_read_buffers()
        };
        let during = tokio::select! {
            biased;
            during = exchange => during,
            left = serve(&mut io, &setup.fast, conn, &mut held) => panic!("ended: {left:?}"),
        };
        // The buffer the request was read into is back in the pool (one more than before, or
        // the one the pool lent back), and the connection holds a copy of the request's size.
        assert_eq!(
            during,
            kept.max(1),
            "the pool's buffer is held through the response"
        );
        assert!(
            held.buf.capacity() <= OWN_COPY_BYTES,
            "{}",
            held.buf.capacity()
        );
    }
}
