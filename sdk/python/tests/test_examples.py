"""The examples run (hello and FastAPI through the SDK's runner): they register, answer, and
drain on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from fakes import FakeAcceptor, run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


RUNNER = [sys.executable, "-m", "sluice_sdk", "--app-dir", str(EXAMPLES)]
COMMANDS = {
    "hello.py": RUNNER + ["hello:app", "--capacity", "2"],
    "fastapi_app.py": RUNNER + ["fastapi_app:app", "--capacity", "2"],
    "workerpool.py": [sys.executable, str(EXAMPLES / "workerpool.py"), "--workers", "2"],
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
