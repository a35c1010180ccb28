"""Sluice's side of an HTTP/2 session, for tests: an h2 client with prior knowledge on a fake
acceptor's session (after its ``101`` naming ``Sluice-Protocol: h2``), as the proxy is."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings


class _StateMachine(h2.connection.H2ConnectionStateMachine):
    """As a real client (Sluice's): the server's GOAWAY ends new streams, not those open."""

    _Open = h2.connection.ConnectionState.CLIENT_OPEN
    _Idle = h2.connection.ConnectionState.IDLE
    _transitions = {**h2.connection.H2ConnectionStateMachine._transitions,
                    (_Open, h2.connection.ConnectionInputs.RECV_GOAWAY): (None, _Open),
                    (_Idle, h2.connection.ConnectionInputs.RECV_GOAWAY): (None, _Idle)}


@dataclass
class H2Response:
    """One stream's answer, filled in as it arrives."""

    stream_id: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    reset: int | None = None
    head: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    more: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def status(self) -> int:
        return int(dict(self.headers)[b":status"])

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def header(self, name: bytes) -> bytes | None:
        return dict(self.headers).get(name)


class H2Client:
    """An HTTP/2 client on ``reader``/``writer``. ``auto_ack=False`` leaves received data
    unacknowledged (the server's windows stay closed) until :meth:`ack`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 window: int | None = None, auto_ack: bool = True) -> None:
        self.reader = reader
        self.writer = writer
        self.auto_ack = auto_ack
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config)
        self.conn.state_machine = _StateMachine()
        if window is not None:
            self.conn.local_settings = h2.settings.Settings(client=True, initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.responses: dict[int, H2Response] = {}
        self.goaways: list[h2.events.ConnectionTerminated] = []
        self.goaway = asyncio.Event()
        self.settings = asyncio.Event()
        self.closed = asyncio.Event()
        self.window = asyncio.Event()
        self.unacked: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None

    def preface(self) -> bytes:
        """The connection preface, for a test that sends it itself (with the ``101``)."""
        self.conn.initiate_connection()
        return self.conn.data_to_send()

    async def start(self, initiate: bool = True) -> H2Client:
        if initiate:
            self.conn.initiate_connection()
        await self.flush()
        self._task = asyncio.ensure_future(self._read())
        return self

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    @property
    def max_concurrent_streams(self) -> int:
        return self.conn.remote_settings.max_concurrent_streams

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(65536):
                for event in self.conn.receive_data(data):
                    self._event(event)
                await self.flush()
        except (OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            self.closed.set()
            for r in self.responses.values():
                r.more.set()
                r.ended.set()

    def _event(self, event: Any) -> None:
        E = h2.events
        r = self.responses.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, E.ResponseReceived) and r is not None:
            r.headers = list(event.headers)
            r.head.set()
        elif isinstance(event, E.DataReceived) and r is not None:
            r.chunks.append(event.data)
            r.more.set()
            if self.auto_ack:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            else:
                self.unacked[event.stream_id] = (self.unacked.get(event.stream_id, 0)
                                                 + event.flow_controlled_length)
        elif isinstance(event, E.TrailersReceived) and r is not None:
            r.trailers = list(event.headers)
        elif isinstance(event, E.StreamEnded) and r is not None:
            r.ended.set()
            r.more.set()
        elif isinstance(event, E.StreamReset) and r is not None:
            r.reset = event.error_code
            r.head.set()
            r.ended.set()
            r.more.set()
        elif isinstance(event, E.RemoteSettingsChanged):
            self.settings.set()
            self.window.set()
        elif isinstance(event, E.WindowUpdated):
            self.window.set()
        elif isinstance(event, E.ConnectionTerminated):
            self.goaways.append(event)
            self.goaway.set()

    async def ack(self, stream_id: int) -> None:
        """Acknowledges what arrived on ``stream_id`` so far."""
        n = self.unacked.pop(stream_id, 0)
        if n:
            self.conn.acknowledge_received_data(n, stream_id)
            await self.flush()

    async def open(self, method: str = "GET", path: str = "/",
                   headers: list[tuple[str, str]] | None = None, end: bool = True,
                   authority: str = "app.example") -> H2Response:
        """Starts a request: its headers (``end``: and no body)."""
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":scheme", "http"), (":authority", authority),
                (":path", path)] + list(headers or [])
        r = self.responses[sid] = H2Response(sid)
        self.conn.send_headers(sid, [(k.encode(), v.encode("latin-1")) for k, v in hdrs],
                               end_stream=end)
        await self.flush()
        return r

    async def send(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """Sends body bytes as the server's windows allow."""
        view = memoryview(data)
        while view:
            room = min(self.conn.local_flow_control_window(stream_id),
                       self.conn.max_outbound_frame_size)
            if room <= 0:
                self.window.clear()
                await self.window.wait()
                continue
            self.conn.send_data(stream_id, bytes(view[:room]))
            view = view[room:]
            await self.flush()
        if end:
            self.conn.end_stream(stream_id)
            await self.flush()

    async def reset(self, stream_id: int) -> None:
        self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        await self.flush()

    async def request(self, method: str = "GET", path: str = "/",
                      headers: list[tuple[str, str]] | None = None,
                      body: bytes = b"", authority: str = "app.example") -> H2Response:
        """A whole request and its whole response."""
        r = await self.open(method, path, headers, end=not body, authority=authority)
        if body:
            await self.send(r.stream_id, body, end=True)
        await r.ended.wait()
        return r

    async def close(self) -> None:
        self.conn.close_connection()
        await self.flush()
        self.writer.close()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
