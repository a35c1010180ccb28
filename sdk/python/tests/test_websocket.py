"""WebSocket over sessions against the fake acceptor: the ASGI websocket scope, accepting
(the session is consumed and replaced), declining, closing from either side, and shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from wsproto.events import CloseConnection

import sluice_sdk
from apps import hello
from fakes import FakeAcceptor, run
from sluice_sdk import Backoff, Options, WsgiApp
from sluice_sdk import websocket as websocket_module


def opts(acceptor: str, **kw: Any) -> Options:
    return Options(acceptor=acceptor, service="api", instance="api-1",
                   backoff=Backoff(initial=0.01, max=0.05), **kw)


class Echo:
    """Accepts (with the first subprotocol offered) and echoes until the peer leaves; records
    the scope and how the WebSocket ended."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.ended: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            return await hello(scope, receive, send)
        if scope["type"] != "websocket":
            raise RuntimeError("no lifespan")
        self.scopes.append(scope)
        assert (await receive())["type"] == "websocket.connect"
        offered = scope["subprotocols"]
        await send({"type": "websocket.accept", "subprotocol": offered[0] if offered else None,
                    "headers": [(b"x-app", b"echo")]})
        while (message := await receive())["type"] == "websocket.receive":
            if message.get("text") == "close":
                await send({"type": "websocket.close", "code": 4000, "reason": "asked to"})
                continue
            reply = {k: v for k, v in message.items() if k in ("bytes", "text")}
            await send({"type": "websocket.send", **reply})
        await self.ended.put(message)


def test_an_accepted_websocket_consumes_its_session_which_is_replaced() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        echo = Echo()
        sessions = await sluice_sdk.serve(echo, opts(await acc.start_tcp(), capacity=1))
        s = await acc.session()
        headers = [("Sluice-Client-Addr", "203.0.113.7:4711"), ("X-Forwarded-Proto", "https")]
        ws = await s.websocket("/chat?room=1", ["v2.chat", "v1.chat"], headers)
        assert ws.accepted is not None and ws.accepted.subprotocol == "v2.chat"
        assert (b"x-app", b"echo") in ws.accepted.extra_headers

        # The 101 consumed the session: its slot dialed a replacement, which serves HTTP while
        # the WebSocket stays open.
        replacement = await acc.session()
        assert (await replacement.request("GET", "/plain")).body == b"hello GET /plain?\n"
        await sessions.wait_registered(1)
        assert acc.attempts == 2

        await ws.send("hi")
        assert await ws.receive() == "hi"
        await ws.send(b"\x00\x01")
        assert await ws.receive() == b"\x00\x01"
        await ws.send("frag", finished=False)
        await ws.send("mented")
        assert await ws.receive() == "fragmented"
        await ws.ping(b"p")
        await ws.send("after ping")
        assert await ws.receive() == "after ping" and ws.pongs == [b"p"]

        answer = await ws.close(1001, "bye")
        assert answer.code == 1001
        assert await echo.ended.get() == {"type": "websocket.disconnect", "code": 1001, "reason": "bye"}
        await s.wait_closed()
        sessions.close()

        scope = echo.scopes[0]
        assert (scope["path"], scope["query_string"], scope["scheme"]) == ("/chat", b"room=1", "wss")
        assert scope["client"] == ("203.0.113.7", 4711)
        assert scope["subprotocols"] == ["v2.chat", "v1.chat"]
        assert "websocket.http.response" in scope["extensions"] and "method" not in scope

    run(main())


def test_the_app_closes_the_websocket() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        echo = Echo()
        sessions = await sluice_sdk.serve(echo, opts(await acc.start_tcp()))
        ws = await (await acc.session()).websocket()
        await ws.send("close")
        closed = await ws.receive()
        assert isinstance(closed, CloseConnection) and (closed.code, closed.reason) == (4000, "asked to")
        assert (await echo.ended.get())["code"] == 4000
        sessions.close()

    run(main())


def test_a_peer_that_vanishes_is_a_disconnect_with_1006() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        echo = Echo()
        sessions = await sluice_sdk.serve(echo, opts(await acc.start_tcp()))
        s = await acc.session()
        await s.websocket()
        s.close()
        assert (await echo.ended.get())["code"] == 1006
        sessions.close()

    run(main())


