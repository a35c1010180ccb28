"""Many nodes, one capacity (protocol/README.md "Many nodes"), against fake nodes that behave as
the real one does (fakenodes.py): the split follows demand by RETIRE at the node with surplus,
a node that dies, drains, leaves the name or holds the instance drained is vacated, and the
sessions open across the nodes never number more than the capacity."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest

import sluice_sdk
from fakenodes import FakeNode, Tally
from fakes import run
from sluice_sdk import Backoff, Options, Refused, Sessions, control, fleet

GRACE = 0.3


class Counting:
    """An application that counts its own concurrency; ``gate`` holds requests while clear.
    Each change is one for ``tally`` too (its waiters check again)."""

    def __init__(self, tally: Tally | None = None) -> None:
        self.tally = tally
        self.now = 0
        self.max = 0
        self.served = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.now += 1
        self.max = max(self.max, self.now)
        if self.tally is not None:
            self.tally.note()
        try:
            await self.gate.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            self.served += 1
        finally:
            self.now -= 1


def opts(acceptor: str | list[str], **kw: Any) -> Options:
    kw.setdefault("backoff", Backoff(initial=0.01, max=0.05))
    kw.setdefault("node_grace", GRACE)
    kw.setdefault("capacity", 4)
    return Options(acceptor=acceptor, service="api", instance="api-1", token="s3cret", **kw)


async def nodes(n: int) -> tuple[Tally, list[FakeNode]]:
    tally = Tally()
    started = [FakeNode(tally) for _ in range(n)]
    for node in started:
        await node.start()
    return tally, started


def held(*nodes: FakeNode) -> list[int]:
    return [len(n.open) for n in nodes]


def by_address(sessions: Sessions) -> dict[str, Any]:
    return {n.address: n for n in sessions.nodes}


def test_sessions_follow_demand_by_a_retire_at_the_other_node() -> None:
    async def main() -> None:
        tally, (a, b) = await nodes(2)
        app = Counting(tally)
        sessions = await sluice_sdk.serve(app, opts([a.addr, b.addr]), lifespan="off")
        await tally.until(lambda: held(a, b) == [2, 2])  # no demand anywhere: an even split
        assert [link.headers["sluice-capacity"] for link in (a.links[0], b.links[0])] == ["4", "4"]
        assert a.capacities[:1] == b.capacities[:1] == [4]  # CAPACITY after the 101
        assert a.retires == b.retires == []  # the first split covered both: nothing moved

        app.gate.clear()
        clients = [asyncio.ensure_future(a.request(f"/{i}")) for i in range(8)]
        # A reports 2 in flight and 6 queued: its share grows to 3 (at least one stays at B).
        await tally.until(lambda: held(a, b) == [3, 1] and app.now == 3)
        assert b.retires == [1] and a.retires == []
        assert b.closed_by_service == 0, "a live node's session was closed by the service"
        status = by_address(sessions)
        assert (status[a.addr].target, status[b.addr].target) == (3, 1)
        assert status[a.addr].demand > status[b.addr].demand == 0.0

        app.gate.set()
        answers = await asyncio.gather(*clients)
        assert [r.status for r in answers] == [200] * 8
        assert tally.max_open <= 4 and app.max <= 4
        sessions.close()

    run(main())


def test_nodes_that_ask_another_instance_for_the_floor_give_up_theirs_to_demand() -> None:
    async def main() -> None:
        tally = Tally()
        a, b, c = (FakeNode(tally) for _ in range(3))
        for node, floor in ((a, 1), (b, 0), (c, 0)):
            node.floor = floor
            await node.start()
        app = Counting(tally)
        sessions = await sluice_sdk.serve(app, opts([a.addr, b.addr, c.addr]), lifespan="off")
        # No demand anywhere: the rest beyond A's floor is shared evenly, B and C included.
        await tally.until(lambda: held(a, b, c) == [2, 1, 1])
        splits = {link.headers.get("sluice-split") for n in (a, b, c) for link in n.links}
        assert splits == {"service"}

        app.gate.clear()
        clients = [asyncio.ensure_future(a.request(f"/{i}")) for i in range(8)]
        # Demand at A alone: B and C keep no floor of this instance, so all four go to A
        # (with FLOOR 1 everywhere, or an older node that says none, B and C would keep one).
        await tally.until(lambda: held(a, b, c) == [4, 0, 0] and app.now == 4)
        assert b.retires == c.retires == [1]
        app.gate.set()
        assert [r.status for r in await asyncio.gather(*clients)] == [200] * 8
        assert tally.max_open <= 4
        sessions.close()

    run(main())


def test_a_node_that_dies_moves_its_share_and_logs_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")

    async def main() -> None:
        tally, (a, b) = await nodes(2)
        sessions = await sluice_sdk.serve(Counting(), opts(f"{a.addr},{b.addr}"), lifespan="off")
        await tally.until(lambda: held(a, b) == [2, 2])
        a.kill()
        await tally.until(lambda: held(a, b) == [0, 4])
        status = by_address(sessions)
        assert (status[a.addr].live, status[a.addr].state, status[a.addr].target) == (False, "down", 0)
        # It comes back: with no demand anywhere it gets its floor of one, and nothing else
        # moves (protocol/README.md, "quiet").
        await a.start(a.port)
        await tally.until(lambda: held(a, b) == [1, 3])
        assert tally.max_open <= 4
        sessions.close()

    run(main())
    # The SDK's own (asyncio on 3.11 may log a cancelled fake-node task at the loop's end).
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("sluice_sdk")]
    assert len(warnings) == 1 and "is down" in warnings[0], warnings
    assert len([r for r in caplog.records if "is back after" in r.getMessage()]) == 1


def test_a_draining_node_closes_its_sessions_itself_and_each_one_moves() -> None:
    """Issue 46: the service closes nothing at a node that said ``DRAINING`` (closing them
    answered the node's queued requests 503); each session the node closes is dialed at the
    others, and the draining node gets no new one."""
    async def main() -> None:
        tally, (a, b) = await nodes(2)
        sessions = await sluice_sdk.serve(Counting(), opts([a.addr, b.addr]), lifespan="off")
        await tally.until(lambda: held(a, b) == [2, 2])
        a.say_draining()  # and nothing else yet
        await sessions._shared.wait_until(lambda: by_address(sessions)[a.addr].state == "draining")
        answer = await a.request("/")  # a request the node had queued
        assert (answer.status, answer.closes) == (200, False)
        assert held(a, b) == [2, 2] and a.closed_by_service == 0
        a.close_idle(1)
        await tally.until(lambda: held(a, b) == [1, 3])
        a.close_idle(1)
        await tally.until(lambda: held(a, b) == [0, 4])
        assert a.closed_by_service == 0 and a.registrations == 2 and a.retires == []
        assert tally.max_open <= 4
        sessions.close()

    run(main())


def test_busy_sessions_of_a_draining_node_serve_on_until_the_node_closes_them() -> None:
    async def main() -> None:
        tally, (a, b) = await nodes(2)
        app = Counting(tally)
        sessions = await sluice_sdk.serve(app, opts([a.addr, b.addr]), lifespan="off")
        await tally.until(lambda: held(a, b) == [2, 2])
        app.gate.clear()
        busy = asyncio.ensure_future(a.request("/slow"))
        await tally.until(lambda: app.now == 1)
        a.say_draining()
        await sessions._shared.wait_until(lambda: by_address(sessions)[a.addr].state == "draining")
        app.gate.set()
        answer = await busy
        assert (answer.status, answer.closes) == (200, False)  # the node may hand it on
        assert (await a.request("/")).status == 200
        a.close_idle(2)
        await tally.until(lambda: held(a, b) == [0, 4])
        assert a.closed_by_service == 0 and tally.max_open <= 4
        sessions.close()

    run(main())


def test_dns_names_are_resolved_again_nodes_join_and_leave() -> None:
    async def main() -> None:
        tally, (a, b) = await nodes(2)
        records = {"nodes.test": [("127.0.0.1", a.port)]}
        asked: list[tuple[str, int]] = []

        async def resolver(name: str, port: int) -> list[tuple[str, int]]:
            asked.append((name, port))
            return list(records[name])

        sessions = await sluice_sdk.serve(Counting(), opts(
            "dns:nodes.test:7070", resolver=resolver, resolve_interval=0.05), lifespan="off")
        await tally.until(lambda: held(a, b) == [4, 0])
        assert asked[0] == ("nodes.test", 7070)

        # b joins: with no demand anywhere it gets its floor of one, by RETIRE at a.
        records["nodes.test"].append(("127.0.0.1", b.port))
        await tally.until(lambda: held(a, b) == [3, 1])
        assert a.retires == [1] and a.closed_by_service == 0

        del records["nodes.test"][0]  # a leaves: it retires everything, then its link closes
        await tally.until(lambda: held(a, b) == [0, 4] and not a.live_links())
        assert a.retires == [1, 3] and a.closed_by_service == 0
        assert [n.address for n in sessions.nodes] == [b.addr]
        assert tally.max_open <= 4
        sessions.close()

    run(main())


def test_a_lost_node_makes_the_name_resolve_again_soon() -> None:
    """Issue 46: a node restarted under a new address (a Kubernetes pod) was found only at the
    next ``resolve_interval``. Losing a node is a change suspected: the name is resolved again
    within seconds (``RESOLVE_SOON``), however long the interval."""

    async def main() -> None:
        tally, (a, b) = await nodes(2)
        records = {"nodes.test": [("127.0.0.1", a.port)]}

        async def resolver(name: str, port: int) -> list[tuple[str, int]]:
            return list(records[name])

        sessions = await sluice_sdk.serve(Counting(), opts(
            "dns:nodes.test:7070", resolver=resolver, resolve_interval=600.0), lifespan="off")
        await tally.until(lambda: held(a, b) == [4, 0])
        records["nodes.test"] = [("127.0.0.1", b.port)]  # a's replacement, at a new address
        a.kill()
        await tally.until(lambda: held(a, b) == [0, 4])
        assert [n.address for n in sessions.nodes] == [b.addr]
        assert tally.max_open <= 4
        sessions.close()

    run(main())


def test_a_name_that_stops_resolving_keeps_its_nodes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")

    async def main() -> None:
        tally, (a,) = await nodes(1)
        failing = asyncio.Event()

        async def resolver(name: str, port: int) -> list[tuple[str, int]]:
            if failing.is_set():
                raise OSError("no DNS today")
            return [("127.0.0.1", a.port)]

        sessions = await sluice_sdk.serve(Counting(), opts(
            "dns:nodes.test:7070", resolver=resolver, resolve_interval=0.02), lifespan="off")
        await tally.until(lambda: held(a) == [4])
        failing.set()
        while not any("cannot resolve" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # several failed resolutions: still one line, nodes kept
        assert held(a) == [4] and [n.state for n in sessions.nodes] == ["live"]
        sessions.close()

    run(main())
    assert len([r for r in caplog.records if "cannot resolve" in r.getMessage()]) == 1


def certificate(tmp_path: Path, name: str) -> ssl.SSLContext:
    """A server context whose certificate names ``name`` only (no IP address)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
         "-addext", f"subjectAltName=DNS:{name}"], check=True, capture_output=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


