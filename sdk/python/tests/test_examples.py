"""The examples run (hello and FastAPI through the SDK's runner): they register, answer, and
drain on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from fakenodes import FakeNode, Tally
from fakes import FakeAcceptor, run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


RUNNER = [sys.executable, "-m", "sluice_sdk", "--app-dir", str(EXAMPLES)]
COMMANDS = {
    "hello.py": RUNNER + ["hello:app", "--capacity", "2"],
    "fastapi_app.py": RUNNER + ["fastapi_app:app", "--capacity", "2"],
    "workerpool.py": [sys.executable, str(EXAMPLES / "workerpool.py"), "--workers", "2"],
    "multinode.py": [sys.executable, str(EXAMPLES / "multinode.py"), "--capacity", "2"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_example_serves_and_drains(name: str) -> None:
    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        addr = await acc.start_tcp()
        proc = await asyncio.create_subprocess_exec(
            *COMMANDS[name], "--acceptor", addr, "--service", "ex")
        a, b = await acc.session(), await acc.session()
        response = await a.request("POST", "/", body=b"data")
        assert response.status == 200
        if name == "fastapi_app.py":  # the lifespan's state reached the request
            assert b'"greeting":"hello","visits":1' in response.body
            ws = await b.websocket("/echo")
            await ws.send("echo")
            assert await ws.receive() == "echo"
            await acc.session()  # the WebSocket consumed b, which was replaced
        else:
            assert response.body.endswith(b"\n")
        if name == "workerpool.py":
            proc.send_signal(signal.SIGUSR1)
            c = await acc.session()  # a third worker, a third session
            assert c.headers["sluice-capacity"] == "3"
            c.close()
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0

    run(main(), limit=30)


def test_the_multinode_example_counts_its_concurrency_across_nodes() -> None:
    async def main() -> None:
        tally = Tally()
        a, b = FakeNode(tally), FakeNode(tally)
        acceptor = f"{await a.start()},{await b.start()}"
        proc = await asyncio.create_subprocess_exec(
            *COMMANDS["multinode.py"], "--acceptor", acceptor, "--capacity", "4", "--delay", "0.2",
            stdout=asyncio.subprocess.PIPE)
        await tally.until(lambda: [len(a.open), len(b.open)] == [2, 2])
        answers = await asyncio.gather(*(n.request("/work") for n in (a, a, b, b)))
        assert [r.status for r in answers] == [200] * 4
        report = json.loads((await a.request("/.multinode/max")).body)
        assert (report["max_in_flight"], report["served"], report["capacity"]) == (4, 4, 4)
        assert sorted(n["address"] for n in report["nodes"]) == sorted([a.addr, b.addr])
        proc.send_signal(signal.SIGTERM)
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        assert out.decode().splitlines()[-1] == "max_in_flight 4"

    run(main(), limit=30)
