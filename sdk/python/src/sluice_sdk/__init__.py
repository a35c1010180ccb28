"""Serve an ASGI (or WSGI) application through Sluice by *dialing in*.

The service opens connections to the proxy's acceptor and registers each as a session
(docs/design.md §3), so the proxy never connects to it and each session is one unit of declared
concurrency. :func:`serve` keeps ``Options.capacity`` sessions registered, re-dials a
replacement whenever the proxy closes one, backs off with jitter while the acceptor is
unreachable or busy, stops the slots for good on 400/401/404, and probes slowly while an
operator holds the instance drained (410). ``Options.streams`` makes each session an HTTP/2
one taking that many requests at once. :class:`Sessions` changes the
capacity at runtime and drains gracefully::

    sessions = await sluice_sdk.serve(app, Options(acceptor="127.0.0.1:7070", service="hello"))
    await sessions.wait_registered()
    sessions.set_capacity(4)        # surplus sessions retire on their next response
    await sessions.shutdown()       # drain, then wait until the proxy closed every session

An acceptor address that names several nodes (``"dns:NAME:PORT"``, ``"a:7070,b:7070"`` or a
list) makes the instance dial every node and split its capacity among them by demand, never
holding more than the capacity in sum (protocol/README.md "Many nodes"); ``sessions.nodes``
lists them.

Layout:

* ``options``: :class:`Options`, :class:`Backoff`, validation.
* ``address``: what an acceptor address names: one node, a DNS name's records, or a list.
* ``protocol``: the registration, drain and control-link requests and the acceptor's answers
  (sans I/O).
* ``dial``: TCP/UNIX/TLS connections and the handshakes, to the acceptor or to one node.
* ``aio``: ``wait_for`` that never loses a cancellation.
* ``asgi``: ASGI types and the ``http`` and ``websocket`` scopes of a request.
* ``server``: one HTTP/1.1 connection (h11) running an ASGI application.
* ``h2server``: one HTTP/2 connection (h2) running an ASGI application, a stream per request
  (sessions registered with ``Options.streams``).
* ``websocket``: a WebSocket upgrade on that connection (wsproto).
* ``slot``: one task per session: dial, register, serve, re-dial, retire.
* ``state``: counters shared by the handle and the slots.
* ``control``: the control link's lines (``DEMAND``, ``DRAINING``, ``RETIRE``, ``CAPACITY``).
* ``split``: the protocol's split of a capacity across nodes by demand.
* ``fleet``: many nodes: what the instance knows of each, the plan, the slots' choice of node.
* ``links``: many nodes' I/O: a control link per node, and the resolver that finds them.
* ``nodeslot``: a slot of an instance with many nodes: picks a node with room, then dials.
* ``report``: what an instance logs (once per outage, refusal, drain hold, capacity change).
* ``sessions``: the :class:`Sessions` handle and :func:`serve`.
* ``lifespan``: the ASGI lifespan protocol (startup before the first dial, shutdown after the
  drain).
* ``listen``: :func:`serve_tcp`, the same server on a listening socket.
* ``wsgi``: :class:`WsgiApp`, a WSGI adapter.
* ``runner``: :func:`run` and ``python -m sluice_sdk MODULE:APP ...`` (uvicorn-style).
"""

from .address import InvalidAddress
from .errors import (
    ConnectError,
    H2Unsupported,
    HandshakeTimeout,
    LifespanError,
    OptionsError,
    ProtocolError,
    Refused,
    SluiceError,
)
from .fleet import NodeStatus
from .listen import TcpServer, serve_tcp
from .options import Backoff, Options
from .protocol import Identity
from .runner import run
from .sessions import Sessions, serve
from .websocket import WebSocketClosed
from .wsgi import WsgiApp

__all__ = [
    "Backoff",
    "ConnectError",
    "H2Unsupported",
    "HandshakeTimeout",
    "Identity",
    "InvalidAddress",
    "LifespanError",
    "NodeStatus",
    "Options",
    "OptionsError",
    "ProtocolError",
    "Refused",
    "Sessions",
    "SluiceError",
    "TcpServer",
    "WebSocketClosed",
    "WsgiApp",
    "run",
    "serve",
    "serve_tcp",
]
