"""The bookkeeping shared by the :class:`~sluice_sdk.Sessions` handle and its slot tasks.

A *slot* is a task that keeps one session registered, re-dialing when it ends. The handle sets
a target; growing spawns slots, shrinking owes *retirements*: the next slot to reach a decision
point (a response to send, a dial to start, a backoff to wait) claims one and ends. Everything
runs on one event loop, so each method is atomic without a lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import SluiceError
from .report import Report
from .websocket import WebSocket


@dataclass
class Counts:
    """The counters behind resizing. ``slots - retire`` is the capacity the slots settle at."""

    target: int = 0
    """The capacity asked for."""
    slots: int = 0
    """Live slot tasks that have not claimed a retirement."""
    retire: int = 0
    """Retirements owed by surplus slots."""
    stopping: bool = False
    """Drain, shutdown or close started: no slot dials again."""

    def resize(self, target: int) -> int:
        """Sets the target; returns how many slots to spawn."""
        self.target = target
        live = self.slots - self.retire
        if target <= live:
            self.retire += live - target
            return 0
        cancelled = min(target - live, self.retire)
        self.retire -= cancelled
        spawn = target - live - cancelled
        self.slots += spawn
        return spawn

    def claim_retirement(self) -> bool:
        """Takes one owed retirement for the calling slot, if any."""
        if self.retire == 0:
            return False
        self.retire -= 1
        self.slots -= 1
        return True

    def slot_failed(self) -> None:
        """A slot gave up for good; it settles an owed retirement when there is one."""
        self.retire = max(self.retire - 1, 0)
        self.slots -= 1


class Shared:
    """Counts plus what the application observes (registered sessions, last error), with a
    change notification for waiters."""

    def __init__(self, report: Report | None = None) -> None:
        self.counts = Counts()
        self.report = report if report is not None else Report("(unknown)")
        self.registered = 0
        self.last_error: SluiceError | None = None
        #: The error that stopped a slot for good, until a resize restarts slots.
        self.failed: SluiceError | None = None
        #: The ``410`` of an operator's drain, until a registration succeeds or a resize: the
        #: slots wait, and one of them probes at ``next_probe`` (loop time).
        self.held: SluiceError | None = None
        self.next_probe = 0.0
        #: Bumped when a resize ends a hold: a ``410`` to a dial begun before that is stale.
        self.unheld = 0
        self._changed = asyncio.get_running_loop().create_future()
        #: Per registered session: retires it now if it is idle (claiming a retirement).
        self._retire_if_idle: set[Callable[[], bool]] = set()
        #: Per registered HTTP/2 session: its graceful close (``GOAWAY``), for the drain's end.
        self._leave: set[Callable[[], None]] = set()
        #: WebSockets that consumed a session, each running in a task of its own.
        self.upgraded: dict[asyncio.Task[None], WebSocket] = {}

    def adopt(self, websocket: WebSocket) -> None:
        """Runs an accepted WebSocket in a task of its own until it ends."""
        task = asyncio.ensure_future(websocket.run())
        self.upgraded[task] = websocket
        task.add_done_callback(lambda t: self.upgraded.pop(t, None))

    def retire_idle(self) -> None:
        """Closes idle sessions while retirements are owed; busy ones retire on their
        response (``Connection: close``)."""
        for retire in list(self._retire_if_idle):
            if self.counts.retire == 0:
                return
            retire()

    def _notify(self) -> None:
        self._changed.set_result(None)
        self._changed = asyncio.get_running_loop().create_future()

    def notify(self) -> None:
        """Wakes every waiter: something they wait on may have changed."""
        self._notify()

    async def changed(self, timeout: float | None = None) -> bool:
        """Waits for the next change; ``False`` if ``timeout`` seconds passed first."""
        done, _ = await asyncio.wait({asyncio.shield(self._changed)}, timeout=timeout)
        return bool(done)

    async def pause(self, seconds: float) -> bool:
        """Sleeps ``seconds`` for a slot; ``True`` early if the slot should end meanwhile
        (claiming an owed retirement, as ``should_end`` does)."""
        deadline = asyncio.get_running_loop().time() + seconds
        while True:
            if self.should_end():
                return True
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or not await self.changed(timeout=left):
                return False

    async def wait_until(self, ready: Callable[[], bool]) -> None:
        """Returns once ``ready()`` holds; re-checked after every change."""
        while not ready():
            await self.changed()

    def resize(self, target: int) -> int:
        """Sets the target unless stopping; returns how many slots to spawn."""
        if self.counts.stopping:
            return 0
        old = self.counts.target
        spawn = self.counts.resize(target)
        self.report.capacity(old, target)
        if spawn:
            self.failed = None
        if self.held is not None:
            self.held = None  # "setting the capacity again dials at once"
            self.unheld += 1
            self.report.unheld()
        self._notify()
        return spawn

    def stop(self) -> None:
        """No slot dials again."""
        self.counts.stopping = True
        self._notify()

    def should_end(self) -> bool:
        """Whether a slot should end instead of dialing: stopping, or a retirement is owed."""
        return self.counts.stopping or self.claim_retirement()

    def claim_retirement(self) -> bool:
        """Claims one owed retirement for the calling slot."""
        claimed = self.counts.claim_retirement()
        if claimed:
            self._notify()
        return claimed

    def record(self, error: SluiceError) -> None:
        """Remembers the most recent error."""
        self.last_error = error
        self._notify()

    def slot_failed(self, error: SluiceError) -> None:
        """A slot was refused for good (one line for the instance, not one per slot)."""
        if self.failed is None:
            self.report.refused(error)
        self.failed = error
        self.counts.slot_failed()
        self.record(error)

    def dial_failed(self, error: SluiceError, epoch: int) -> None:
        """A dial begun at the report's ``epoch`` failed and will be retried."""
        self.report.dial_failed(error, epoch)
        self.record(error)

    def hold(self, error: SluiceError, probe_every: float) -> None:
        """The instance is drained (``410``): the slots wait, and the first probe dials
        ``probe_every`` seconds from now. Silent while already held (a probe's ``410``)."""
        if self.held is None:
            self.held = error
            self.next_probe = asyncio.get_running_loop().time() + probe_every
            self.report.held(error, probe_every)
        self.record(error)

    def claim_probe(self, probe_every: float) -> bool:
        """Whether the calling slot dials the probe now; the next is ``probe_every`` later."""
        now = asyncio.get_running_loop().time()
        if now < self.next_probe:
            return False
        self.next_probe = now + probe_every
        return True

    def leave(self) -> None:
        """The drain was answered: every HTTP/2 session sends ``GOAWAY`` and closes once its
        in-flight streams finish (HTTP/1.1 ones wait for the proxy to close them)."""
        for leave in list(self._leave):
            leave()

    @contextmanager
    def session_registered(self, retire_if_idle: Callable[[], bool],
                           leave: Callable[[], None] | None = None) -> Iterator[None]:
        """Counts one session as registered for the duration of the block; a shrink may
        retire it through ``retire_if_idle`` meanwhile, and the drain's end calls ``leave``
        (an HTTP/2 session's ``GOAWAY``)."""
        self.registered += 1
        self.held = None  # a probe came through: the instance was resumed
        self.report.registered()
        self._retire_if_idle.add(retire_if_idle)
        if leave is not None:
            self._leave.add(leave)
        self._notify()
        try:
            yield
        finally:
            if leave is not None:
                self._leave.discard(leave)
            self._retire_if_idle.discard(retire_if_idle)
            self.registered -= 1
            self._notify()
