"""Many nodes against the real proxy: three `sluice run` processes on 127.0.0.1, one instance
of capacity 6 dialing all of them. Its sessions follow the queue (the node with surplus gets
RETIRE), a node that stops is vacated and one killed is left once down, while the service
never serves more than 6 requests at once and every client request succeeds."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from harness import TOKEN, Binaries, Proc, Sluice, start_sluice

import sluice_sdk
from fakes import run
from sluice_sdk import Backoff, Options, Sessions

CAPACITY = 6


class Gated:
    """Counts its own concurrency; requests wait while ``gate`` is clear."""

    def __init__(self) -> None:
        self.now = self.max = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.now += 1
        self.max = max(self.max, self.now)
        try:
            await self.gate.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
        finally:
            self.now -= 1


async def get(addr: tuple[str, int], path: str = "/") -> int:
    """One request through a node's listener; its status (0: the connection failed)."""
    try:
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n".encode())
        status_line = await reader.readline()
        await reader.read()
        writer.close()
        return int(status_line.split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def retired_here(proc: Proc) -> int:
    """Sessions this node was asked to retire (its "service retires sessions here" lines)."""
    lines = [json.loads(line) for line in proc.lines if "service retires sessions here" in line]
    return sum(int(line["fields"]["asked"]) for line in lines)


async def until(sessions: Sessions, ready: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not ready():
        assert loop.time() < deadline, f"still {sessions.nodes}"
        await sessions._shared.changed(timeout=0.1)


def held(sessions: Sessions, nodes: list[Sluice]) -> list[int]:
    by_address = {n.address: n.held + n.retiring for n in sessions.nodes}
    return [by_address.get(n.acceptor, 0) for n in nodes]


def test_one_capacity_follows_demand_across_three_real_nodes(
        sluice_bin: Path, tmp_path: Path) -> None:
    bins = Binaries(sluice_bin, [], [], [])
    nodes: list[Sluice] = []
    for i in range(3):
        (tmp_path / f"n{i}").mkdir()
        nodes.append(start_sluice(bins, tmp_path / f"n{i}", name=f"node{i}"))
    first, second, third = nodes

    async def main() -> None:
        app = Gated()
        options = Options(acceptor=[n.acceptor for n in nodes], service="interop",
                          instance="py-many", token=TOKEN, capacity=CAPACITY, node_grace=1.0,
                          backoff=Backoff(initial=0.05, max=0.5))
        sessions = await sluice_sdk.serve(app, options, lifespan="off")
        await until(sessions, lambda: held(sessions, nodes) == [2, 2, 2]  # no demand: even
                    and sessions.registered == CAPACITY)
        # The first split covered every node: nothing was dialed to one and moved.
        assert [retired_here(n.proc) for n in nodes] == [0, 0, 0]

        # Clients queue at the third node: sessions move there, by RETIRE at the others.
        app.gate.clear()
        clients = [asyncio.ensure_future(get(third.http)) for _ in range(12)]
        await until(sessions, lambda: held(sessions, nodes) == [1, 1, 4]
                    and sessions.registered == CAPACITY)
        await until(sessions, lambda: retired_here(first.proc) + retired_here(second.proc) >= 2)
        app.gate.set()
        assert await asyncio.gather(*clients) == [200] * 12

        # The first node stops for good (DRAINING): its share moves to the others.
        first.proc.signal(signal.SIGTERM)
        await until(sessions, lambda: held(sessions, nodes)[0] == 0
                    and sum(held(sessions, nodes)) == CAPACITY)
        # The second dies: once it is down, the third holds everything.
        second.proc.popen.kill()
        await until(sessions, lambda: held(sessions, nodes) == [0, 0, CAPACITY]
                    and sessions.registered == CAPACITY)
        assert [await get(third.http) for _ in range(3)] == [200] * 3
        assert app.max <= CAPACITY
        sessions.close()

    try:
        run(main(), limit=60)
    finally:
        for node in nodes:
            node.proc.stop()
