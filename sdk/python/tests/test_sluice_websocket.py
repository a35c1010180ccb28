"""WebSocket through the real proxy: a FastAPI WebSocket endpoint served over a session, a real
WebSocket client (the `websockets` library) connecting to `sluice`'s listener."""

from __future__ import annotations

import asyncio
import http.client
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from harness import TOKEN, Sluice
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

import sluice_sdk
from fakes import run
from sluice_sdk import Options


def make_app(ended: asyncio.Queue[int]) -> FastAPI:
    app = FastAPI()

    @app.get("/")
    async def index() -> dict[str, str]:
        return {"hello": "http"}

    @app.websocket("/echo")
    async def echo(ws: WebSocket) -> None:
        offered = "echo.v1" in ws.scope["subprotocols"]
        await ws.accept(subprotocol="echo.v1" if offered else None)
        try:
            while True:
                text = await ws.receive_text()
                if text == "whoami":
                    assert ws.client is not None
                    await ws.send_text(f"{ws.client.host}:{ws.client.port} {ws.url.scheme}")
                else:
                    await ws.send_text(text.upper())
        except WebSocketDisconnect as e:
            await ended.put(e.code)

    return app


def get(addr: tuple[str, int], path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*addr, timeout=30)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, res.read()
    finally:
        conn.close()


def test_a_websocket_client_reaches_a_fastapi_endpoint_through_sluice(sluice: Sluice) -> None:
    async def main() -> None:
        ended: asyncio.Queue[int] = asyncio.Queue()
        options = Options(acceptor=sluice.acceptor, service="interop", instance="py-ws",
                          token=TOKEN, capacity=1)
        sessions = await sluice_sdk.serve(make_app(ended), options)
        await sessions.wait_registered()
        url = f"ws://{sluice.http[0]}:{sluice.http[1]}/echo"
        async with connect(url, subprotocols=["echo.v1"], proxy=None) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == "echo.v1"
            await ws.send("hello")
            assert await ws.recv() == "HELLO"
            # Sluice-Client-Addr: the endpoint sees this client's own address.
            await ws.send("whoami")
            host, port = ws.local_address[:2]
            assert await ws.recv() == f"{host}:{port} ws"
            # The upgrade consumed the only session; its replacement serves HTTP meanwhile.
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, get, sluice.http, "/") == (200, b'{"hello":"http"}')
        assert await ended.get() == 1000

        # Shutdown: the drain leaves the open WebSocket to the service, which closes it with
        # 1012 (service restart) so that the client reconnects elsewhere.
        async with connect(url, proxy=None) as ws:
            await ws.send("still here")
            assert await ws.recv() == "STILL HERE"
            await asyncio.wait_for(sessions.shutdown(), 30)
            try:
                await ws.recv()
            except ConnectionClosed as e:
                closed: Any = e.rcvd
            assert closed is not None and closed.code == 1012
        assert await ended.get() == 1012

    run(main(), limit=60)
