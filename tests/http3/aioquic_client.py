"""One HTTP/3 request with aioquic (Python's QUIC and HTTP/3 stack, independent of Sluice's),
as a function the tests call: the answer's status, fields and body."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class _Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.answers: dict[int, tuple[Answer, asyncio.Future[Answer]]] = {}

    def quic_event_received(self, event: QuicEvent) -> None:
        for h3_event in self.h3.handle_event(event):
            self._h3_event(h3_event)

    def _h3_event(self, event: H3Event) -> None:
        if not isinstance(event, (HeadersReceived, DataReceived)) or event.stream_id not in self.answers:
            return
        answer, done = self.answers[event.stream_id]
        if isinstance(event, HeadersReceived):
            for name, value in event.headers:
                if name == b":status":
                    answer.status = int(value)
                else:
                    answer.headers[name.decode()] = value.decode()
        else:
            answer.body += event.data
        if event.stream_ended and not done.done():
            done.set_result(answer)

    async def request(self, method: str, authority: str, path: str, body: bytes,
                      headers: list[tuple[bytes, bytes]]) -> Answer:
        stream_id = self._quic.get_next_available_stream_id()
        fields = [(b":method", method.encode()), (b":scheme", b"https"),
                  (b":authority", authority.encode()), (b":path", path.encode()), *headers]
        if body:
            fields.append((b"content-length", str(len(body)).encode()))
        self.h3.send_headers(stream_id, fields, end_stream=not body)
        if body:
            self.h3.send_data(stream_id, body, end_stream=True)
        done: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.answers[stream_id] = (Answer(), done)
        self.transmit()
        return await done


async def _request(host: str, port: int, method: str, path: str, body: bytes, ca: str,
                   server_name: str, headers: list[tuple[bytes, bytes]]) -> Answer:
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=server_name)
    config.verify_mode = ssl.CERT_REQUIRED
    config.load_verify_locations(ca)
    async with connect(host, port, configuration=config, create_protocol=_Client) as client:
        assert isinstance(client, _Client)
        return await asyncio.wait_for(
            client.request(method, f"{server_name}:{port}", path, body, headers), 20)


def request(host: str, port: int, method: str, path: str, *, body: bytes = b"", ca: str,
            server_name: str = "localhost", headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
    """Sends one request over a new QUIC connection and returns the whole answer."""
    return asyncio.run(_request(host, port, method, path, body, ca, server_name, headers or []))
