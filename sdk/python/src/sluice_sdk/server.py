"""One HTTP/1.1 server connection (h11) running an ASGI 3 application, one request at a time.

Used for sessions (where the proxy is the client) and for plain listening sockets alike. A
WebSocket upgrade goes to the application as a ``websocket`` scope (``websocket``); once it is
accepted the connection is the WebSocket's, which the caller may run elsewhere (a session's
slot dials a replacement meanwhile). Other upgrades (``CONNECT``, ``h2c``, ...) are answered
``501`` without calling the application.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import StreamReader, StreamWriter
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

import h11

from .asgi import ASGIApp, Message, Peer, Receive, Scope, Send, scope, websocket_scope
from .websocket import WebSocket

__all__ = ["ASGIApp", "Connection", "Hooks", "Message", "Peer", "Receive", "Scope", "Send"]

log = logging.getLogger("sluice_sdk")

READ_SIZE = 65536
#: Bytes read ahead of the current request (pipelining) before reading pauses until its response
#: is done: the disconnect watcher must not buffer an unbounded stream from a misbehaving peer.
MAX_READ_AHEAD = 65536


class Hooks(Protocol):
    """What the caller learns about responses; a session uses it to retire and to hand an
    upgraded connection on."""

    def response_starting(self) -> bool:
        """Called before each response head; ``True`` adds ``Connection: close``."""

    def upgraded(self, websocket: WebSocket) -> bool:
        """The connection became an accepted ``websocket``: ``True`` if the caller runs it
        (``websocket.run()``) from now on, so the connection's own loop ends at once."""


class _Gone(Exception):
    """The peer went away or broke HTTP/1.1; the connection ends."""


@dataclass
class Connection:
    """Serves ``app`` on one stream until the peer closes it or a response asks to close."""

    app: ASGIApp
    reader: StreamReader
    writer: StreamWriter
    hooks: Hooks | None = None
    peer: Peer = field(default_factory=Peer)

    def __post_init__(self) -> None:
        self.conn = h11.Connection(h11.SERVER)
        #: Waiting for a request of which no byte has arrived: closing now loses nothing.
        self.idle = False
        #: The stream went to an upgraded WebSocket that someone else runs: not ours to close.
        self.detached = False

    def close_idle(self) -> bool:
        """Closes the connection if it is idle; the serve loop then ends at its EOF."""
        if not self.idle:
            return False
        self.writer.close()
        return True

    async def serve(self, initial: bytes = b"") -> None:
        """Runs until the connection ends; ``initial`` bytes are parsed before any read."""
        if initial:  # (h11 takes b"" for EOF)
            self.conn.receive_data(initial)
        try:
            while await self._one_request():
                self.conn.start_next_cycle()
        except _Gone:
            pass
        except (OSError, h11.ProtocolError) as e:
            log.debug("connection ended: %s", e)
        finally:
            if not self.detached:
                self.writer.close()

    async def next_event(self) -> Any:
        """The next h11 event, reading as needed; raises :class:`_Gone` on a broken peer."""
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as e:
                raise _Gone(str(e)) from None
            if event is not h11.NEED_DATA:
                return event
            data = await self.reader.read(READ_SIZE)
            self.idle = False
            self.conn.receive_data(data)

    async def write(self, event: Any) -> None:
        """Sends one h11 event."""
        data = self.conn.send(event)
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def _one_request(self) -> bool:
        """Serves one request; ``True`` if the connection can take another."""
        self.idle = self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]
        try:
            event = await self.next_event()
        except _Gone:
            await self._bad_request()
            raise
        finally:
            self.idle = False
        if not isinstance(event, h11.Request):
            return False  # closed between requests (or paused after a protocol switch)
        if _is_websocket(event):
            await self._websocket(event)
            return False  # the connection was the WebSocket's, or it declined the upgrade
        cycle = Cycle(self, event)
        if _is_upgrade(event):
            await cycle.simple(501, b"only WebSocket upgrades are supported on this connection\n")
        else:
            await cycle.run()
        return await self._finish_request(cycle)

    async def _websocket(self, request: h11.Request) -> None:
        """Runs a WebSocket upgrade: until the application declines it, or for its whole life
        unless the hooks take the accepted WebSocket on."""
        trailing, _ = self.conn.trailing_data
        ws = WebSocket(self.app, self.reader, self.writer, request,
                       websocket_scope(request, self.peer, []), bytes(trailing))
        if not await ws.handshake():
            if self.hooks is not None:
                self.hooks.response_starting()  # an answer, and the session's last
            return
        if self.hooks is not None and self.hooks.upgraded(ws):
            self.detached = True
            return
        await ws.run()

    async def _finish_request(self, cycle: Cycle) -> bool:
        if cycle.gone or self.conn.our_state is not h11.DONE:
            return False
        while self.conn.their_state is h11.SEND_BODY:  # the app left some of the body unread
            if isinstance(await self.next_event(), h11.ConnectionClosed):
                return False
        return self.conn.their_state is h11.DONE

    async def _bad_request(self) -> None:
        if self.conn.our_state is h11.SEND_RESPONSE:
            try:
                await Cycle(self, None).simple(400, b"bad request\n")
            except (OSError, h11.ProtocolError):
                pass


