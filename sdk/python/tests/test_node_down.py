"""When a node of many is down (protocol/README.md "The control link"), against fake nodes on
real sockets: at once when its link closed and its address refuses connections (the process
is gone), after ``node_grace`` when it is only silent or slow (a hung process, a partition, a
hot restart's new process not up yet), and without a warning when it said ``DRAINING``
first. The instance's own close starts no grace at all."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import sluice_sdk
from fakenodes import FakeNode, Tally
from fakes import run
from sluice_sdk import Backoff, Options, Sessions, control

#: Longer than any test lasts: only a refusal can take a node down.
FOREVER = 3600.0


def opts(nodes: list[FakeNode], **kw: Any) -> Options:
    kw.setdefault("backoff", Backoff(initial=0.01, max=0.05))
    kw.setdefault("capacity", 4)
    return Options(acceptor=[n.addr for n in nodes], service="api", instance="api-1",
                   token="s3cret", **kw)


async def two_nodes() -> tuple[Tally, FakeNode, FakeNode]:
    tally = Tally()
    a, b = FakeNode(tally), FakeNode(tally)
    await a.start()
    await b.start()
    return tally, a, b


def held(*nodes: FakeNode) -> list[int]:
    return [len(n.open) for n in nodes]


def state(sessions: Sessions, node: FakeNode) -> Any:
    return next(n for n in sessions.nodes if n.address == node.addr)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    # The SDK's own: asyncio on Python 3.11 also logs an error when a fake node's connection
    # task is cancelled at the loop's end (its streams callback asks a cancelled task for its
    # exception), which says nothing about the SDK.
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("sluice_sdk")]


async def serve(nodes: list[FakeNode], **kw: Any) -> Sessions:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return await sluice_sdk.serve(app, opts(nodes, **kw), lifespan="off")


def test_a_node_that_refuses_connections_is_down_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")

    async def main() -> str:
        tally, a, b = await two_nodes()
        sessions = await serve([a, b], node_grace=FOREVER)
        await tally.until(lambda: held(a, b) == [2, 2])
        b.kill()  # SIGKILL: its sessions and link end, and nothing listens there any more
        await tally.until(lambda: held(a, b) == [4, 0])
        assert (state(sessions, b).live, state(sessions, b).state) == (False, "down")
        await b.start(b.port)  # it comes back: with no demand anywhere, its floor of one
        await tally.until(lambda: held(a, b) == [3, 1])
        assert tally.max_open <= 4
        sessions.close()
        return b.addr

    killed = run(main())
    [warning] = warnings(caplog)
    assert warning.startswith(f"node {killed} is down: its control link is refused"), warning
    assert len([r for r in caplog.records if "is back after" in r.getMessage()]) == 1


def test_a_hung_node_keeps_its_share_for_its_grace(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "SILENCE", 0.2)
    caplog.set_level(logging.INFO, "sluice_sdk")

    async def main() -> None:
        tally, a, b = await two_nodes()
        sessions = await serve([a, b], node_grace=FOREVER, handshake_timeout=0.2)
        await tally.until(lambda: held(a, b) == [2, 2])
        kept = set(b.open)
        b.stall = True  # wedged: it takes connections and answers none
        b.links[0].quiet = True  # and its link falls silent
        # Three link dials taken, the first two timed out: silence, not a refusal.
        await tally.until(lambda: len(b.stalled) >= 3)
        assert (state(sessions, b).live, state(sessions, b).state) == (True, "lost")
        assert b.open == kept and b.closed_by_service == 0 and held(a, b) == [2, 2]
        sessions.close()

    run(main())
    assert warnings(caplog) == []


def test_a_hung_node_is_down_after_its_grace(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")

    async def main() -> None:
        tally, a, b = await two_nodes()
        sessions = await serve([a, b], node_grace=0.3, handshake_timeout=0.1)
        await tally.until(lambda: held(a, b) == [2, 2])
        b.stall = True
        b.drop_links()  # the link ends and every dial after it hangs
        await tally.until(lambda: held(a, b) == [4, 0])
        assert state(sessions, b).state == "down" and b.closed_by_service == 2
        sessions.close()

    run(main())
    [warning] = warnings(caplog)
    assert "is down: no control link for 0.3s" in warning, warning


@pytest.mark.parametrize("how", ["refused", "hung"])
def test_a_node_that_said_draining_and_goes_away_is_no_warning(
        how: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")

    async def main() -> str:
        tally, a, b = await two_nodes()
        grace = FOREVER if how == "refused" else 0.3
        sessions = await serve([a, b], node_grace=grace, handshake_timeout=0.1)
        await tally.until(lambda: held(a, b) == [2, 2])
        b.stop()  # DRAINING, its idle sessions closed
        await tally.until(lambda: held(a, b) == [4, 0])
        if how == "refused":
            b.kill()
        else:
            b.stall = True
            b.drop_links()
        assert sessions._fleet is not None
        node = next(n for n in sessions._fleet.nodes if str(n) == b.addr)
        await sessions._shared.wait_until(lambda: node.down)
        assert (state(sessions, b).live, state(sessions, b).state) == (False, "draining")
        sessions.close()
        return b.addr

    drained = run(main())
    assert warnings(caplog) == []
    gone = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert len(gone) == 1 and gone[0].startswith(f"node {drained}, which said DRAINING"), gone


def test_closing_the_instance_starts_no_grace(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")

    async def main() -> None:
        tally, a, b = await two_nodes()
        sessions = await serve([a, b], node_grace=0.05)
        await tally.until(lambda: held(a, b) == [2, 2])
        fleet = sessions._fleet
        assert fleet is not None
        await sessions.aclose()  # every link task has ended (and said its link was lost)
        assert [(n.grace, n.down) for n in fleet.nodes] == [(None, False)] * 2

    run(main())
    assert warnings(caplog) == []
