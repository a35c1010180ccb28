"""``WsgiApp``: runs a WSGI application as an ASGI one, in a thread pool executor.

The request body is read whole before the WSGI application is called (the proxy buffers bodies
anyway); the response is streamed back chunk by chunk as the application yields it.
"""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any

from .server import Receive, Scope, Send

WSGIApplication = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class WsgiApp:
    """An ASGI application calling ``app`` in ``executor`` (default: the loop's executor)."""

    def __init__(self, app: WSGIApplication, executor: Executor | None = None) -> None:
        self.app = app
        self.executor = executor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def put(item: tuple[str, Any]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        work = loop.run_in_executor(self.executor, _run, self.app, environ(scope, body), put)
        try:
            await _relay(queue, send)
        finally:
            await work


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away before the body was read")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _relay(queue: asyncio.Queue[tuple[str, Any]], send: Send) -> None:
    while True:
        kind, value = await queue.get()
        if kind == "error":
            raise value
        if kind == "start":
            status, headers = value
            await send({"type": "http.response.start", "status": status, "headers": headers})
        elif kind == "body":
            await send({"type": "http.response.body", "body": value, "more_body": True})
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return


def _run(app: WSGIApplication, env: dict[str, Any], put: Callable[[tuple[str, Any]], None]) -> None:
    """In the worker thread: calls the application and hands its output to the loop."""
    head: list[Any] = []
    started = False

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        head[:] = [int(status.split(" ", 1)[0]), [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]]
        return lambda data: None  # the legacy write() callable is not supported

    try:
        result = app(env, start_response)
        try:
            for chunk in result:
                if chunk and not started:
                    put(("start", tuple(head)))
                    started = True
                if chunk:
                    put(("body", bytes(chunk)))
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if not started:
            put(("start", tuple(head)))
        put(("end", None))
    except BaseException as e:  # re-raised on the loop, where it becomes a 500 if possible
        put(("error", e))


def environ(scope: Scope, body: bytes) -> dict[str, Any]:
    """The WSGI environ (PEP 3333) of an ASGI HTTP scope with a fully read body."""
    server = scope.get("server") or ("localhost", 80)
    env: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": "",
        "PATH_INFO": scope["path"].encode("utf-8", "surrogateescape").decode("latin-1"),
        "QUERY_STRING": scope["query_string"].decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "CONTENT_LENGTH": str(len(body)),
    }
    if scope.get("client"):
        env["REMOTE_ADDR"] = scope["client"][0]
    for name, value in scope["headers"]:
        key = name.decode("latin-1").upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            env["CONTENT_TYPE"] = value.decode("latin-1")
        elif key != "CONTENT_LENGTH":
            key = "HTTP_" + key
            text = value.decode("latin-1")
            env[key] = f"{env[key]},{text}" if key in env else text
    return env
