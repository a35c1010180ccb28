"""Reload under load (`POST /reload` on the admin API, and SIGHUP). A file whose routes changed
is applied in place (same process, same client connections); one whose other settings changed
is a hot restart of the same binary. Either way no request fails and no service re-dials; a
file that does not load is refused with its file:line:col error and changes nothing."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from pathlib import Path


from harness import CONFIG, WAIT, Binaries, Load, registrations, start_service, start_sluice

RELOADS = 5


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
    path = tmp_path / "sluice.toml"
    try:
        load = Load(sluice.http, 12, method="GET").start()
        load.wait_for(200)

        # Routes only: applied in place; the same process answers, on the same connections.
        stale = load.stale_retries
        extra = '[[route]]\nname = "reloaded"\npath_prefix = "/reloaded"\ndirect_response = { status = 200, body = "new route\\n" }\n\n'
        path.write_text(config.replace("[[route]]", extra + "[[route]]", 1))
        status, body = admin_call(admin, "POST", "/reload")
        assert status == 200 and "in place" in body["message"], body
        assert pid_of(admin) == last
        conn = http.client.HTTPConnection(*sluice.http, timeout=WAIT)
        conn.request("GET", "/reloaded")
        assert conn.getresponse().read() == b"new route\n"
        conn.close()
        load.wait_for(100)
        assert load.stale_retries == stale, "an in-place reload closed client connections"

        # Anything else: a new process takes over, each time.
        for i in range(RELOADS):
            text = path.read_text()
            path.write_text(text.replace(f'shutdown_grace = "{20 + i}s"', f'shutdown_grace = "{21 + i}s"'))
            status, body = admin_call(admin, "POST", "/reload")
            assert status == 200 and body["reloaded"] and "took over" in body["message"], body
            last = wait_new_pid(admin, last)
            load.wait_for(100)
        # (Not wait_exit: its successors hold the same stdout, so the pipe stays open.)
        assert sluice.proc.popen.wait(timeout=WAIT) == 0, sluice.proc.tail()

        good = path.read_text()
        path.write_text(good + '\n[cluster.broken]\nkind = "nope"\n')
        status, body = admin_call(admin, "POST", "/reload")
        assert status == 400 and "sluice.toml:" in body["error"], body
        assert pid_of(admin) == last, "a refused reload changed nothing"
        path.write_text(good.replace(f'shutdown_grace = "{20 + RELOADS}s"', 'shutdown_grace = "5s"'))

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