def _reason(status: int) -> bytes:
    """The standard reason phrase; strict clients (h2load) reject an empty one."""
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"


def _is_websocket(request: h11.Request) -> bool:
    """A GET asking to upgrade to ``websocket`` (wsproto checks the rest of the handshake)."""
    return request.method == b"GET" and any(
        k == b"upgrade" and v.strip().lower() == b"websocket" for k, v in request.headers)


def _is_upgrade(request: h11.Request) -> bool:
    """Requests that would switch protocols (h11's own test: CONNECT, or an Upgrade header)."""
    return request.method == b"CONNECT" or any(k == b"upgrade" for k, _ in request.headers)


class Cycle:
    """One request and its response: the ASGI ``receive`` and ``send`` callables."""

    def __init__(self, connection: Connection, request: h11.Request | None) -> None:
        self.c = connection
        self.request = request
        self.started = False
        self.complete = False
        self.gone = False
        # h11 frames a HEAD response as bodiless; ASGI apps send the GET body anyway (RFC 9110
        # §9.3.2 allows the headers to match a GET), so the body is dropped here.
        self._head = request is not None and request.method == b"HEAD"
        self._ended = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Calls the application; a failure before the response answers 500."""
        assert self.request is not None
        try:
            await self.c.app(scope(self.request, self.c.peer), self.receive, self.send)
            if not self.started:
                raise RuntimeError("the application returned without a response")
        except Exception:
            if self.gone:  # e.g. a WSGI adapter giving up on a vanished client
                log.debug("ASGI application ended after the peer went away", exc_info=True)
            else:
                log.exception("ASGI application failed")
            if not self.started and not self.gone:
                await self.simple(500, b"internal server error\n")
        finally:
            await self._end()
        if not self.complete:
            self.gone = True  # a half-sent response: only closing can end it

    async def simple(self, status: int, body: bytes) -> None:
        """Sends a short text/plain response."""
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def _end(self) -> None:
        self._ended.set()
        if self._watcher is not None:
            # Awaited, not just cancelled: the next request's read must not meet a pending one.
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)

    async def receive(self) -> Message:
        """ASGI ``receive``: body chunks, then ``http.disconnect`` once the peer goes away or
        the response is complete."""
        if self.gone or self.complete:
            return {"type": "http.disconnect"}
        if self.c.conn.their_state is h11.SEND_BODY:
            return await self._body()
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())
        await self._ended.wait()
        return {"type": "http.disconnect"}

    async def _body(self) -> Message:
        if self.c.conn.client_is_waiting_for_100_continue:
            await self.c.write(h11.InformationalResponse(status_code=100, headers=[]))
        try:
            event = await self.c.next_event()
        except _Gone:
            event = None
        if isinstance(event, h11.Data):
            return {"type": "http.request", "body": bytes(event.data), "more_body": True}
        if isinstance(event, h11.EndOfMessage):
            return {"type": "http.request", "body": b"", "more_body": False}
        self._disconnected()
        return {"type": "http.disconnect"}

    async def _watch(self) -> None:
        """After the body: reads until EOF, which means the peer went away."""
        while True:
            try:
                data = await self.c.reader.read(READ_SIZE)
            except OSError:
                data = b""
            if not data:
                return self._disconnected()
            self.c.conn.receive_data(data)  # a pipelined request, kept for the next cycle
            if len(self.c.conn.trailing_data[0]) > MAX_READ_AHEAD:
                return  # stop reading: TCP flow control holds the peer until the next cycle

    def _disconnected(self) -> None:
        self.gone = True
        self._ended.set()

    async def send(self, message: Message) -> None:
        """ASGI ``send``: ``http.response.start`` then ``http.response.body`` chunks."""
        if self.gone:
            return  # the peer is gone; the connection closes after the application returns
        kind = message["type"]
        if kind == "http.response.start" and not self.started:
            event = self._response(message)
            self.started = True
            await self._write(event)
        elif kind == "http.response.body" and self.started and not self.complete:
            body = message.get("body", b"")
            if body and not self._head:
                await self._write(h11.Data(data=body))
            if not message.get("more_body", False):
                await self._write(h11.EndOfMessage())
                self.complete = True
                self._ended.set()
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} at this point")

    def _response(self, message: Message) -> h11.Response:
        status = int(message["status"])
        if not 200 <= status <= 599:
            raise RuntimeError(f"status {status} is not supported (no 1xx, no upgrades)")
        headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        if self.c.hooks is not None and self.c.hooks.response_starting():
            headers = [(k, v) for k, v in headers if k.lower() != b"connection"]
            headers.append((b"connection", b"close"))
        # Built before h11 sees it: an invalid header fails here, leaving room for a 500.
        return h11.Response(status_code=status, headers=headers, reason=_reason(status))

    async def _write(self, event: Any) -> None:
        try:
            await self.c.write(event)
        except OSError:
            self._disconnected()
