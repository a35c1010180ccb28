"""Reload under load (`POST /reload` on the admin API, and SIGHUP): each is a hot restart of
the same binary with the re-read file, so no request fails and no service re-dials; a file
that does not load is refused with its file:line:col error and changes nothing."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from pathlib import Path

import pytest

from harness import CONFIG, WAIT, Binaries, Load, build, registrations, start_service, start_sluice

RELOADS = 5


@pytest.fixture(scope="module")
def bins(tmp_path_factory: pytest.TempPathFactory) -> Binaries:
    return build(tmp_path_factory.mktemp("bin"))


def admin_call(addr: str, method: str, path: str) -> tuple[int, dict]:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT)
    try:
        conn.request(method, path)
        res = conn.getresponse()
        return res.status, json.loads(res.read() or b"null")
    finally:
        conn.close()


def pid_of(addr: str) -> int:
    return admin_call(addr, "GET", "/status")[1]["pid"]


def wait_new_pid(addr: str, old: int) -> int:
    """Polls /status (the admin socket moves with the reload) until another process answers."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            pid = pid_of(addr)
            if pid != old:
                return pid
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"no new process took over from {old}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_reloads_under_load_fail_nothing(bins: Binaries, tmp_path: Path) -> None:
    config = CONFIG.replace(
        "[acceptor]",
        f'[runtime]\nupgrade_socket = "{tmp_path / "upgrade.sock"}"\nshutdown_grace = "20s"\n\n'
        '[admin]\nlisten = "127.0.0.1:0"\n\n[acceptor]',
    )
    sluice = start_sluice(bins, tmp_path, config)
    line = sluice.proc.wait_line(lambda l: '"message":"admin API listening"' in l, "the admin API")
    admin = json.loads(line)["fields"]["admin.addr"].removeprefix("Some(").removesuffix(")")
    service = start_service(bins, "rust", sluice, "rust", 8, 2)
    last = pid_of(admin)
    try:
        load = Load(sluice.http, 12, method="GET").start()
        load.wait_for(200)
        for _ in range(RELOADS):
            status, body = admin_call(admin, "POST", "/reload")
            assert status == 200 and body["reloaded"], body
            last = wait_new_pid(admin, last)
            load.wait_for(100)
        # (Not wait_exit: its successors hold the same stdout, so the pipe stays open.)
        assert sluice.proc.popen.wait(timeout=WAIT) == 0, sluice.proc.tail()

        good = (tmp_path / "sluice.toml").read_text()
        (tmp_path / "sluice.toml").write_text(good + "\n[cluster.broken]\nkind = \"nope\"\n")
        status, body = admin_call(admin, "POST", "/reload")
        assert status == 400 and "sluice.toml:" in body["error"], body
        assert pid_of(admin) == last, "a refused reload changed nothing"
        (tmp_path / "sluice.toml").write_text(good)

        os.kill(last, signal.SIGHUP)
        last = wait_new_pid(admin, last)
        load.wait_for(100)
        results = load.stop()
        failed = [r for r in results if r.status != 200]
        assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:5]}"
        assert service.popen.poll() is None
        # Every generation logs to the first one's stderr (they inherit it): 8 registrations
        # in all means no service re-dialed.
        assert registrations([sluice.proc]) == 8, "a service re-dialed"
    finally:
        service.stop()
        if alive(last):
            os.kill(last, signal.SIGTERM)
            deadline = time.monotonic() + WAIT
            while alive(last) and time.monotonic() < deadline:
                time.sleep(0.05)
        sluice.proc.stop()
