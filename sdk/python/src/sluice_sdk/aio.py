"""``wait_for`` that never loses a cancellation. Before Python 3.12, ``asyncio.wait_for``
returns the result of an awaitable that finished just as the waiting task was cancelled, and
the cancellation is gone (gh-86296): a loop around it (a session slot, a control link) then
runs on after ``Sessions.close()`` or ``asyncio.run()``'s teardown cancelled it, which never
ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout: float | None,
                   discard: Callable[[T], None] | None = None) -> T:
    """``asyncio.wait_for(aw, timeout)``; if the calling task was cancelled meanwhile and the
    result came anyway, ``discard(result)`` (e.g. closes a connection) and raise
    :class:`asyncio.CancelledError`."""
    before = _cancelling()
    result = await asyncio.wait_for(aw, timeout)
    if _cancelling() > before:
        if discard is not None:
            discard(result)
        raise asyncio.CancelledError
    return result


def _cancelling() -> int:
    """Cancellations requested of the current task and not yet handled (Python 3.11+; 0
    before, where nothing can be told)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) if cancelling is not None else 0
