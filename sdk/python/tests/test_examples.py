"""The examples run: they register, answer, and drain on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from fakes import FakeAcceptor, run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name,flag", [("hello.py", "--capacity"), ("workerpool.py", "--workers")])
def test_example_serves_and_drains(name: str, flag: str) -> None:
    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        addr = await acc.start_tcp()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(EXAMPLES / name), "--acceptor", addr, "--service", "ex", flag, "2")
        a, _ = await acc.session(), await acc.session()
        response = await a.request("POST", "/", body=b"data")
        assert response.status == 200 and response.body.endswith(b"\n")
        if name == "workerpool.py":
            proc.send_signal(signal.SIGUSR1)
            c = await acc.session()  # a third worker, a third session
            assert c.headers["sluice-capacity"] == "3"
            c.close()
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0

    run(main(), limit=30)
