"""``Sessions``: the application's handle on its registered sessions, and :func:`serve`."""

from __future__ import annotations

import asyncio
import itertools
import logging

from . import aio, dial
from .errors import SluiceError
from .lifespan import Lifespan
from .options import Options
from .report import Report
from .server import ASGIApp
from .slot import Slot
from .state import Shared

log = logging.getLogger("sluice_sdk")


class Sessions:
    """The sessions of one instance, kept at :attr:`capacity` by background tasks.

    Create it with :func:`serve`. All methods must be called on the event loop that created it.
    """

    def __init__(self, app: ASGIApp, options: Options, lifespan: Lifespan | None = None) -> None:
        self._lifespan = lifespan if lifespan is not None else Lifespan(app, "off")
        self._app = self._lifespan.app
        self._options = options
        self._shared = Shared(Report(options.acceptor))
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()
        self.set_capacity(options.capacity)

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
        dials at once while the instance is held drained."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be a non-negative integer, not {capacity!r}")
        spawn = self._shared.resize(capacity)
        self._shared.retire_idle()
        for _ in range(spawn):
            slot = Slot(next(self._ids), self._shared, self._options, self._app)
            task = asyncio.ensure_future(slot.run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

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
        nothing registers until the capacity is set again; waits as long as any slot lives."""
        shared = self._shared
        await shared.wait_until(lambda: shared.failed is not None and shared.counts.slots == 0)
        assert shared.failed is not None
        return shared.failed

    async def shutdown(self, timeout: float | None = None) -> None:
        """Leaves gracefully (DESIGN.md §3 "Drain"): stops re-dialing, sends
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
        await dial.drain(self._options)
        pending = await self._wait_sessions(deadline)
        pending += await self._close_websockets(deadline)
        await self._lifespan.shutdown()
        if pending:
            raise asyncio.TimeoutError(
                f"{pending} sessions were still open {timeout:g}s after the drain; "
                "they were closed: raise the timeout if requests take longer"
            )
        log.info("drained %s", self._options.service)

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
        self._cancel_sessions()
        await asyncio.gather(*self._tasks, *self._shared.upgraded, return_exceptions=True)
        await self._lifespan.shutdown()

    def _cancel_sessions(self) -> None:
        self._shared.stop()
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
    with ``app``. Returns once the startup is done; sessions register in the background (see
    :meth:`Sessions.wait_registered`). A failed startup raises :class:`LifespanError` before
    any dial."""
    span = Lifespan(app, lifespan)
    await span.startup()
    return Sessions(app, options, span)
