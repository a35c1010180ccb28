"""TLS to the acceptor, the listening server, the WSGI adapter, and local option checks."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import h11
import pytest

import sluice_sdk
from apps import hello
from fakes import FakeAcceptor, run, self_signed
from sluice_sdk import Backoff, Options, OptionsError, WsgiApp


def test_tls_acceptor(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))

    async def main() -> None:
        acc = FakeAcceptor()
        addr = await acc.start_tcp(server_ctx)
        options = Options(acceptor=addr, service="api", ssl=client_ctx, server_hostname="localhost")
        sessions = await sluice_sdk.serve(hello, options)
        s = await acc.session()
        assert s.writer.get_extra_info("ssl_object") is not None
        assert (await s.request("GET", "/tls")).body == b"hello GET /tls?\n"
        sessions.close()

    run(main())


def test_tls_with_an_untrusted_certificate_is_retried(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def main() -> None:
        acc = FakeAcceptor()
        addr = await acc.start_tcp(server_ctx)
        options = Options(acceptor=addr, service="api", ssl=ssl.create_default_context(),
                          backoff=Backoff(initial=0.01, max=0.02))
        sessions = await sluice_sdk.serve(hello, options)
        await sessions._shared.wait_until(lambda: sessions.last_error is not None)
        assert isinstance(sessions.last_error, sluice_sdk.ConnectError)
        assert sessions.last_error.retryable
        sessions.close()

    run(main())


async def http_get(addr: tuple[str, int], target: str, body: bytes = b"") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(*addr)
    conn = h11.Connection(h11.CLIENT)
    method = "POST" if body else "GET"
    headers = [("Host", "x"), ("Content-Length", str(len(body)))]
    writer.write(conn.send(h11.Request(method=method, target=target, headers=headers)))
    writer.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
    status, out = 0, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            out += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            writer.close()
            return status, out


def test_serve_tcp_serves_the_same_app() -> None:
    async def main() -> None:
        server = await sluice_sdk.serve_tcp(hello, "127.0.0.1", 0)
        assert server.address[1] != 0
        assert await http_get(server.address, "/plain?q") == (200, b"hello GET /plain?q\n")
        server.close()
        await server.wait_closed()

    run(main())


def test_wsgi_adapter() -> None:
    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        data = environ["wsgi.input"].read()
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [environ["REQUEST_METHOD"].encode(), b" ", environ["PATH_INFO"].encode(), b" ", data]

    async def main() -> None:
        acc = FakeAcceptor()
        options = Options(acceptor=await acc.start_tcp(), service="api")
        sessions = await sluice_sdk.serve(WsgiApp(wsgi), options)
        s = await acc.session()
        r = await s.request("POST", "/w", body=b"body")
        assert (r.status, r.body) == (201, b"POST /w body")
        sessions.close()

    run(main())


def test_wsgi_errors_answer_500() -> None:
    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        raise ValueError("boom")

    async def main() -> None:
        server = await sluice_sdk.serve_tcp(WsgiApp(wsgi))
        assert (await http_get(server.address, "/"))[0] == 500
        server.close()

    run(main())


@pytest.mark.parametrize(
    "kw",
    [
        {"acceptor": "nowhere"},
        {"acceptor": "host:99999"},
        {"acceptor": "unix:"},
        {"capacity": -1},
        {"backoff": Backoff(initial=0)},
        {"backoff": Backoff(initial=10, max=1)},
        {"backoff": Backoff(jitter=2.0)},
        {"handshake_timeout": 0},
    ],
    ids=str,
)
def test_invalid_options_are_rejected(kw: dict[str, Any]) -> None:
    with pytest.raises(OptionsError):
        Options(**{"acceptor": "127.0.0.1:7000", "service": "api", **kw})
    assert issubclass(OptionsError, ValueError)


def test_backoff_doubles_up_to_max_and_jitter_only_shortens() -> None:
    b = Backoff(initial=0.1, max=1.0, jitter=0.5)
    for attempt, base in [(0, 0.1), (1, 0.2), (3, 0.8), (4, 1.0), (40, 1.0)]:
        for _ in range(50):
            assert base / 2 <= b.delay(attempt) <= base * (1 + 1e-9)