@pytest.mark.parametrize("server_hostname", [None, "override.test"])
def test_tls_names_each_node_by_the_name_it_was_found_by(
        tmp_path: Path, server_hostname: str | None) -> None:
    name = server_hostname or "nodes.test"
    server = certificate(tmp_path, name)
    client = ssl.create_default_context(cafile=str(tmp_path / f"{name}.pem"))

    async def main() -> None:
        tally = Tally()
        a, b = FakeNode(tally), FakeNode(tally)
        await a.start(ssl=server)
        await b.start(ssl=server)

        async def resolver(host: str, port: int) -> list[tuple[str, int]]:
            return [("127.0.0.1", a.port), ("127.0.0.1", b.port)]

        # The certificate names no IP address: only the name (or the option) verifies.
        sessions = await sluice_sdk.serve(Counting(), opts(
            "dns:nodes.test:7070", resolver=resolver, ssl=client,
            server_hostname=server_hostname), lifespan="off")
        await tally.until(lambda: held(a, b) == [2, 2])
        assert (await a.request("/tls")).status == 200
        sessions.close()

    run(main())


def test_an_acceptor_without_control_links_counts_live_with_demand_one() -> None:
    async def main() -> None:
        tally, (old, new) = await nodes(2)
        old.link_status = 400
        sessions = await sluice_sdk.serve(Counting(), opts([old.addr, new.addr]), lifespan="off")
        # Demand 1 against 0: the old node gets the larger share, the new one its base of 1.
        await tally.until(lambda: held(old, new) == [3, 1])
        status = by_address(sessions)
        assert (status[old.addr].live, status[old.addr].demand) == (True, None)
        attempts = old.link_attempts
        await tally.until(lambda: old.link_attempts > attempts)  # retried (backoff.max here)
        # Demand moves to the new node: the old one cannot hear RETIRE, so the service closes
        # its surplus itself.
        new.links[0].quiet = True
        for _ in range(3):
            new.links[0].demand(0, 30)
        await tally.until(lambda: held(old, new) == [1, 3])
        assert old.closed_by_service >= 2 and old.retires == [] and tally.max_open <= 4
        sessions.close()

    run(main())


