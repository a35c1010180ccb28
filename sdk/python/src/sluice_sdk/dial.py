"""Connections to the acceptor: TCP (no Nagle, keepalive), UNIX or TLS, then the registration,
drain or control-link handshake of docs/design.md §3, bounded by ``handshake_timeout``. With many
nodes each dial goes to one :class:`Endpoint`; otherwise to ``Options.acceptor``."""

from __future__ import annotations

import asyncio
import socket
from asyncio import StreamReader, StreamWriter
from dataclasses import dataclass

from . import aio
from .address import node_key
from .errors import ConnectError, HandshakeTimeout, ProtocolError, Refused, SluiceError
from .options import Options, parse_acceptor
from .protocol import Handshake, Reply, Switched, Unsupported

#: Seconds a session may sit silent before the kernel starts probing it.
KEEPALIVE_IDLE = 30
READ_SIZE = 16384
#: Seconds to wait for a refusal's reason after its head: an acceptor sends both at once, and
#: anything else may never end its body.
REASON_WAIT = 0.25

Stream = tuple[StreamReader, StreamWriter]


@dataclass(frozen=True)
class Endpoint:
    """One node of many: an IP address and port, and the name its TLS certificate must carry
    (``None``: the address itself)."""

    host: str
    port: int
    server_hostname: str | None = None

    def __str__(self) -> str:
        return node_key(self.host, self.port)


async def register(options: Options, capacity: int,
                   node: Endpoint | None = None) -> tuple[StreamReader, StreamWriter, bytes]:
    """Dials and registers one session (at ``node``, else at ``options.acceptor``); returns the
    stream and the bytes read past the ``101`` (the start of the first request). ``capacity``
    goes into ``Sluice-Capacity``; with ``options.streams`` the session is an HTTP/2 one, and
    a ``101`` that does not say so raises :class:`H2Unsupported` (not retryable)."""
    handshake = Handshake("register", options.identity, capacity, options.streams)
    reader, writer, reply = await _open(options, handshake, node)
    if not isinstance(reply, Switched):  # feed() classifies by kind; kept for -O runs too
        writer.close()
        raise ProtocolError("the acceptor answered a registration like a drain")
    return reader, writer, reply.rest


async def drain(options: Options, node: Endpoint | None = None) -> None:
    """Sends ``POST /.sluice/v1/drain`` for the instance on a new connection (to ``node``, else
    to ``options.acceptor``); expects ``200``."""
    _, writer, _ = await _open(options, Handshake("drain", options.identity), node)
    writer.close()


async def control(options: Options, capacity: int,
                  node: Endpoint) -> tuple[StreamReader, StreamWriter, bytes] | None:
    """Opens the control link to ``node``: the stream and the bytes read past the ``101`` (its
    first lines), or ``None`` when the node's acceptor does not know control links (``400``).
    Refusals raise as a registration's do."""
    handshake = Handshake("control", options.identity, capacity)
    reader, writer, reply = await _open(options, handshake, node)
    if isinstance(reply, Unsupported):
        writer.close()
        return None
    if not isinstance(reply, Switched):
        writer.close()
        raise ProtocolError("the acceptor answered a control link like a drain")
    return reader, writer, reply.rest


async def _open(options: Options, handshake: Handshake,
                node: Endpoint | None) -> tuple[StreamReader, StreamWriter, Reply]:
    """Connects and exchanges ``handshake``, both within one ``handshake_timeout``."""

    async def attempt() -> tuple[StreamReader, StreamWriter, Reply]:
        reader, writer = await _connect(options, node)
        try:
            return reader, writer, await _exchange(reader, writer, handshake)
        except BaseException:  # including the timeout's cancellation
            writer.close()
            raise

    try:
        return await aio.wait_for(attempt(), options.handshake_timeout,
                                  discard=lambda opened: opened[1].close())
    except asyncio.TimeoutError:
        raise HandshakeTimeout(options.handshake_timeout) from None


async def _connect(options: Options, node: Endpoint | None) -> Stream:
    """Connects to ``node``, else to ``options.acceptor`` (TCP or UNIX), with TLS if asked."""
    if node is None:
        kind, where = parse_acceptor(options.acceptor)
        label, name = str(options.acceptor), options.tls_hostname
    else:
        kind, where = "tcp", (node.host, node.port)
        label = str(node)
        name = options.server_hostname if options.server_hostname is not None else (
            node.server_hostname or node.host)
    tls = {"ssl": options.ssl, "server_hostname": name} if options.ssl else {}
    try:
        if kind == "unix":
            assert isinstance(where, str)
            return await asyncio.open_unix_connection(where, limit=READ_SIZE, **tls)
        host, port = where
        reader, writer = await asyncio.open_connection(host, port, limit=READ_SIZE, **tls)
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        raise ConnectError(label, e) from e
    try:
        _tune(writer)
    except OSError as e:
        writer.close()
        raise ConnectError(label, e) from e
    return reader, writer


def _tune(writer: StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # A session idles for long stretches; keepalive finds one whose peer vanished.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)


async def _exchange(reader: StreamReader, writer: StreamWriter, handshake: Handshake):  # type: ignore[no-untyped-def]
    try:
        writer.write(handshake.request)
        await writer.drain()
        while True:
            data = await reader.read(READ_SIZE)
            reply = handshake.feed(data)
            if reply is not None:
                return reply
            if not data:
                raise ProtocolError("the acceptor closed the connection before answering")
    except Refused as e:
        if e.reason:
            raise
        raise Refused(e.status, await _reason(reader, handshake)) from None
    except SluiceError:
        raise
    except OSError as e:
        raise ProtocolError(f"I/O error on the acceptor connection: {e}") from e


async def _reason(reader: StreamReader, handshake: Handshake) -> str:
    """Reads the rest of a refusal's first body line, briefly; what it says, or ``""``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REASON_WAIT
    data = b"x"
    while data and (left := deadline - loop.time()) > 0:
        try:
            data = await aio.wait_for(reader.read(READ_SIZE), left)
        except (asyncio.TimeoutError, OSError):
            break
        if reason := handshake.reason(data):
            return reason
    return handshake.reason(b"\n")  # EOF or no time left: whatever came
