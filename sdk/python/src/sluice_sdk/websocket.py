"""WebSocket on an HTTP/1.1 connection: the ASGI ``websocket`` scope, spoken with wsproto.

The application's first answer decides what the connection becomes. ``websocket.accept`` sends
the ``101`` and the connection is the WebSocket's from then on (a session is consumed by it: its
slot dials a replacement, as the proxy expects). ``websocket.close`` before accepting answers
``403``, a denial response (``websocket.http.response.*``) answers what the application says,
and an application that fails first answers ``500``; the connection then closes, as the proxy
closes a session whose upgrade was declined.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import StreamReader, StreamWriter
from typing import Any

import h11
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message as WsMessage,
    Ping,
    RejectConnection,
    RejectData,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from .asgi import ASGIApp, Message, Scope

log = logging.getLogger("sluice_sdk")

READ_SIZE = 65536
#: Messages read ahead of the application before reading pauses (TCP then holds the peer).
INBOX = 16
#: The largest message accepted (as uvicorn's default); a larger one closes with 1009.
MAX_MESSAGE = 16 * 1024 * 1024
#: The close code of a WebSocket the service closes because it is leaving (RFC 6455 §7.4.1
#: registry: "Service Restart"), as uvicorn sends at its shutdown.
GOING = 1012


class WebSocketClosed(ConnectionError):
    """``send()`` on a WebSocket that is closed (ASGI: an ``OSError``)."""


class WebSocket:
    """One upgrade request: :meth:`handshake` runs the application until it accepts or
    declines, :meth:`run` serves the accepted WebSocket until the application returns."""

    def __init__(self, app: ASGIApp, reader: StreamReader, writer: StreamWriter,
                 request: h11.Request, scope: Scope, trailing: bytes) -> None:
        self.app = app
        self.reader = reader
        self.writer = writer
        self.scope = scope
        self._request = request
        self._trailing = trailing
        self.ws = WSConnection(ConnectionType.SERVER)
        self._inbox: asyncio.Queue[Message] = asyncio.Queue(INBOX)
        self._connect_sent = False
        self._decided = asyncio.Event()
        self.accepted = False
        #: Nothing more may be sent: a close went out, or the peer is gone.
        self._closed = False
        #: The application was told ``websocket.disconnect`` (or will be, next).
        self._told = False
        self._app_task: asyncio.Task[None] | None = None

    async def handshake(self) -> bool:
        """Calls the application with the ``websocket`` scope; returns ``True`` once it
        accepted (the ``101`` is sent), ``False`` once it declined (an HTTP answer is sent)."""
        try:
            self.ws.receive_data(_head(self._request))
            [request] = [e for e in self.ws.events()]
        except RemoteProtocolError as e:
            log.debug("bad WebSocket handshake: %s", e)
            await self._decline(e.event_hint or RejectConnection())
            return False
        self.scope["subprotocols"] = list(request.subprotocols)
        self._app_task = asyncio.ensure_future(self._run_app())
        try:
            await self._decided.wait()
        except asyncio.CancelledError:
            self._app_task.cancel()
            raise
        return self.accepted

    async def run(self) -> None:
        """Relays messages between the peer and the accepted application until it returns,
        then closes the connection."""
        assert self._app_task is not None
        reader = asyncio.ensure_future(self._read())
        try:
            await asyncio.wait({self._app_task})
        finally:
            for task in (reader, self._app_task):
                task.cancel()
            await asyncio.gather(reader, self._app_task, return_exceptions=True)
            self.writer.close()

    def shutdown(self) -> None:
        """The service is leaving: closes with 1012 (clients reconnect elsewhere) and tells the
        application ``websocket.disconnect``; :meth:`run` returns once it does."""
        if not self._closed:
            self._send_close(GOING, "service restarting")
        self._disconnected(GOING, "")

    async def receive(self) -> Message:
        """ASGI ``receive``: ``websocket.connect`` first, then the peer's messages, then one
        ``websocket.disconnect``."""
        if not self._connect_sent:
            self._connect_sent = True
            return {"type": "websocket.connect"}
        if self._decided.is_set() and not self.accepted:
            return {"type": "websocket.disconnect", "code": 1006, "reason": ""}
        return await self._inbox.get()

    async def send(self, message: Message) -> None:
        """ASGI ``send``: accept or decline first; then messages and a close."""
        kind = message["type"]
        if self._told and kind != "websocket.close":
            raise WebSocketClosed("the peer is gone")
        if not self._decided.is_set():
            await self._answer(kind, message)
        elif self.accepted:
            await self._relay(kind, message)
        elif kind == "websocket.http.response.body" and self.ws.state is ConnectionState.REJECTING:
            await self._declined_body(message)
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} after the WebSocket was declined")

    async def _answer(self, kind: str, message: Message) -> None:
        if kind == "websocket.accept":
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            await self._write(self.ws.send(AcceptConnection(
                subprotocol=message.get("subprotocol"), extensions=[PerMessageDeflate()],
                extra_headers=headers)))
            self.accepted = True
            self._decided.set()
        elif kind == "websocket.close":
            await self._decline(RejectConnection(status_code=403))
        elif kind == "websocket.http.response.start":
            status = int(message["status"])
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            await self._write(self.ws.send(RejectConnection(status_code=status, headers=headers,
                                                            has_body=True)))
        elif kind == "websocket.http.response.body" and self.ws.state is ConnectionState.REJECTING:
            await self._declined_body(message)
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} before the WebSocket was accepted")

    async def _declined_body(self, message: Message) -> None:
        more = bool(message.get("more_body", False))
        await self._write(self.ws.send(RejectData(data=bytes(message.get("body", b"")),
                                                  body_finished=not more)))
        if not more:
            self._decided.set()

    async def _decline(self, answer: RejectConnection) -> None:
        try:
            data = self.ws.send(answer)
        except LocalProtocolError:  # an answer was already begun: the connection just closes
            data = b""
        await self._write(data)
        self._decided.set()

    async def _relay(self, kind: str, message: Message) -> None:
        if kind == "websocket.close":
            if not self._closed:
                self._send_close(int(message.get("code") or 1000), message.get("reason") or "")
            return
        if kind != "websocket.send":
            raise RuntimeError(f"unexpected ASGI message {kind!r} on an open WebSocket")
        if self._closed:
            raise WebSocketClosed("the WebSocket is closed")
        data = message.get("bytes")
        data = data if data is not None else message.get("text")
        if data is None:
            raise RuntimeError("websocket.send without bytes or text")
        try:
            frame = self.ws.send(WsMessage(data=data))
        except LocalProtocolError:  # the peer's close came in first
            raise WebSocketClosed("the WebSocket is closed") from None
        await self._write(frame)
        if self._closed:
            raise WebSocketClosed("the WebSocket is closed")

    def _send_close(self, code: int, reason: str) -> None:
        self._closed = True
        try:
            self.writer.write(self.ws.send(CloseConnection(code=code, reason=reason)))
        except (LocalProtocolError, OSError):
            pass

    async def _write(self, data: bytes) -> None:
        if not data:
            return
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError:
            self._disconnected(1006, "")

    def _disconnected(self, code: int, reason: str) -> None:
        """The peer is gone or closed: nothing more is sent, and the application hears it once."""
        if self._told:
            return
        self._told = True
        self._closed = True
        self._decided.set()
        # The inbox may be full of messages the application never read: it hears of the end
        # first, since nothing it would answer can be sent any more.
        while self._inbox.full():
            self._inbox.get_nowait()
        self._inbox.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})

    async def _run_app(self) -> None:
        try:
            await self.app(self.scope, self.receive, self.send)
        except Exception:
            if self._decided.is_set() and not self.accepted:
                log.debug("ASGI application failed after declining the WebSocket", exc_info=True)
            elif self._decided.is_set():
                log.exception("ASGI application failed on an open WebSocket")
                self._closing(1011)
            else:
                log.exception("ASGI application failed before accepting the WebSocket")
                await self._decline(RejectConnection(status_code=500))
        else:
            if not self._decided.is_set():
                # What websocket.close before accepting means (ASGI spec): 403.
                await self._decline(RejectConnection(status_code=403))
            self._closing(1000)

    def _closing(self, code: int) -> None:
        if self.accepted and not self._closed:
            self._send_close(code, "")

    async def _read(self) -> None:
        """Reads the peer's frames into the inbox (answering pings and the peer's close) until
        the WebSocket ends."""
        pending = self._trailing
        message = _Assembly()
        while True:
            if not pending:
                try:
                    pending = await self.reader.read(READ_SIZE)
                except OSError:
                    pending = b""
            try:
                self.ws.receive_data(pending or None)
            except LocalProtocolError:  # closed already
                return
            pending = b""
            for event in self.ws.events():
                if not await self._event(event, message):
                    return

    async def _event(self, event: Event, message: _Assembly) -> bool:
        """Handles one event from the peer; ``False`` once the WebSocket has ended."""
        if isinstance(event, (TextMessage, BytesMessage)):
            if not message.add(event):
                self._send_close(1009, "message too big")
                self._disconnected(1009, "message too big")
                return False
            if event.message_finished:
                await self._inbox.put(message.take())
        elif isinstance(event, Ping) and self.ws.state is ConnectionState.OPEN:
            await self._write(self.ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            if self.ws.state in (ConnectionState.REMOTE_CLOSING, ConnectionState.OPEN):
                # Answered (REMOTE_CLOSING), or a frame wsproto could not parse (still OPEN).
                self._send_close(event.code, event.reason or "")
            self._disconnected(event.code, event.reason or "")
            return False
        return True


class _Assembly:
    """The fragments of one message, up to :data:`MAX_MESSAGE`."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.size = 0
        self.text = False

    def add(self, event: TextMessage | BytesMessage) -> bool:
        self.text = isinstance(event, TextMessage)
        self.parts.append(event.data)
        self.size += len(event.data)
        return self.size <= MAX_MESSAGE

    def take(self) -> Message:
        parts, self.parts, self.size = self.parts, [], 0
        if self.text:
            return {"type": "websocket.receive", "text": "".join(parts)}
        return {"type": "websocket.receive", "bytes": b"".join(parts)}


def _head(request: h11.Request) -> bytes:
    """The request head again, for wsproto's handshake (its parser wants bytes)."""
    lines = [b"%s %s HTTP/1.1" % (request.method, request.target)]
    lines += [b"%s: %s" % (name, value) for name, value in request.headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"
