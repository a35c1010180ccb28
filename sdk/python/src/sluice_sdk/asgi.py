"""ASGI 3 types and the scopes of a request: ``http``, or ``websocket`` for an upgrade."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, MutableMapping
from urllib.parse import unquote_to_bytes

import h11

from .protocol import client_address

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class Peer:
    """Addresses reported in the scope. On sessions (``forwarded``), ``client`` is the session's
    peer, reported only for requests without a valid ``Sluice-Client-Addr``."""

    server: tuple[str, int] | None = None
    client: tuple[str, int] | None = None
    forwarded: bool = False


def scope(request: h11.Request, peer: Peer) -> Scope:
    """The ASGI HTTP scope of ``request``."""
    headers = [(bytes(k), bytes(v)) for k, v in request.headers]
    return http_scope(request.method, bytes(request.target), request.http_version.decode(),
                      headers, peer)


def http_scope(method: bytes, target: bytes, http_version: str,
               headers: list[tuple[bytes, bytes]], peer: Peer) -> Scope:
    """The ASGI HTTP scope of a request, HTTP/1.1 or HTTP/2 alike: ``headers`` as they reach
    the app (lower-case names, values as sent, in order)."""
    raw_path, _, query = target.partition(b"?")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": http_version,
        "method": method.decode("ascii"),
        "scheme": _forwarded_proto(headers) if peer.forwarded else "http",
        "path": unquote_to_bytes(raw_path).decode("utf-8", "surrogateescape"),
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": client_address(headers, peer.client) if peer.forwarded else peer.client,
        "server": peer.server,
    }


def websocket_scope(request: h11.Request, peer: Peer, subprotocols: list[str]) -> Scope:
    """The ASGI WebSocket scope of an upgrade ``request``; it offers the denial response
    extension (an HTTP answer instead of the ``101``)."""
    ws = scope(request, peer)
    del ws["method"]
    ws.update(
        type="websocket",
        scheme="wss" if ws["scheme"] == "https" else "ws",
        subprotocols=subprotocols,
        extensions={"websocket.http.response": {}},
    )
    return ws


def _forwarded_proto(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's scheme as the proxy reports it (docs/design.md §3), so apps build right URLs."""
    for name, value in headers:
        if name == b"x-forwarded-proto" and value.strip().lower() in (b"http", b"https"):
            return value.strip().lower().decode()
    return "http"
