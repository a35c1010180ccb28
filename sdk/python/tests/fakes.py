"""A fake acceptor + proxy for the tests: answers registrations (101 or a chosen refusal), then
acts as the proxy on each session — an h11 client writing requests and reading responses."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

SWITCH = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: sluice-session/1\r\n\r\n"
SWITCH_H2 = (b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
             b"Upgrade: sluice-session/1\r\nSluice-Protocol: h2\r\n\r\n")
DRAINED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\nConnection: close\r\n\r\ndraining\n"
REASONS = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 410: "Gone",
           429: "Too Many Requests", 503: "Service Unavailable"}


def run(coro: Coroutine[Any, Any, Any], limit: float = 10.0) -> Any:
    """Runs a test coroutine; ``limit`` only keeps a broken test from hanging the suite."""
    return asyncio.run(asyncio.wait_for(coro, limit))


def refusal(status: int) -> bytes:
    body = b"refused\n"
    return (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def closes(self) -> bool:
        return "close" in self.headers.get("connection", "").lower()


@dataclass
class FakeSession:
    """The proxy's side of one registered session."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    headers: dict[str, str]
    conn: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    #: A WebSocket took it over: the proxy's drain leaves it open, as the proxy's bridge does.
    upgraded: bool = False

    async def send_head(self, method: str = "GET", target: str = "/", headers: list[tuple[str, str]] | None = None) -> None:
        hdrs = [("Host", "app.example")] + (headers or [])
        await self._write(h11.Request(method=method, target=target, headers=hdrs))

    async def send_data(self, data: bytes) -> None:
        await self._write(h11.Data(data=data))

    async def end(self) -> None:
        await self._write(h11.EndOfMessage())

    async def _write(self, event: Any) -> None:
        self.writer.write(self.conn.send(event))
        await self.writer.drain()

    async def read_response(self) -> Response:
        head = await self._event()
        assert isinstance(head, h11.Response), head
        body = b""
        while not isinstance(event := await self._event(), h11.EndOfMessage):
            body += bytes(event.data)
        headers = {k.decode(): v.decode() for k, v in head.headers}
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return Response(head.status_code, headers, body)

    async def request(self, method: str = "GET", target: str = "/", headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> Response:
        hdrs = list(headers or [])
        if body or method == "POST":
            hdrs.append(("Content-Length", str(len(body))))
        await self.send_head(method, target, hdrs)
        if body:
            await self.send_data(body)
        await self.end()
        return await self.read_response()

    async def _event(self) -> Any:
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            self.conn.receive_data(await self.reader.read(65536))
        return event

    async def wait_closed(self) -> None:
        """Returns when the service closed the session (reads EOF)."""
        while await self.reader.read(65536):
            pass

    def close(self) -> None:
        self.writer.close()

    async def websocket(self, target: str = "/ws", subprotocols: list[str] | None = None,
                        headers: list[tuple[str, str]] | None = None) -> FakeWebSocket:
        """Sends a WebSocket upgrade request on this session (as the proxy forwards a client's);
        the answer is in the returned client's ``accepted`` or ``rejected``."""
        self.upgraded = True
        ws = FakeWebSocket(self.reader, self.writer)
        extra = [(k.encode(), v.encode()) for k, v in headers or []]
        await ws.write(ws.ws.send(Request(host="app.example", target=target,
                                          subprotocols=subprotocols or [], extra_headers=extra)))
        await ws.handshake()
        return ws


@dataclass
class Rejection:
    status: int
    headers: dict[str, str]
    body: bytes = b""


class FakeWebSocket:
    """The client's end of a WebSocket, spoken with wsproto over a fake session."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.accepted: AcceptConnection | None = None
        self.rejected: Rejection | None = None
        self.pongs: list[bytes] = []
        self._events: list[Any] = []

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def _next(self) -> Any:
        while not self._events:
            data = await self.reader.read(65536)
            self.ws.receive_data(data or None)
            self._events.extend(self.ws.events())
        return self._events.pop(0)

    async def handshake(self) -> None:
        event = await self._next()
        if isinstance(event, AcceptConnection):
            self.accepted = event
            return
        assert isinstance(event, RejectConnection), event
        self.rejected = Rejection(event.status_code,
                                  {k.decode().lower(): v.decode() for k, v in event.headers})
        finished = not event.has_body
        while not finished:
            data = await self._next()
            assert isinstance(data, RejectData), data
            self.rejected.body += data.data
            finished = data.body_finished

    async def send(self, data: str | bytes, finished: bool = True) -> None:
        await self.write(self.ws.send(Message(data=data, message_finished=finished)))

    async def ping(self, payload: bytes) -> None:
        await self.write(self.ws.send(Ping(payload=payload)))

    async def receive(self) -> str | bytes | CloseConnection:
        """The next whole message, or the server's close (answered)."""
        parts: list[Any] = []
        while True:
            event = await self._next()
            if isinstance(event, Pong):
                self.pongs.append(bytes(event.payload))
            elif isinstance(event, CloseConnection):
                if self.ws.state.name == "REMOTE_CLOSING":
                    await self.write(self.ws.send(event.response()))
                return event
            elif isinstance(event, (TextMessage, BytesMessage)):
                parts.append(event.data)
                if event.message_finished:
                    return "".join(parts) if isinstance(event, TextMessage) else b"".join(parts)

    async def close(self, code: int = 1000, reason: str = "") -> CloseConnection:
        """Closes and returns the server's answering close."""
        await self.write(self.ws.send(CloseConnection(code=code, reason=reason)))
        while not isinstance(event := await self._next(), CloseConnection):
            pass
        return event


class FakeAcceptor:
    """Registers sessions into ``sessions``; ``answers`` are statuses used for the first
    registrations (then 101); a drain answers 200 and sets ``drained``, and later registrations
    get 503, as from the real acceptor. With ``close_on_drain`` the drain also closes every
    session not taken over by a WebSocket (right for tests with no request in flight)."""

    def __init__(self, answers: list[int] | None = None, close_on_drain: bool = False,
                 switch: bytes = SWITCH) -> None:
        self.answers = list(answers or [])
        #: The ``101`` a registration gets (``SWITCH_H2`` for an acceptor of HTTP/2 sessions).
        self.switch = switch
        #: When set, the status every registration gets (after ``answers``), e.g. 410 while
        #: an operator holds the instance drained.
        self.refuse_all: int | None = None
        self.close_on_drain = close_on_drain
        self.opened: list[FakeSession] = []
        self.sessions: asyncio.Queue[FakeSession] = asyncio.Queue()
        self.registrations: list[dict[str, str]] = []
        self.attempts = 0
        #: The loop's time at each registration attempt.
        self.attempt_times: list[float] = []
        self._attempted = asyncio.Condition()
        self.drains: list[dict[str, str]] = []
        self.drained = asyncio.Event()
        self.server: asyncio.Server | None = None
        #: While set, each registration's answer (decided on arrival) waits for an event of
        #: its own in ``waiting_answers``, in arrival order, until the test sets it.
        self.hold_answers = False
        self.waiting_answers: list[asyncio.Event] = []

    async def start_tcp(self, ctx: ssl.SSLContext | None = None) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=ctx)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start_sock(self, sock: Any) -> None:
        """Listens on an already bound socket (until now, dials to it were refused)."""
        self.server = await asyncio.start_server(self._handle, sock=sock)

    async def start_unix(self, path: str) -> str:
        self.server = await asyncio.start_unix_server(self._handle, path)
        return f"unix:{path}"

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def restart_tcp(self, addr: str) -> None:
        """Listens again on ``addr`` (after :meth:`close`), as a restarted proxy does."""
        host, port = addr.rsplit(":", 1)
        self.server = await asyncio.start_server(self._handle, host, int(port))

    async def wait_attempts(self, n: int) -> None:
        """Returns once ``n`` registrations were attempted in all."""
        async with self._attempted:
            await self._attempted.wait_for(lambda: self.attempts >= n)

    async def session(self) -> FakeSession:
        return await self.sessions.get()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line, *lines = head.decode().split("\r\n")
        headers = {k.lower(): v for k, _, v in (h.partition(": ") for h in lines if h)}
        if line.startswith("POST /.sluice/v1/drain "):
            self.drains.append(headers)
            writer.write(DRAINED)
            writer.close()
            if self.close_on_drain:
                for session in self.opened:
                    if not session.upgraded:
                        session.close()
            self.drained.set()
            return
        self.attempts += 1
        self.attempt_times.append(asyncio.get_running_loop().time())
        status = self.answers.pop(0) if self.answers else self.refuse_all or 101
        if self.drained.is_set():
            status = 503
        release = asyncio.Event()
        if self.hold_answers:
            self.waiting_answers.append(release)
        async with self._attempted:
            self._attempted.notify_all()
        if self.hold_answers:
            await release.wait()
        if status != 101:
            writer.write(refusal(status))
            writer.close()
            return
        self.registrations.append(headers)
        writer.write(self.switch)
        session = FakeSession(reader, writer, headers)
        self.opened.append(session)
        await self.sessions.put(session)


async def serve_once(data: bytes, handler: Callable[[bytes], None] | None = None) -> tuple[asyncio.Server, str]:
    """A server that reads one request head, answers ``data`` and closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if handler:
            handler(head)
        writer.write(data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    return server, f"{host}:{port}"


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key