def test_a_silent_link_is_dialed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "SILENCE", 0.2)

    async def main() -> None:
        tally, (a, b) = await nodes(2)
        sessions = await sluice_sdk.serve(Counting(), opts([a.addr, b.addr]), lifespan="off")
        await tally.until(lambda: held(a, b) == [2, 2])
        a.links[0].quiet = True  # no heartbeat: the service gives the link up and dials again
        await a.wait_link(2)
        await tally.until(lambda: a.links[0].closed.is_set())
        assert held(a, b) == [2, 2]  # within node_grace nothing else changed
        sessions.close()

    run(main())


def test_a_node_holding_the_instance_drained_is_left_until_resumed() -> None:
    async def main() -> None:
        tally, (a, b) = await nodes(2)
        sessions = await sluice_sdk.serve(Counting(), opts(
            [a.addr, b.addr], drained_probe=0.1), lifespan="off")
        await tally.until(lambda: held(a, b) == [2, 2])
        # An operator drains the instance at a: its sessions close, and it answers 410.
        a.register_status = a.link_status = 410
        for s in list(a.idle):
            a._close(s)
        await tally.until(lambda: held(a, b) == [0, 4])
        assert by_address(sessions)[a.addr].state == "held"
        assert isinstance(sessions.last_error, Refused) and sessions.last_error.status == 410
        # Resumed: the next probe finds out, and a gets its floor (no demand anywhere).
        a.register_status = a.link_status = 101
        await tally.until(lambda: held(a, b) == [1, 3])
        assert tally.max_open <= 4
        sessions.close()

    run(main())


