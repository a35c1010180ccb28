"""A cancellation is never lost: before Python 3.12, ``asyncio.wait_for`` returns the result of
an awaitable that completed just as the waiting task was cancelled (gh-86296), so a slot whose
dial completed as ``close()`` cancelled it dialed on forever, and ``asyncio.run()`` never
returned. The SDK's waits raise the cancellation and let go of what came."""

from __future__ import annotations

import asyncio
import sys

import pytest

from fakes import run
from sluice_sdk import aio

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is 3.11+")


def test_a_cancellation_that_meets_a_result_is_raised_and_the_result_let_go() -> None:
    async def main() -> None:
        inner: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        discarded: list[str] = []
        waiting = asyncio.ensure_future(aio.wait_for(inner, 5, discard=discarded.append))
        await asyncio.sleep(0)  # waiting for `inner`
        inner.set_result("a connection")  # in the same turn of the loop as the cancellation
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert discarded == ["a connection"]

    run(main())


def test_results_and_timeouts_are_as_asyncio_gives_them() -> None:
    async def main() -> None:
        assert await aio.wait_for(asyncio.sleep(0, "done"), 5) == "done"
        with pytest.raises(asyncio.TimeoutError):
            await aio.wait_for(asyncio.sleep(5), 0.01)

    run(main())
