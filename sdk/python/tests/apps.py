"""Small ASGI applications for the tests."""

from __future__ import annotations

import asyncio
from typing import Any


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers ``hello <path>?<query>`` after reading the body."""
    while (await receive()).get("more_body"):
        pass
    body = f"hello {scope['method']} {scope['path']}?{scope['query_string'].decode()}\n".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Gate:
    """An app that blocks each request until ``release`` and reports when it started."""

    def __init__(self) -> None:
        self.started: asyncio.Queue[str] = asyncio.Queue()
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.started.put(scope["path"])
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done\n"})
