"""FastAPI (Starlette) on sessions, as users write it: a lifespan that sets ``app.state`` and
yields request state, and WebSocket endpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from wsproto.events import CloseConnection

import sluice_sdk
from fakes import FakeAcceptor, run
from sluice_sdk import Backoff, Options


def opts(acceptor: str) -> Options:
    return Options(acceptor=acceptor, service="api", instance="api-1",
                   backoff=Backoff(initial=0.01, max=0.05))


def make_app(events: list[str]) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        app.state.greeting = "hello"
        events.append("startup")
        yield {"pool": "pool-1"}
        events.append("shutdown")

    app = FastAPI(lifespan=lifespan)

    @app.get("/")
    async def index(request: Request) -> dict[str, str]:
        return {"greeting": request.app.state.greeting, "pool": request.state.pool}

    return app


def test_fastapi_lifespan_state_reaches_requests() -> None:
    events: list[str] = []

    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        sessions = await sluice_sdk.serve(make_app(events), opts(await acc.start_tcp()))
        assert events == ["startup"]
        r = await (await acc.session()).request("GET", "/")
        assert (r.status, r.body) == (200, b'{"greeting":"hello","pool":"pool-1"}')
        await sessions.shutdown()
        assert events == ["startup", "shutdown"]

    run(main())


def test_fastapi_websocket_endpoint_and_an_unknown_path() -> None:
    app = FastAPI()

    @app.websocket("/ws/{name}")
    async def greet(ws: WebSocket, name: str) -> None:
        await ws.accept()
        await ws.send_text(f"hello {name}, you said {await ws.receive_text()}")
        await ws.close()

    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(app, opts(await acc.start_tcp()))
        ws = await (await acc.session()).websocket("/ws/ada")
        await ws.send("hi")
        assert await ws.receive() == "hello ada, you said hi"
        closed = await ws.receive()
        assert isinstance(closed, CloseConnection) and closed.code == 1000
        # No such route: Starlette closes before accepting, which is a 403.
        ws = await (await acc.session()).websocket("/nowhere")
        assert ws.rejected is not None and ws.rejected.status == 403
        sessions.close()

    run(main())