def test_links_refused_everywhere_make_wait_registered_raise() -> None:
    async def main() -> None:
        _, (a, b) = await nodes(2)
        a.link_status = b.link_status = 401
        sessions = await sluice_sdk.serve(Counting(), opts([a.addr, b.addr]), lifespan="off")
        with pytest.raises(Refused) as err:
            await sessions.wait_registered()
        assert err.value.status == 401 and a.registrations == b.registrations == 0
        sessions.close()

    run(main())


def test_capacity_changes_are_retired_by_the_nodes_and_never_overshoot() -> None:
    async def main() -> None:
        tally, (a, b) = await nodes(2)
        sessions = await sluice_sdk.serve(Counting(), opts([a.addr, b.addr], capacity=6),
                                          lifespan="off")
        await tally.until(lambda: held(a, b) == [3, 3])
        await sessions.wait_registered(6)  # (RETIRE is for sessions the service knows are up)
        registrations = a.registrations + b.registrations
        sessions.set_capacity(2)
        await tally.until(lambda: held(a, b) == [1, 1])
        assert a.retires[-1] == b.retires[-1] == 2
        assert a.closed_by_service == b.closed_by_service == 0
        assert a.registrations + b.registrations == registrations  # nothing dialed meanwhile
        assert a.capacities[-1] == b.capacities[-1] == 2
        tally.max_open = 0
        sessions.set_capacity(5)
        await tally.until(lambda: sum(held(a, b)) == 5)
        assert tally.max_open == 5 and sessions.capacity == 5
        sessions.close()

    run(main())


