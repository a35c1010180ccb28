"""One HTTP/2 server connection (h2) running an ASGI 3 application, many requests at once.

Used for HTTP/2 sessions (protocol/README.md "HTTP/2 sessions"): after the ``101`` Sluice is the
client with prior knowledge (it sends the connection preface) and opens up to
``Sluice-Streams`` streams at once; this side is the server, and each stream is one ASGI
``http`` request with ``http_version`` ``"2"``. Bodies stream both ways under HTTP/2 flow
control: a request body is acknowledged (its window reopened) only as the application
``receive()``\\ s it, and a response body is sent no faster than the client's windows allow.
A stream the client resets cancels the application's task for it (after which its
``receive()`` returns ``http.disconnect``).

Ending: :meth:`H2Connection.begin_close` is the graceful shutdown of RFC 9113 §6.8 — a
``GOAWAY`` naming the largest stream id and a ``PING``, then, once the ``PING`` is answered
(every stream the client opened before it saw the first ``GOAWAY`` has arrived), a ``GOAWAY``
naming the last stream taken; in-flight streams finish, and the connection closes when none is
left. The ``GOAWAY`` frames are written by this module (hyperframe) rather than by h2, whose
connection state machine refuses to send anything after its own ``close_connection()``; for
the same reason the client's ``GOAWAY`` does not close h2's state here (:class:`_StateMachine`).
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import StreamReader, StreamWriter
from collections import deque
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from .asgi import ASGIApp, Message, Peer, Scope, http_scope
from .server import Hooks

log = logging.getLogger("sluice_sdk")

READ_SIZE = 65536
#: Each stream's receive window: the request body bytes that may wait for the application's
#: ``receive()`` (the client sends no more until it reads them).
STREAM_WINDOW = 256 * 1024
#: The connection's receive window, shared by its streams.
CONNECTION_WINDOW = 1024 * 1024
MAX_STREAM_ID = 2**31 - 1
#: Seconds to wait for the ``PING`` of a graceful close before sending the final ``GOAWAY``.
PING_WAIT = 1.0
_PING = b"sluice-g"
#: Response fields HTTP/2 forbids (RFC 9113 §8.2.2); dropped from the application's.
_CONNECTION_SPECIFIC = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                        b"upgrade"}


_Open = h2.connection.ConnectionState.SERVER_OPEN


class _StateMachine(h2.connection.H2ConnectionStateMachine):
    """h2's connection states, except that the client's ``GOAWAY`` leaves the connection open:
    it ends new streams only, and those in flight still receive data and send their responses
    (RFC 9113 §6.8), which h2 alone would refuse once it has seen one."""

    _transitions = {**h2.connection.H2ConnectionStateMachine._transitions,
                    (_Open, h2.connection.ConnectionInputs.RECV_GOAWAY): (None, _Open)}


class _Gone(Exception):
    """The peer went away or broke HTTP/2; the connection ends."""


class H2Connection:
    """Serves ``app`` on one HTTP/2 connection, at most ``streams`` requests at once (advertised
    as ``SETTINGS_MAX_CONCURRENT_STREAMS``), until the peer closes it or a graceful close
    ends. ``hooks.response_starting()`` returning ``True`` (a retirement) begins a graceful
    close; ``upgraded`` is never called (no WebSocket over HTTP/2)."""

    def __init__(self, app: ASGIApp, reader: StreamReader, writer: StreamWriter, streams: int,
                 hooks: Hooks | None = None, peer: Peer | None = None) -> None:
        self.app = app
        self.reader = reader
        self.writer = writer
        self.hooks = hooks
        self.peer = peer if peer is not None else Peer()
        config = h2.config.H2Configuration(client_side=False, header_encoding=None,
                                           normalize_inbound_headers=False)
        self.conn = h2.connection.H2Connection(config)
        self.conn.state_machine = _StateMachine()
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: streams,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        })
        self.streams: dict[int, _Stream] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        #: A graceful close began (our first ``GOAWAY``) or the peer sent ``GOAWAY``.
        self.closing = False
        #: The last stream taken, once the final ``GOAWAY`` went out; later ones are refused.
        self.last_stream_id: int | None = None
        #: The most streams open at once so far (for tests and curiosity).
        self.peak = 0
        self._final_timer: asyncio.TimerHandle | None = None
        #: The server's SETTINGS went out: a GOAWAY may follow (before, it waits for them).
        self._started = False

    # -- what a session's slot asks ------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No stream is open: closing now loses no request (one on its way is refused by the
        graceful close, and the client may retry it)."""
        return not self.streams and not self.closing

    def close_idle(self) -> bool:
        """Begins a graceful close if no stream is open; ``True`` if it did."""
        if not self.idle:
            return False
        self.begin_close()
        return True

    def begin_close(self) -> None:
        """The graceful close (see the module's doc): no new streams, in-flight ones finish."""
        if self.closing:
            return
        self.closing = True
        if self._started:
            self._goaway_and_ping()

    def _goaway_and_ping(self) -> None:
        if self.writer.is_closing():
            return
        self._goaway(MAX_STREAM_ID)
        try:
            self.conn.ping(_PING)
        except h2.exceptions.ProtocolError:
            pass
        self.flush()
        self._final_timer = asyncio.get_running_loop().call_later(PING_WAIT, self._final_goaway)

    # -- the connection ------------------------------------------------------------------

    async def serve(self, initial: bytes = b"") -> None:
        """Runs until the connection ends; ``initial`` bytes (read past the ``101``) are
        taken before any read."""
        try:
            self.conn.initiate_connection()
            self.conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
            self.flush()
            self._started = True
            if self.closing:  # closed before it started (a retirement): SETTINGS, then GOAWAY
                self._goaway_and_ping()
            if initial:
                self._received(initial)
            while not self.writer.is_closing():
                data = await self.reader.read(READ_SIZE)
                if not data:
                    break
                self._received(data)
        except _Gone:
            pass
        except OSError as e:
            log.debug("HTTP/2 session ended: %s", e)
        finally:
            if self._final_timer is not None:
                self._final_timer.cancel()
            for stream in list(self.streams.values()):
                stream.reset()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
            self.writer.close()

    def flush(self) -> None:
        """Writes what h2 has to send."""
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def drain(self) -> None:
        """Waits until the transport's buffer is low (raises :class:`OSError` if it is gone)."""
        await self.writer.drain()

    def _goaway(self, last_stream_id: int) -> None:
        """Writes a ``GOAWAY`` (``NO_ERROR``) after what h2 has queued, h2's state untouched."""
        self.flush()
        frame = GoAwayFrame(0, last_stream_id=last_stream_id, error_code=0)
        if not self.writer.is_closing():
            self.writer.write(frame.serialize())

    def _final_goaway(self) -> None:
        """The second ``GOAWAY`` of a graceful close: the last stream taken."""
        if self.last_stream_id is not None:
            return
        if self._final_timer is not None:
            self._final_timer.cancel()
        self.last_stream_id = self.conn.highest_inbound_stream_id
        self._goaway(self.last_stream_id)
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self.closing and self.last_stream_id is not None and not self.streams:
            self.flush()
            self.writer.close()  # the read loop then meets EOF

    def _received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            log.debug("HTTP/2 session: protocol error from the client: %s", e)
            try:
                self.conn.close_connection(error_code=h2.errors.ErrorCodes.PROTOCOL_ERROR)
            except h2.exceptions.ProtocolError:
                pass
            self.flush()
            raise _Gone(str(e)) from None
        for event in events:
            self._event(event)
        self.flush()

    def _event(self, event: Any) -> None:
        E = h2.events
        if isinstance(event, E.RequestReceived):
            self._request(event)
        elif isinstance(event, E.DataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.data(event.data, event.flow_controlled_length)
            else:
                self.ack(event.stream_id, event.flow_controlled_length)
        elif isinstance(event, E.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.end_of_body()
        elif isinstance(event, E.StreamReset):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.reset()
        elif isinstance(event, E.WindowUpdated):
            targets = self.streams.values() if event.stream_id == 0 else [
                s for s in [self.streams.get(event.stream_id)] if s is not None]
            for stream in targets:
                stream.window.set()
        elif isinstance(event, E.RemoteSettingsChanged):
            for stream in self.streams.values():
                stream.window.set()
        elif isinstance(event, E.PingAckReceived):
            if event.ping_data == _PING and self.closing:
                self._final_goaway()
        elif isinstance(event, E.ConnectionTerminated):
            self._terminated(event)

    def _terminated(self, event: h2.events.ConnectionTerminated) -> None:
        """The client's ``GOAWAY``: it opens no more streams. With ``NO_ERROR`` the streams in
        flight finish (see :class:`_StateMachine`), then the connection closes."""
        if event.error_code != h2.errors.ErrorCodes.NO_ERROR:
            raise _Gone(f"GOAWAY {event.error_code!r}")
        self.closing = True
        if self.last_stream_id is None:
            self.last_stream_id = self.conn.highest_inbound_stream_id
        self._close_if_done()

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        if self.last_stream_id is not None and sid > self.last_stream_id:
            self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        pseudo = {k: v for k, v in event.headers if k.startswith(b":")}
        fields = _fields([(k, v) for k, v in event.headers if not k.startswith(b":")],
                         pseudo.get(b":authority"))
        method = pseudo.get(b":method", b"GET")
        stream = _Stream(self, sid, method)
        self.streams[sid] = stream
        self.peak = max(self.peak, len(self.streams))
        if method == b"CONNECT":
            coro = stream.simple(501, b"CONNECT is not supported on this session\n")
        else:
            scope = http_scope(method, pseudo.get(b":path", b"/"), "2", fields, self.peer)
            scope["extensions"] = {"http.response.trailers": {}}
            coro = stream.run(scope)
        task = asyncio.ensure_future(coro)
        stream.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def ack(self, stream_id: int, length: int) -> None:
        """Reopens ``length`` bytes of the receive windows (the data was consumed)."""
        if length:
            try:
                self.conn.acknowledge_received_data(length, stream_id)
            except h2.exceptions.ProtocolError:
                pass
            self.flush()

    def stream_done(self, stream: _Stream) -> None:
        self.streams.pop(stream.id, None)
        self._close_if_done()


def _fields(headers: list[tuple[bytes, bytes]], authority: bytes | None) -> list[tuple[bytes, bytes]]:
    """The request's fields as the application sees them: as sent and in order, with ``host``
    first from ``:authority`` (as ASGI asks), and ``cookie`` fields a client split joined
    with ``"; "`` at the first one's place (RFC 9113 §8.2.3)."""
    if authority is not None:
        headers = [(b"host", authority)] + [(k, v) for k, v in headers if k != b"host"]
    cookies = [v for k, v in headers if k == b"cookie"]
    if len(cookies) > 1:
        first = next(i for i, (k, _) in enumerate(headers) if k == b"cookie")
        rest = [(k, v) for k, v in headers if k != b"cookie"]
        rest.insert(first, (b"cookie", b"; ".join(cookies)))
        headers = rest
    return headers


class _Stream:
    """One request and its response: the ASGI ``receive`` and ``send`` callables."""

    def __init__(self, c: H2Connection, stream_id: int, method: bytes) -> None:
        self.c = c
        self.id = stream_id
        self.task: asyncio.Task[None] | None = None
        self.body: deque[tuple[bytes, int]] = deque()
        self.more_body = True
        self.delivered_end = False
        self.readable = asyncio.Event()
        self.window = asyncio.Event()
        self.ended = asyncio.Event()
        self.gone = False
        self.started = False
        self.body_sent = False
        self.complete = False
        self.trailers_expected = False
        self.trailers: list[tuple[bytes, bytes]] = []
        self._head = method == b"HEAD"
        self._pending: list[tuple[bytes, bytes]] | None = None

    # -- from the connection -------------------------------------------------------------

    def data(self, data: bytes, length: int) -> None:
        if self.gone or self.complete or not data:
            self.c.ack(self.id, length)
            return
        self.body.append((data, length))
        self.readable.set()

    def end_of_body(self) -> None:
        self.more_body = False
        self.readable.set()

    def reset(self) -> None:
        """The client reset the stream (or the connection ended): the application's task is
        cancelled, and its ``receive()`` says ``http.disconnect`` from now on."""
        if self.gone:
            return
        self.gone = True
        self.readable.set()
        self.window.set()
        self.ended.set()
        self._drop_body()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def _drop_body(self) -> None:
        while self.body:
            self.c.ack(self.id, self.body.popleft()[1])

    # -- the application -----------------------------------------------------------------

    async def run(self, scope: Scope) -> None:
        """Calls the application; a failure before the response answers 500, after it resets
        the stream."""
        try:
            await self.c.app(scope, self.receive, self.send)
            if not self.started and not self.gone:
                raise RuntimeError("the application returned without a response")
        except asyncio.CancelledError:
            if not self.gone:
                raise
        except Exception:
            if self.gone:
                log.debug("ASGI application ended after the stream was reset", exc_info=True)
            else:
                log.exception("ASGI application failed")
                if not self.started:
                    await self._guarded(self.simple(500, b"internal server error\n"))
        finally:
            self._end()

    async def simple(self, status: int, body: bytes) -> None:
        """Sends a short text/plain response."""
        try:
            headers = [(b"content-type", b"text/plain"),
                       (b"content-length", str(len(body)).encode())]
            await self.send({"type": "http.response.start", "status": status, "headers": headers})
            await self.send({"type": "http.response.body", "body": body})
        finally:
            self._end()

    async def _guarded(self, coro: Any) -> None:
        try:
            await coro
        except Exception:
            log.debug("HTTP/2 stream %d: could not answer 500", self.id, exc_info=True)

    def _end(self) -> None:
        """The application returned: a response it left unfinished is reset, an unread request
        body too (RFC 9113 §8.1: ``NO_ERROR`` after a complete response)."""
        if self.c.streams.get(self.id) is not self:
            return
        if not self.gone:
            code = None
            if not self.complete:
                code = h2.errors.ErrorCodes.INTERNAL_ERROR
            elif self.more_body:
                code = h2.errors.ErrorCodes.NO_ERROR
            if code is not None:
                try:
                    self.c.conn.reset_stream(self.id, code)
                except h2.exceptions.ProtocolError:
                    pass
            self.gone = True
        self._drop_body()
        self.ended.set()
        self.c.flush()
        self.c.stream_done(self)

    async def receive(self) -> Message:
        """ASGI ``receive``: body chunks as they arrive, then ``http.disconnect`` once the
        stream is reset or the response is complete."""
        while not self.gone and not self.complete:
            if self.body:
                chunks = list(self.body)
                self.body.clear()
                self.c.ack(self.id, sum(n for _, n in chunks))
                last = not self.more_body
                self.delivered_end = last
                return {"type": "http.request", "body": b"".join(d for d, _ in chunks),
                        "more_body": not last}
            if not self.more_body and not self.delivered_end:
                self.delivered_end = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if self.delivered_end:
                await self.ended.wait()
                break
            self.readable.clear()
            await self.readable.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        """ASGI ``send``: ``http.response.start``, ``http.response.body`` chunks, and
        ``http.response.trailers`` when the start asked for them (``"trailers": True``)."""
        if self.gone:
            return  # reset: the application's task is being cancelled
        kind = message["type"]
        try:
            if kind == "http.response.start" and not self.started:
                self._start(message)
            elif kind == "http.response.body" and self.started and not self.body_sent:
                await self._body(message)
            elif (kind == "http.response.trailers" and self.trailers_expected and self.body_sent
                  and not self.complete):
                self.trailers += [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
                if not message.get("more_trailers", False):
                    self.c.conn.send_headers(self.id, self.trailers, end_stream=True)
                    self._completed()
            else:
                raise RuntimeError(f"unexpected ASGI message {kind!r} at this point")
            self.c.flush()
            await self.c.drain()
        except (h2.exceptions.StreamClosedError, OSError):
            self.gone = True
            self.ended.set()

    def _start(self, message: Message) -> None:
        status = int(message["status"])
        if not 200 <= status <= 599:
            raise RuntimeError(f"status {status} is not supported (no 1xx, no upgrades)")
        headers = [(b":status", str(status).encode())]
        for k, v in message.get("headers", []):
            name = bytes(k).lower()
            if name not in _CONNECTION_SPECIFIC:
                headers.append((name, bytes(v)))
        self.trailers_expected = bool(message.get("trailers", False))
        self.started = True
        self._pending = headers
        if self.c.hooks is not None and self.c.hooks.response_starting():
            self.c.begin_close()  # retired: this session takes no more streams

    async def _body(self, message: Message) -> None:
        body = b"" if self._head else bytes(message.get("body", b""))
        last = not message.get("more_body", False)
        if self._pending is not None:
            end = last and not body and not self.trailers_expected
            self.c.conn.send_headers(self.id, self._pending, end_stream=end)
            self._pending = None
            if end:
                self.body_sent = True
                return self._completed()
        if body:
            await self._data(body)
        if last and not self.gone:
            self.body_sent = True
            if not self.trailers_expected:
                self.c.conn.end_stream(self.id)
                self._completed()

    async def _data(self, body: bytes) -> None:
        """Sends ``body`` as the client's windows allow, waiting for ``WINDOW_UPDATE``."""
        view = memoryview(body)
        conn = self.c.conn
        while view and not self.gone:
            room = min(conn.local_flow_control_window(self.id), conn.max_outbound_frame_size)
            if room <= 0:
                self.window.clear()
                await self.window.wait()
                continue
            conn.send_data(self.id, bytes(view[:room]))
            view = view[room:]
            self.c.flush()
            await self.c.drain()

    def _completed(self) -> None:
        self.complete = True
        self.ended.set()
