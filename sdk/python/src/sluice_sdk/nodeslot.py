"""A session slot of an instance that dials many nodes: before each dial it picks the live node
with the most room (``Fleet.acquire``), and waits while none has room or the sessions held
everywhere already number ``N``. A session that a node closed after a ``RETIRE`` is no failure:
the slot dials elsewhere at once."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from . import dial
from .errors import ConnectError, SluiceError
from .fleet import Fleet, Node
from .options import Options
from .h2server import H2Connection
from .server import ASGIApp, Connection, Peer
from .slot import _peer, connection, leave
from .state import Shared
from .websocket import WebSocket

log = logging.getLogger("sluice_sdk")


@dataclass(eq=False)
class NodeHooks:
    """A session at one of many nodes: it closes after its response when this SDK retires a
    session of that node itself (the node is not live, or has no control links)."""

    fleet: Fleet
    node: Node
    conn: Connection | H2Connection | None = None
    served: bool = False
    retired: bool = False

    def response_starting(self) -> bool:
        self.served = True
        return self.retired or self.fleet.claim_close(self.node, self)

    def upgraded(self, websocket: WebSocket) -> bool:
        """An accepted WebSocket consumed the session: it runs on its own, and the slot dials
        a replacement at once."""
        self.served = True
        self.fleet.shared.adopt(websocket)
        return True

    @property
    def idle(self) -> bool:
        return self.conn is not None and self.conn.idle

    def close_if_idle(self) -> bool:
        return self.conn is not None and self.conn.close_idle()


@dataclass
class NodeSlot:
    """Keeps one session of ``options`` registered at whichever node needs it, serving ``app``."""

    id: int
    shared: Shared
    options: Options
    app: ASGIApp
    fleet: Fleet

    async def run(self) -> None:
        """Dials until retired, stopped or refused for good. A failed dial makes its node back
        off, not the slot (``Fleet.dial_failed``): the slot may dial another node at once."""
        while True:
            node = await self.fleet.acquire()
            if node is None:
                return
            epoch = node.report.epoch
            outcome: NodeHooks | BaseException
            hooks = NodeHooks(self.fleet, node)
            try:
                outcome = await self._session(node, hooks)
            except SluiceError as e:
                outcome = e
            except Exception as e:  # a bug, not the network: keep the slot alive, but say so
                log.exception("slot %d: session at %s failed", self.id, node)
                outcome = e
            finally:
                retired = self.fleet.release(node, hooks if hooks.conn is not None else None)
            if isinstance(outcome, NodeHooks):
                # A session closed before serving anything, not asked to: do not spin on it.
                if not (outcome.served or outcome.retired or retired):
                    self.fleet.dial_failed(node)
            elif isinstance(outcome, SluiceError) and getattr(outcome, "drained", False):
                self.fleet.held(node, outcome)
            elif isinstance(outcome, SluiceError) and not outcome.retryable:
                return self.shared.slot_failed(outcome)
            else:
                if isinstance(outcome, SluiceError) and not self.shared.counts.stopping:
                    self._dial_failed(node, outcome, epoch)
                self.fleet.dial_failed(node)

    def _dial_failed(self, node: Node, error: SluiceError, epoch: int) -> None:
        """Remembers the error, and logs it once per outage of the node's sessions; a node
        that cannot be reached at all is the link's to tell (down, then back)."""
        self.shared.record(error)
        if not isinstance(error, ConnectError):
            node.report.dial_failed(error, epoch)

    async def _session(self, node: Node, hooks: NodeHooks) -> NodeHooks:
        capacity = self.shared.counts.target
        reader, writer, rest = await dial.register(self.options, capacity, node.endpoint)
        peer = Peer(server=None, client=_peer(writer), forwarded=True)
        hooks.conn = conn = connection(self.options, self.app, reader, writer, hooks, peer)
        with self.shared.session_registered(lambda: False, leave(conn)):
            node.report.registered()
            try:
                unused = self.fleet.opened(node, hooks) or self.shared.counts.stopping
                if unused and isinstance(conn, H2Connection):
                    # Bytes past an HTTP/2 session's 101 are Sluice's preface, not a request:
                    # it closes with GOAWAY (whatever came with the preface is still served).
                    log.debug("slot %d: the new session at %s retires at once", self.id, node)
                    hooks.retired = True
                    conn.begin_close()
                elif unused and not rest:
                    log.debug("slot %d: the new session at %s retires at once", self.id, node)
                    hooks.retired = True
                    writer.close()
                    return hooks
                log.debug("slot %d: session registered at %s", self.id, node)
                await conn.serve(rest)
            finally:
                self.fleet.closed(node, hooks)
        log.debug("slot %d: session at %s ended", self.id, node)
        return hooks
