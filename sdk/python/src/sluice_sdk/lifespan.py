"""The ASGI lifespan protocol, as uvicorn's ``lifespan="auto"`` runs it: the application's
startup before the first session is registered, its shutdown after the drain.

An application that raises on the ``lifespan`` scope before completing its startup does not
support the protocol and runs without it (with ``"on"`` that is an error); one that answers
``lifespan.startup.failed`` cannot start. The ``state`` dict of the lifespan scope is copied
into the scope of every request, where Starlette's ``request.state`` finds it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .errors import LifespanError
from .server import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("sluice_sdk")

MODES = ("auto", "on", "off")


class Lifespan:
    """Runs ``app``'s lifespan in a task of its own. ``mode`` is ``"auto"`` (the default: run
    it if the application supports it), ``"on"`` (it must) or ``"off"`` (never send it)."""

    def __init__(self, app: ASGIApp, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"lifespan must be one of {', '.join(MODES)}, not {mode!r}")
        self._app = app
        self.mode = mode
        #: The lifespan scope's ``state``; each request's scope gets a shallow copy.
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._answer: asyncio.Future[Message] | None = None
        self._expected: tuple[str, ...] = ()
        self._error: Exception | None = None
        self._closed = False
        self.running = False
        """The startup completed and the shutdown has not begun."""

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The application, with the lifespan's ``state`` copied into each scope."""
        scope["state"] = dict(self.state)
        await self._app(scope, receive, send)

    async def startup(self) -> None:
        """Sends ``lifespan.startup`` and waits for the answer. Raises :class:`LifespanError`
        if the startup failed, or (with ``"on"``) if the application does not support it."""
        if self.mode == "off":
            return
        self._task = asyncio.ensure_future(self._main())
        answer = await self._ask("lifespan.startup")
        if answer is None:
            if self.mode == "on":
                raise LifespanError(
                    "the application does not support the ASGI lifespan protocol (lifespan is "
                    "\"on\"): it ended without answering lifespan.startup"
                ) from self._error
            return
        if answer["type"] == "lifespan.startup.failed":
            raise LifespanError(f"the application's lifespan startup failed: {_said(answer)}")
        self.running = True
        log.debug("lifespan startup complete")

    async def shutdown(self) -> None:
        """Sends ``lifespan.shutdown`` if the startup completed, and waits for the answer; a
        failure is logged (the service is leaving either way)."""
        if not self.running:
            self.close()
            return
        self.running = False
        answer = await self._ask("lifespan.shutdown")
        if answer is None:
            log.error("the application's lifespan ended without answering lifespan.shutdown")
        elif answer["type"] == "lifespan.shutdown.failed":
            log.error("the application's lifespan shutdown failed: %s", _said(answer))
        else:
            log.debug("lifespan shutdown complete")
        self.close()

    def close(self) -> None:
        """Stops the lifespan task at once, without a shutdown."""
        self.running = False
        self._closed = True
        if self._task is not None:
            self._task.cancel()

    async def _ask(self, kind: str) -> Message | None:
        """Sends ``kind``; its ``.complete`` or ``.failed`` answer, or ``None`` if the
        application's lifespan ended first."""
        assert self._task is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._expected = (f"{kind}.complete", f"{kind}.failed")
        await self._inbox.put({"type": kind})
        await asyncio.wait({self._answer, self._task}, return_when=asyncio.FIRST_COMPLETED)
        return self._answer.result() if self._answer.done() else None

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": self.state}
        try:
            await self._app(scope, self._inbox.get, self._send)
        except Exception as e:
            self._error = e
            if self._closed:
                log.debug("the application's lifespan ended at the close", exc_info=True)
            elif self.running or self.mode == "on":
                log.error("the application's lifespan failed", exc_info=True)
            else:
                # What uvicorn's "auto" does: an app without lifespan support runs without it.
                log.info("the application does not support the ASGI lifespan protocol (%s: %s); "
                         "running without it", type(e).__name__, e)

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if self._closed:
            return  # cancelled: Starlette, for one, reports it as a failed shutdown
        if self._answer is None or self._answer.done() or kind not in self._expected:
            raise RuntimeError(f"unexpected ASGI lifespan message {kind!r}")
        self._answer.set_result(message)


def _said(answer: Message) -> str:
    return str(answer.get("message") or "(no message given)")
