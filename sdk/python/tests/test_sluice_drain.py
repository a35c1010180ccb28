"""An operator's drain and resume on the real proxy (issue 28.8): the drained instance stays out
without re-dialing, and `resume` brings it back by itself within `drained_probe`."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
from pathlib import Path

import pytest
from harness import CONFIG, TOKEN, Binaries, start_sluice

import sluice_sdk
from apps import hello
from fakes import run
from sluice_sdk import Options


def admin(addr: str, path: str) -> int:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path)
        res = conn.getresponse()
        res.read()
        return res.status
    finally:
        conn.close()


def test_a_drained_instance_comes_back_after_resume(
        sluice_bin: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")
    proxy = start_sluice(Binaries(sluice_bin, [], [], []), tmp_path,
                         CONFIG + '\n[admin]\nlisten = "127.0.0.1:0"\n')
    line = proxy.proc.wait_line(lambda text: '"admin API listening"' in text, "the admin API")
    addr = json.loads(line)["fields"]["admin.addr"]
    instance = "/clusters/interop/instances/py-drained"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        options = Options(acceptor=proxy.acceptor, service="interop", instance="py-drained",
                          token=TOKEN, capacity=2, drained_probe=0.2)
        sessions = await sluice_sdk.serve(hello, options, lifespan="off")
        await sessions.wait_registered()
        shared = sessions._shared

        assert await loop.run_in_executor(None, admin, addr, f"{instance}/drain") == 200
        await shared.wait_until(lambda: shared.held is not None and sessions.registered == 0)
        assert await loop.run_in_executor(None, admin, addr, f"{instance}/resume") == 200
        # No one touches the service: its probe registers, and the other slot follows.
        await shared.wait_until(lambda: sessions.registered == 2)
        await sessions.shutdown()

    try:
        run(main(), limit=60)
    finally:
        proxy.proc.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "drained" in warnings[0], warnings
    assert len([r for r in caplog.records if "resumed" in r.getMessage()]) == 1
