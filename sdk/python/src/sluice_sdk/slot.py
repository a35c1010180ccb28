"""One slot: a task that keeps one session registered — dial, register, serve HTTP/1.1 until
the session ends, then dial a replacement — until it is retired, stopped or refused for good."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from . import dial
from .errors import SluiceError
from .options import Options
from .h2server import H2Connection
from .server import ASGIApp, Connection, Hooks, Peer
from .state import Shared
from .websocket import WebSocket

log = logging.getLogger("sluice_sdk")


@dataclass
class SessionHooks:
    """What one session learned while serving; marks its response when it retires."""

    shared: Shared
    served: bool = False
    """At least one response was produced."""
    retired: bool = False
    """A response carried ``Connection: close`` for a retirement: do not re-dial."""

    def response_starting(self) -> bool:
        """Claims an owed retirement, if any, for this response (docs/design.md §3 "Retire")."""
        self.served = True
        if not self.retired and self.shared.claim_retirement():
            log.debug("retiring session: answering with Connection: close")
            self.retired = True
        return self.retired

    def upgraded(self, websocket: WebSocket) -> bool:
        """An accepted WebSocket consumed the session: it runs on its own, and the slot dials
        a replacement at once (the proxy lists the session as upgraded, not as capacity)."""
        self.served = True
        self.shared.adopt(websocket)
        return True


@dataclass
class Slot:
    """Keeps one session of ``options`` registered, serving ``app``."""

    id: int
    shared: Shared
    options: Options
    app: ASGIApp

    async def run(self) -> None:
        """Dials until retired, stopped or refused for good."""
        failures = 0
        while not self.shared.should_end():
            if self.shared.held is not None and not await self._await_probe():
                return
            epoch, unheld = self.shared.report.epoch, self.shared.unheld
            try:
                hooks = await self._session()
            except SluiceError as e:
                if getattr(e, "drained", False):
                    # A 410 to a dial begun before the capacity was set again is stale: that
                    # said "dial at once", and so this slot does.
                    if unheld == self.shared.unheld:
                        self.shared.hold(e, self.options.drained_probe)
                    continue
                if not e.retryable:
                    return self.shared.slot_failed(e)
                if not self.shared.counts.stopping:
                    self.shared.dial_failed(e, epoch)
                pause: float | None = self.options.backoff.delay(failures)
                failures += 1
            except Exception:  # a bug, not the network: keep the slot alive, but say so
                log.exception("slot %d: session failed", self.id)
                pause = self.options.backoff.delay(failures)
                failures += 1
            else:
                if hooks.retired:
                    return
                failures = 0
                # A session closed before serving anything: do not spin on such a proxy.
                pause = None if hooks.served else self.options.backoff.delay(0)
            if pause is not None and await self.shared.pause(pause):
                return

    async def _await_probe(self) -> bool:
        """While the instance is drained: waits until this slot dials the instance's one probe
        (every ``drained_probe``) or the hold ends; ``False`` if the slot should end."""
        loop = asyncio.get_running_loop()
        while self.shared.held is not None:
            if self.shared.should_end():
                return False
            if self.shared.claim_probe(self.options.drained_probe):
                log.debug("slot %d: probing whether the instance was resumed", self.id)
                return True
            await self.shared.changed(timeout=self.shared.next_probe - loop.time())
        return True

    async def _session(self) -> SessionHooks:
        reader, writer, rest = await dial.register(self.options, self.shared.counts.target)
        hooks = SessionHooks(self.shared)
        peer = Peer(server=None, client=_peer(writer), forwarded=True)
        conn = connection(self.options, self.app, reader, writer, hooks, peer)

        def retire_if_idle() -> bool:
            if hooks.retired or not conn.idle or not self.shared.claim_retirement():
                return False
            log.debug("slot %d: retiring idle session: closing it", self.id)
            hooks.retired = True
            return conn.close_idle()

        with self.shared.session_registered(retire_if_idle, leave(conn)):
            log.debug("slot %d: session registered", self.id)
            # (On an HTTP/2 session, bytes past the 101 are Sluice's preface, not a request.)
            h2 = isinstance(conn, H2Connection)
            if (not rest or h2) and self.shared.claim_retirement():
                # A shrink while this session was registering: it retires at once, unused.
                log.debug("slot %d: retiring the new session: closing it", self.id)
                hooks.retired = True
                if not h2:
                    writer.close()
                    return hooks
                conn.begin_close()  # GOAWAY: what came with the preface is still served
            await conn.serve(rest)
        log.debug("slot %d: session ended", self.id)
        return hooks


def connection(options: Options, app: ASGIApp, reader: asyncio.StreamReader,
               writer: asyncio.StreamWriter, hooks: Hooks,
               peer: Peer) -> Connection | H2Connection:
    """The server of a new session: HTTP/2 with ``options.streams`` (the acceptor said
    ``Sluice-Protocol: h2``, or the dial raised), else HTTP/1.1."""
    if options.streams is not None:
        return H2Connection(app, reader, writer, options.streams, hooks, peer)
    return Connection(app, reader, writer, hooks, peer)


def leave(conn: Connection | H2Connection) -> Callable[[], None] | None:
    """What the drain's end does to a session: an HTTP/2 one says ``GOAWAY`` (its in-flight
    streams finish); an HTTP/1.1 one waits for the proxy to close it."""
    return conn.begin_close if isinstance(conn, H2Connection) else None


def _peer(writer: asyncio.StreamWriter) -> tuple[str, int] | None:
    """The acceptor's TCP address on a session (``None`` over a UNIX socket)."""
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        return (str(name[0]), int(name[1]))
    return None
