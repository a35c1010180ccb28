"""``WsgiApp``: runs a WSGI application as an ASGI one, in a thread pool executor.

The request body is read whole before the WSGI application is called (the proxy buffers bodies
anyway); the response is streamed back chunk by chunk as the application yields it.
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any

from .server import Receive, Scope, Send

WSGIApplication = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class WsgiApp:
    """An ASGI application calling the WSGI ``app`` in ``executor`` (default: the loop's default
    executor), one worker thread per request. At most ``window`` chunks of the response (default
    4) wait for the connection; further ones block the worker thread. If the client goes away
    mid-response, the worker's next chunk raises inside the application's iteration so that it
    stops, and its iterable's ``close()`` is still called."""

    def __init__(self, app: WSGIApplication, executor: Executor | None = None, window: int = 4) -> None:
        if window < 1:
            raise ValueError("window must be at least 1 chunk")
        self.app = app
        self.executor = executor
        self.window = window

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        loop = asyncio.get_running_loop()
        channel = _Channel(loop, self.window)
        work = loop.run_in_executor(self.executor, _run, self.app, environ(scope, body), channel.put)
        # Once the body is read, receive() only returns on a disconnect or the response's end.
        watch = asyncio.ensure_future(receive())
        watch.add_done_callback(lambda _: channel.abandon())
        try:
            await _relay(channel, send)
        finally:
            channel.abandon()  # unblocks the worker if the relay ended early
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            await work


class _Abandoned(Exception):
    """Raised in the worker thread: nobody will send its output any more."""


class _Channel:
    """Hands the worker thread's output to the event loop, at most ``window`` items ahead."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window: int) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._credits = threading.Semaphore(window)
        self._abandoned = False

    def put(self, item: tuple[str, Any]) -> None:
        """In the worker thread: queues ``item``, waiting while ``window`` items are queued."""
        self._credits.acquire()
        if self._abandoned:
            self._credits.release()
            raise _Abandoned("the client went away; the response is not sent")
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self) -> tuple[str, Any]:
        """On the loop: the next item, or ``("abandoned", None)``."""
        item = await self._queue.get()
        self._credits.release()
        return item

    def abandon(self) -> None:
        """On the loop: makes the worker's next :meth:`put` raise, and :meth:`get` return."""
        if not self._abandoned:
            self._abandoned = True
            self._credits.release()
            self._queue.put_nowait(("abandoned", None))


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away before the body was read")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _relay(channel: _Channel, send: Send) -> None:
    while True:
        kind, value = await channel.get()
        if kind == "error":
            raise value
        if kind == "start":
            status, headers = value
            await send({"type": "http.response.start", "status": status, "headers": headers})
        elif kind == "body":
            await send({"type": "http.response.body", "body": value, "more_body": True})
        elif kind == "end":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        else:  # abandoned: the client is gone, the connection closes
            return


class _Response:
    """In the worker thread: ``start_response`` and the body (PEP 3333), sent through ``put``.
    The head goes out with the first non-empty chunk, so an error before it can still be a 500."""

    def __init__(self, put: Callable[[tuple[str, Any]], None]) -> None:
        self.put = put
        self.head: tuple[int, list[tuple[bytes, bytes]]] | None = None
        self.sent = False

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        if exc_info is not None:
            try:
                if self.sent:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None  # no reference cycle through the traceback
        elif self.head is not None:
            raise RuntimeError("start_response called twice without exc_info")
        code = int(status.split(" ", 1)[0])
        self.head = (code, [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers])
        return self.write

    def write(self, data: bytes) -> None:
        """The legacy ``write()`` callable: sends ``data`` before the iterable's chunks."""
        if data:
            self._start()
            self.put(("body", bytes(data)))

    def _start(self) -> None:
        if self.sent:
            return
        if self.head is None:
            raise RuntimeError("the WSGI application did not call start_response")
        self.put(("start", self.head))
        self.sent = True

    def finish(self) -> None:
        self._start()
        self.put(("end", None))


def _run(app: WSGIApplication, env: dict[str, Any], put: Callable[[tuple[str, Any]], None]) -> None:
    """In the worker thread: calls the application and hands its output to the loop."""
    response = _Response(put)
    try:
        result = app(env, response.start_response)
        try:
            for chunk in result:
                response.write(chunk)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        response.finish()
    except _Abandoned:
        pass
    except BaseException as e:  # re-raised on the loop, where it becomes a 500 if possible
        try:
            put(("error", e))
        except _Abandoned:
            pass


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
        "wsgi.input_terminated": True,
    }
    if body or _has_body(scope["headers"]):
        # Only a request that has a body says how long it is: a GET must not grow a
        # ``Content-Length: 0`` on its way to the application.
        env["CONTENT_LENGTH"] = str(len(body))
    if scope.get("client"):
        env["REMOTE_ADDR"] = scope["client"][0]
        env["REMOTE_PORT"] = str(scope["client"][1])
    for name, value in scope["headers"]:
        if b"_" in name:
            # "X_User" would become HTTP_X_USER, the same key as a proxy-set "X-User": drop it
            # so that a client cannot spoof a header the proxy vouches for (as gunicorn does).
            continue
        key = name.decode("latin-1").upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            env["CONTENT_TYPE"] = value.decode("latin-1")
        elif key != "CONTENT_LENGTH":
            key = "HTTP_" + key
            text = value.decode("latin-1")
            env[key] = f"{env[key]},{text}" if key in env else text
    return env


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request was framed with a body (RFC 9112 §6.1), however short."""
    return any(name in (b"content-length", b"transfer-encoding") for name, _ in headers)
