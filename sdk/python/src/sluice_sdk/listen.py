"""``serve_tcp``: the same ASGI application and HTTP/1.1 code on a plain listening socket, to
compare a static (listening) cluster with dialing in on equal terms."""

from __future__ import annotations

import asyncio
import socket
from asyncio import StreamReader, StreamWriter

from .server import ASGIApp, Connection, Peer


class TcpServer:
    """A listening HTTP/1.1 server; ``address`` is the bound ``(host, port)``."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.address: tuple[str, int] = ("", 0)

    async def _start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accept, host, port, backlog=1024)
        self.address = self._server.sockets[0].getsockname()[:2]

    async def _accept(self, reader: StreamReader, writer: StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = Peer(server=self.address, client=writer.get_extra_info("peername"))
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await Connection(self._app, reader, writer, None, peer).serve()
        finally:
            self._conns.discard(task)

    def close(self) -> None:
        """Stops listening and closes every open connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()

    async def wait_closed(self) -> None:
        """Waits until the listener and its connections are closed."""
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def serve_forever(self) -> None:
        """Serves until cancelled or closed."""
        assert self._server is not None
        try:
            await self._server.serve_forever()
        except asyncio.CancelledError:
            if self._server.is_serving():
                raise


async def serve_tcp(app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> TcpServer:
    """Listens on ``host:port`` (port 0: any free port) and serves ``app`` with HTTP/1.1 on each
    accepted connection; returns once listening."""
    server = TcpServer(app)
    await server._start(host, port)
    return server
