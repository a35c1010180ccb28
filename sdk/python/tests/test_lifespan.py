"""The ASGI lifespan protocol on sessions: startup before the first dial, its state in every
request, shutdown after the drain; a failed startup stops the service, an app without lifespan
support runs as before."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import sluice_sdk
from apps import hello
from fakes import FakeAcceptor, run
from sluice_sdk import Backoff, LifespanError, Options


def opts(acceptor: str) -> Options:
    return Options(acceptor=acceptor, service="api", instance="api-1",
                   backoff=Backoff(initial=0.01, max=0.05))


class LifespanApp:
    """Records what the acceptor had seen at each lifespan step; requests answer the state."""

    def __init__(self, acc: FakeAcceptor, fail: str = "") -> None:
        self.acc = acc
        self.fail = fail
        self.steps: list[tuple[str, int, int]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"].removeprefix("lifespan.")
                self.steps.append((kind, self.acc.attempts, len(self.acc.drains)))
                scope["state"]["db"] = "connected"
                answer = "failed" if kind == self.fail else "complete"
                await send({"type": f"lifespan.{kind}.{answer}", "message": "no database"})
                if kind == "shutdown":
                    return
        body = scope["state"]["db"].encode()
        scope["state"]["db"] = "changed by a request"  # a copy: the next request sees none of it
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def test_startup_runs_before_the_first_dial_and_shutdown_after_the_drain() -> None:
    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        app = LifespanApp(acc)
        sessions = await sluice_sdk.serve(app, opts(await acc.start_tcp()))
        assert app.steps == [("startup", 0, 0)]  # nothing dialed before the startup completed
        s = await acc.session()
        assert (await s.request()).body == b"connected"
        assert (await s.request()).body == b"connected"
        await sessions.shutdown()
        # The shutdown came after the drain request, once every session was closed.
        assert app.steps == [("startup", 0, 0), ("shutdown", 1, 1)]

    run(main())


def test_a_failed_startup_raises_and_dials_nothing() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        app = LifespanApp(acc, fail="startup")
        with pytest.raises(LifespanError, match="lifespan startup failed: no database"):
            await sluice_sdk.serve(app, opts(await acc.start_tcp()))
        assert acc.attempts == 0

    run(main())


def test_a_failed_shutdown_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        sessions = await sluice_sdk.serve(LifespanApp(acc, fail="shutdown"), opts(await acc.start_tcp()))
        await acc.session()
        await sessions.shutdown()

    run(main())
    assert "lifespan shutdown failed: no database" in caplog.text


def test_an_app_without_lifespan_support_runs_as_before(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")

    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        # hello answers every scope with an HTTP response: it raises on the lifespan scope.
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp()))
        assert (await (await acc.session()).request("GET", "/x")).body == b"hello GET /x?\n"
        await sessions.shutdown()

        with pytest.raises(LifespanError, match="does not support the ASGI lifespan"):
            await sluice_sdk.serve(hello, opts(await acc.start_tcp()), lifespan="on")

    run(main())
    assert "does not support the ASGI lifespan protocol" in caplog.text


def test_lifespan_off_sends_no_lifespan_scope() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        app = LifespanApp(acc)
        sessions = await sluice_sdk.serve(app, opts(await acc.start_tcp()), lifespan="off")
        await acc.session()
        sessions.close()
        assert app.steps == []

    run(main())
