"""The interop service's CLI contract, against the fake acceptor, in a real subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from fakes import FakeAcceptor, run
from test_transports import http_get

SCRIPT = Path(__file__).with_name("interop_service.py")


async def spawn(*args: str, token: str = "s3cret") -> asyncio.subprocess.Process:
    env = {**os.environ, "SLUICE_TOKEN": token}
    return await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await proc.stdout.readline()).decode().rstrip("\n")


def test_session_mode_registers_serves_and_drains() -> None:
    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        addr = await acc.start_tcp()
        proc = await spawn("--acceptor", addr, "--service", "api", "--instance", "i-7", "--capacity", "2", "--delay-ms", "1")
        assert await line(proc) == "registered 2"
        assert acc.registrations[0]["authorization"] == "Bearer s3cret"
        a, _ = await acc.session(), await acc.session()
        r = await a.request("POST", "/", [("x-request-id", "r1")], b"x" * 1000)
        assert (r.status, r.body, r.headers["content-type"]) == (200, b"i-7\n", "text/plain")
        assert await line(proc) == "start r1"
        proc.send_signal(signal.SIGTERM)
        assert await line(proc) == "drained"
        assert acc.drains[0]["sluice-instance"] == "i-7"
        assert await proc.wait() == 0

    run(main(), limit=30)


def test_session_mode_exits_non_zero_on_401() -> None:
    async def main() -> None:
        acc = FakeAcceptor(answers=[401])
        proc = await spawn("--acceptor", await acc.start_tcp(), "--service", "api", "--instance", "i", "--capacity", "1", token="")
        _, err = await proc.communicate()
        assert proc.returncode == 1 and b"401" in err

    run(main(), limit=30)


def test_listen_mode() -> None:
    async def main() -> None:
        proc = await spawn("--acceptor", "127.0.0.1:1", "--service", "api", "--instance", "l-1", "--capacity", "1", "--listen", "127.0.0.1:0")
        kind, addr = (await line(proc)).split(" ")
        host, port = addr.rsplit(":", 1)
        assert kind == "listening" and int(port) > 0
        assert await http_get((host, int(port)), "/") == (200, b"l-1\n")
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0

    run(main(), limit=30)