async def decline(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Declines each WebSocket as its path says."""
    if scope["type"] != "websocket":
        raise RuntimeError("no lifespan")
    await receive()
    if scope["path"] == "/close":
        await send({"type": "websocket.close"})
    elif scope["path"] == "/deny":
        await send({"type": "websocket.http.response.start", "status": 418,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "websocket.http.response.body", "body": b"no ", "more_body": True})
        await send({"type": "websocket.http.response.body", "body": b"tea"})
    elif scope["path"] == "/raise":
        raise RuntimeError("boom")
    # /return: returns without an answer


@pytest.mark.parametrize("path,status,body", [
    ("/close", 403, b""), ("/deny", 418, b"no tea"), ("/raise", 500, b""), ("/return", 403, b"")])
def test_a_declined_websocket_is_an_http_answer_and_the_session_closes(path: str, status: int, body: bytes) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(decline, opts(await acc.start_tcp()))
        s = await acc.session()
        ws = await s.websocket(path)
        assert ws.rejected is not None and (ws.rejected.status, ws.rejected.body) == (status, body)
        # The proxy closes a session whose upgrade was declined; the service closes it too.
        await s.wait_closed()
        await acc.session()
        sessions.close()

    run(main())


def test_a_bad_handshake_is_400_and_a_wsgi_app_declines_websockets() -> None:
    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"wsgi"]

    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(WsgiApp(wsgi), opts(await acc.start_tcp()))
        s = await acc.session()
        r = await s.request("GET", "/ws", [("Connection", "Upgrade"), ("Upgrade", "websocket")])
        assert r.status == 400  # no Sec-WebSocket-Key, no version
        ws = await (await acc.session()).websocket()
        assert ws.rejected is not None and ws.rejected.status == 403
        assert (await (await acc.session()).request()).body == b"wsgi"
        sessions.close()

    run(main())


def test_shutdown_closes_open_websockets_with_1012_after_the_drain() -> None:
    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        echo = Echo()
        sessions = await sluice_sdk.serve(echo, opts(await acc.start_tcp()))
        ws = await (await acc.session()).websocket()
        await acc.session()  # the replacement
        shutdown = asyncio.ensure_future(sessions.shutdown())
        closed = await ws.receive()
        assert isinstance(closed, CloseConnection) and closed.code == 1012
        assert (await echo.ended.get())["code"] == 1012
        await shutdown
        assert len(acc.drains) == 1

    run(main())


def test_a_message_over_the_limit_closes_with_1009(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(websocket_module, "MAX_MESSAGE", 10)

    async def main() -> None:
        acc = FakeAcceptor()
        echo = Echo()
        sessions = await sluice_sdk.serve(echo, opts(await acc.start_tcp()))
        ws = await (await acc.session()).websocket()
        await ws.send("0123456789")
        assert await ws.receive() == "0123456789"
        await ws.send("0123456789a")
        closed = await ws.receive()
        assert isinstance(closed, CloseConnection) and closed.code == 1009
        assert (await echo.ended.get())["code"] == 1009
        sessions.close()

    run(main())


def test_the_app_may_send_without_receiving() -> None:
    async def ticker(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            raise RuntimeError("no lifespan")
        await receive()
        await send({"type": "websocket.accept"})
        for n in range(3):
            await send({"type": "websocket.send", "text": f"tick {n}"})
        # Returning closes the WebSocket normally.

    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(ticker, opts(await acc.start_tcp()))
        ws = await (await acc.session()).websocket()
        assert [await ws.receive() for _ in range(3)] == ["tick 0", "tick 1", "tick 2"]
        closed = await ws.receive()
        assert isinstance(closed, CloseConnection) and closed.code == 1000
        sessions.close()

    run(main())


def test_a_listening_server_serves_websockets_too() -> None:
    from websockets.asyncio.client import connect

    async def main() -> None:
        echo = Echo()
        server = await sluice_sdk.serve_tcp(echo)
        host, port = server.address
        async with connect(f"ws://{host}:{port}/direct", proxy=None) as ws:
            await ws.send("hi")
            assert await ws.recv() == "hi"
        assert (await echo.ended.get())["code"] == 1000
        server.close()
        await server.wait_closed()

    run(main())


def test_a_ping_after_the_apps_close_does_not_stop_the_reader() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        echo = Echo()
        sessions = await sluice_sdk.serve(echo, opts(await acc.start_tcp()))
        ws = await (await acc.session()).websocket()
        await ws.send("close")
        closing = await ws.reader.read(65536)  # the app's close, not yet seen by the client
        await ws.ping(b"late")  # so the client still pings, after the service's close
        ws.ws.receive_data(closing)
        ws._events.extend(ws.ws.events())
        closed = await ws.receive()  # the close, answered: the app hears of it
        assert isinstance(closed, CloseConnection) and closed.code == 4000
        assert (await echo.ended.get())["code"] == 4000
        sessions.close()

    run(main())
