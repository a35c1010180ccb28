#!/usr/bin/env python3
"""A dial-in service for the HTTP/3 tests: registers N sessions with the Python SDK and answers
every request with ``dialin <METHOD> <path?query> <body length>`` and the body it read, echoed.
Prints ``registered N`` once they are registered. Token: env SLUICE_TOKEN."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import sluice_sdk
from sluice_sdk import Options


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    query = scope.get("query_string", b"").decode()
    target = scope["path"] + (f"?{query}" if query else "")
    head = f"dialin {scope['method']} {target} {len(body)}\n".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(head) + len(body)).encode())]})
    await send({"type": "http.response.body", "body": head + body})


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--acceptor", required=True)
    parser.add_argument("--capacity", type=int, default=2)
    args = parser.parse_args()
    options = Options(acceptor=args.acceptor, service="echo", instance="echo-1",
                      token=os.environ["SLUICE_TOKEN"], capacity=args.capacity)
    sessions = await sluice_sdk.serve(app, options)
    await sessions.wait_registered(args.capacity)
    print(f"registered {args.capacity}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