def test_shutdown_drains_every_node_holding_sessions() -> None:
    async def main() -> None:
        tally, (a, b, c) = await nodes(3)
        sessions = await sluice_sdk.serve(Counting(), opts([a.addr, b.addr, c.addr], capacity=2),
                                          lifespan="off")
        await sessions.wait_registered()
        holding = [n for n in (a, b, c) if n.open]
        assert len(holding) == 2  # fewer sessions than nodes: by demand, all even here
        await sessions.shutdown(timeout=5)
        assert [len(n.drains) for n in holding] == [1, 1] and sum(held(a, b, c)) == 0
        await tally.until(lambda: all(not n.live_links() for n in (a, b, c)))

    run(main())


def test_the_sum_guarantee_holds_through_skew_flips_deaths_and_drains() -> None:
    """Load moves between three nodes, one dies and comes back, one drains and another joins
    its place; at every registration and close, the sessions open everywhere are at most N."""

    async def main() -> None:
        tally, (a, b, c) = await nodes(3)
        app = Counting(tally)
        capacity = 5
        sessions = await sluice_sdk.serve(app, opts([a.addr, b.addr, c.addr], capacity=capacity),
                                          lifespan="off")
        await sessions.wait_registered()

        async def load(node: FakeNode, n: int) -> list[int]:
            app.gate.clear()
            clients = [asyncio.ensure_future(node.request()) for _ in range(n)]
            await tally.until(lambda: len(node.open) >= 3)  # the share followed the queue
            app.gate.set()
            return [r.status for r in await asyncio.gather(*clients)]

        assert await load(a, 12) == [200] * 12
        assert await load(c, 12) == [200] * 12  # the flip
        b.kill()
        await tally.until(lambda: by_address(sessions)[b.addr].state == "down")
        await b.start(b.port)
        assert await load(b, 12) == [200] * 12
        c.stop()  # as the real node stops: DRAINING, idle sessions closed
        await tally.until(lambda: len(c.open) == 0 and sum(held(a, b)) == capacity)
        assert tally.max_open <= capacity and app.max <= capacity
        sessions.close()

    run(main(), limit=20)


def test_rebalances_log_at_most_one_line_a_second(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")
    monkeypatch.setattr(fleet, "REBALANCE_LOG_EVERY", 3600.0)  # no second line on its own
    monkeypatch.setattr(fleet, "MOVE_HOLD", 0.0)  # rebalances back to back (fleet.json holds them)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "rebalance" in r.getMessage()]

    async def main() -> None:
        tally = Tally()
        a, b = FakeNode(tally, auto_demand=False), FakeNode(tally, auto_demand=False)
        await a.start()
        await b.start()
        sessions = await sluice_sdk.serve(Counting(), opts([a.addr, b.addr]), lifespan="off")
        la, lb = await a.wait_link(), await b.wait_link()
        la.demand(0, 0)
        lb.demand(0, 0)
        await tally.until(lambda: held(a, b) == [2, 2])
        la.demand(0, 40)
        await tally.until(lambda: held(a, b) == [3, 1])
        lb.demand(0, 400)
        await tally.until(lambda: held(a, b) == [1, 3])
        assert len(lines()) == 1  # three rebalances (at least) so far, one line
        assert sessions._fleet is not None
        sessions._fleet._log._flush(sessions._fleet)  # what the timer does a second later
        [_, gathered] = lines()
        # From what the first line said to now, with the demands.
        assert re.search(f"{a.addr} [0-9]->1 ", gathered), gathered
        assert re.search(f"{b.addr} [0-9]->3 ", gathered), gathered
        assert "demand 20.0" in gathered and "demand 200.0" in gathered, gathered
        sessions.close()

    run(main())
