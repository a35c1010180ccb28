"""``Sessions``: the application's handle on its registered sessions, and :func:`serve`."""

from __future__ import annotations

import asyncio
import itertools
import logging

from . import address, aio, dial
from .errors import SluiceError
from .fleet import Fleet, Node, NodeStatus
from .lifespan import Lifespan
from .links import Discovery, keep_link
from .nodeslot import NodeSlot
from .options import Options
from .report import Report
from .server import ASGIApp
from .slot import Slot
from .state import Shared

log = logging.getLogger("sluice_sdk")


class Sessions:
    """The sessions of one instance, kept at :attr:`capacity` by background tasks.

    With an acceptor address that names several nodes (``dns:NAME:PORT`` or a list), the
    instance keeps a control link to each node and splits its capacity among them by demand
    (protocol/README.md "Many nodes"); :attr:`nodes` lists them.

    Create it with :func:`serve`. All methods must be called on the event loop that created it.
    """

    def __init__(self, app: ASGIApp, options: Options, lifespan: Lifespan | None = None) -> None:
        self._lifespan = lifespan if lifespan is not None else Lifespan(app, "off")
        self._app = self._lifespan.app
        self._options = options
        self._shared = Shared(Report(str(options.acceptor)))
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()
        self._fleet: Fleet | None = None
        self._discovery: asyncio.Task[None] | None = None
        where = options.address
        if not isinstance(where, address.Single):
            self._fleet = Fleet(self._shared, options.node_grace, self._start_link,
                                first_wait=options.handshake_timeout, backoff=options.backoff)
            self._discovery = asyncio.ensure_future(Discovery(where, options).run(self._fleet))
        self.set_capacity(options.capacity)

    def _start_link(self, node: Node) -> asyncio.Task[None]:
        assert self._fleet is not None
        return asyncio.ensure_future(keep_link(self._fleet, node, self._options))

    def __repr__(self) -> str:
        c = self._shared.counts
        return (
            f"Sessions(service={self._options.service!r}, acceptor={self._options.acceptor!r}, "
            f"capacity={c.target}, registered={self.registered})"
        )

    def set_capacity(self, capacity: int) -> None:
        """Changes how many sessions to keep registered. Growing dials new sessions at once;
        shrinking retires surplus ones: idle sessions close at once (the proxy drops a session
        it sees closed while idle), busy ones answer their current response with
        ``Connection: close``, and slots not registered at that moment stop dialing. So once
        this returns, no more than ``capacity`` requests reach the app beyond those already
        running. Setting the capacity again restarts slots that were refused for good, and
        dials at once while the instance is held drained.

        With many nodes every node hears the new capacity, the split is planned again, and a
        surplus is retired by the nodes (``RETIRE``: idle sessions close as the line arrives,
        busy ones after their response), so a request a node leased before that still reaches
        the app; no session is dialed while the sessions held everywhere are ``capacity`` or
        more."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be a non-negative integer, not {capacity!r}")
        spawn = self._shared.resize(capacity)
        if self._fleet is not None:
            self._fleet.capacity_changed()
        else:
            self._shared.retire_idle()
        for _ in range(spawn):
            task = asyncio.ensure_future(self._slot().run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _slot(self) -> Slot | NodeSlot:
        if self._fleet is not None:
            return NodeSlot(next(self._ids), self._shared, self._options, self._app, self._fleet)
        return Slot(next(self._ids), self._shared, self._options, self._app)

    @property
    def nodes(self) -> list[NodeStatus]:
        """Every node this instance knows, in the order it plans them: address, whether it is
        live, its smoothed demand, the sessions held there and the split's target for it. One
        entry for a single acceptor (no control link: no demand)."""
        if self._fleet is not None:
            return self._fleet.status()
        registered = self._shared.registered
        return [NodeStatus(str(self._options.acceptor), True, None, registered,
                           self.capacity, 0, "single")]

    @property
    def capacity(self) -> int:
        """The capacity asked for (initially ``Options.capacity``); sessions converge on it."""
        return self._shared.counts.target

    @property
    def registered(self) -> int:
        """Sessions registered right now; 0 until the first handshake completes."""
        return self._shared.registered

    @property
    def last_error(self) -> SluiceError | None:
        """The most recent dial, handshake or refusal error of any session (such as a 401 that
        stopped a slot for good); ``None`` until one happens, not cleared by later successes."""
        return self._shared.last_error

    async def wait_registered(self, n: int | None = None, timeout: float | None = None) -> None:
        """Returns once at least ``n`` (default: the capacity) sessions are registered. Raises
        the error of a slot refused for good (e.g. :class:`Refused` 401) or, while an operator
        holds the instance drained, its ``410``; and
        :class:`asyncio.TimeoutError` after ``timeout`` seconds if given."""
        want = self.capacity if n is None else n

        def ready() -> bool:
            if self._shared.failed is not None:
                raise self._shared.failed
            if self._shared.held is not None:
                raise self._shared.held
            return self._shared.registered >= want

        await aio.wait_for(self._shared.wait_until(ready), timeout)

    async def wait_refused(self) -> SluiceError:
        """Returns the refusal (400, 401 or 404) once every slot has stopped for good, so that
        nothing registers until the capacity is set again; waits as long as any slot lives.
        With many nodes, also once every node refused this instance's control link for good
        (the links keep retrying: a node's configuration may be fixed)."""
        shared, fleet = self._shared, self._fleet

        def refused() -> bool:
            everywhere = fleet is not None and fleet.failed is not None
            return shared.failed is not None and (shared.counts.slots == 0 or everywhere)

        await shared.wait_until(refused)
        assert shared.failed is not None
        return shared.failed

    async def shutdown(self, timeout: float | None = None) -> None:
        """Leaves gracefully (docs/design.md §3 "Drain"): stops re-dialing, sends
        ``POST /.sluice/v1/drain`` for this instance on a new connection, and once the proxy
        answers ``200`` waits until the proxy has closed every session (in-flight requests
        finish first), then runs the application's lifespan shutdown. A failed drain request
        raises at once (re-dialing stays off; :meth:`aclose` ends the rest). After ``timeout``
        seconds (default: none) closes the rest abruptly, runs the lifespan shutdown and raises
        :class:`asyncio.TimeoutError`."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._shared.stop()
        log.info("draining %s", self._options.service)
        if self._fleet is None:
            await dial.drain(self._options)
        else:
            await self._drain_nodes(self._fleet)
        # The proxy leases no more: HTTP/2 sessions say GOAWAY, their streams in flight finish.
        self._shared.leave()
        pending = await self._wait_sessions(deadline)
        pending += await self._close_websockets(deadline)
        self._stop_nodes()
        await self._lifespan.shutdown()
        if pending:
            raise asyncio.TimeoutError(
                f"{pending} sessions were still open {timeout:g}s after the drain; "
                "they were closed: raise the timeout if requests take longer"
            )
        log.info("drained %s", self._options.service)

    async def _drain_nodes(self, fleet: Fleet) -> None:
        """Sends the drain request to every node that holds a session of this instance, at
        once; a node whose request fails has its sessions closed from here (idle ones now, busy
        ones after their response) and says so in one warning."""
        if self._discovery is not None:
            self._discovery.cancel()
        fleet.stopping = True
        nodes = [n for n in fleet.nodes if n.sessions > 0]
        drains = [dial.drain(self._options, n.endpoint) for n in nodes]
        results = await asyncio.gather(*drains, return_exceptions=True)
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, Exception):
                log.warning("the drain request to node %s failed (%s); closing its %d "
                            "sessions from here", node, result, node.sessions)
                fleet.vacate(node)

    def _stop_nodes(self) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
        if self._fleet is not None:
            self._fleet.close()

    def _link_tasks(self) -> list[asyncio.Task[None]]:
        tasks = [n.task for n in self._fleet.nodes] if self._fleet is not None else []
        return [t for t in [*tasks, self._discovery] if t is not None]

    async def _wait_sessions(self, deadline: float | None) -> int:
        """Waits for every session to end; at ``deadline`` (loop time) closes the rest. Returns
        how many had to be closed."""
        return await _wait_or_cancel(set(self._tasks), deadline)

    async def _close_websockets(self, deadline: float | None) -> int:
        """Closes the WebSockets that consumed sessions (1012: the service is restarting) and
        waits until their applications return; at ``deadline`` cancels the rest."""
        for websocket in list(self._shared.upgraded.values()):
            websocket.shutdown()
        return await _wait_or_cancel(set(self._shared.upgraded), deadline)

    async def drain(self, timeout: float | None = None) -> None:
        """The same as :meth:`shutdown`, named after the protocol step."""
        await self.shutdown(timeout)

    def close(self) -> None:
        """Stops at once: no more dials, every session closed, in-flight requests cut off, no
        lifespan shutdown (:meth:`aclose` runs it)."""
        self._cancel_sessions()
        self._lifespan.close()

    async def aclose(self) -> None:
        """Stops at once as :meth:`close` does, waits until every session is closed, then runs
        the application's lifespan shutdown: the way out when the drain request failed."""
        links = self._link_tasks()
        self._cancel_sessions()
        await asyncio.gather(*self._tasks, *self._shared.upgraded, *links,
                             return_exceptions=True)
        await self._lifespan.shutdown()

    def _cancel_sessions(self) -> None:
        self._shared.stop()
        self._stop_nodes()
        for task in [*self._tasks, *self._shared.upgraded]:
            task.cancel()


async def _wait_or_cancel(tasks: set[asyncio.Task[None]], deadline: float | None) -> int:
    """Waits for ``tasks``; at ``deadline`` (loop time) cancels the rest and returns how many."""
    if not tasks:
        return 0
    timeout = None if deadline is None else max(deadline - asyncio.get_running_loop().time(), 0)
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    # Awaited so that every session is closed (its writer too) when this returns.
    await asyncio.gather(*pending, return_exceptions=True)
    return len(pending)


async def serve(app: ASGIApp, options: Options, *, lifespan: str = "auto") -> Sessions:
    """Runs the application's ASGI lifespan startup (``lifespan``: ``"auto"``, the default,
    runs it if the application supports it; ``"on"``: it must; ``"off"``: never), then starts
    keeping ``options.capacity`` sessions registered, each serving HTTP/1.1 (and WebSocket)
    with ``app``, or HTTP/2 with ``options.streams`` requests at once. Returns once the startup is done; sessions register in the background (see
    :meth:`Sessions.wait_registered`). A failed startup raises :class:`LifespanError` before
    any dial."""
    span = Lifespan(app, lifespan)
    await span.startup()
    return Sessions(app, options, span)
