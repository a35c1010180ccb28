"""Faults with a defined outcome, on the real `sluice` binary: a service frozen with SIGSTOP in
the middle of requests, and a proxy out of file descriptors."""

from __future__ import annotations

import http.client
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from harness import CONFIG, WAIT, Binaries, Proc, start_service, start_sluice

# The interop configuration with a short response_timeout, so a frozen service times out soon.
FROZEN_CONFIG = CONFIG.replace('queue_timeout = "20s"', 'response_timeout = "1s"\nqueue_timeout = "20s"')


def request(addr: tuple[str, int], rid: str) -> tuple[int, str, str]:
    """One GET on a new connection: status, body, and the `x-request-id` echoed back."""
    conn = http.client.HTTPConnection(*addr, timeout=WAIT)
    try:
        conn.request("GET", "/work", headers={"X-Request-Id": rid})
        res = conn.getresponse()
        return res.status, res.read().decode().strip(), res.getheader("x-request-id", "")
    finally:
        conn.close()


def test_a_frozen_service_costs_only_its_own_sessions_and_thawing_it_corrupts_nothing(
    bins: Binaries, tmp_path: Path, procs: list[Proc]
) -> None:
    sluice = start_sluice(bins, tmp_path, FROZEN_CONFIG)
    procs.append(sluice.proc)
    frozen = start_service(bins, "rust", sluice, "frozen", 2, 0)
    healthy = start_service(bins, "rust", sluice, "healthy", 2, 0)
    procs += [frozen, healthy]

    frozen.signal(signal.SIGSTOP)
    try:
        during = [request(sluice.http, f"during-{i}") for i in range(12)]
    finally:
        frozen.signal(signal.SIGCONT)
    timed_out = [r for r in during if r[0] == 504]
    # Each of the frozen instance's two sessions takes one request, answers nothing within
    # response_timeout (504) and is discarded; every other request goes to the healthy one.
    assert 1 <= len(timed_out) <= 2, during
    assert all(r[0] == 200 and r[1] == "healthy" for r in during if r[0] != 504), during

    # Thawed, the frozen service answers requests whose sessions are gone; those answers must
    # reach no one, and every later request gets its own answer.
    with ThreadPoolExecutor(8) as pool:
        after = list(pool.map(lambda i: request(sluice.http, f"after-{i}"), range(80)))
    assert all(status == 200 for status, _, _ in after), after
    assert [echo for _, _, echo in after] == [f"after-{i}" for i in range(80)]
    assert {body for _, body, _ in after} <= {"frozen", "healthy"}


EXHAUSTION_CONFIG = """
[[listener]]
name = "public"
listen = "127.0.0.1:0"
request_header_timeout = "60s"
idle_timeout = "60s"

[[route]]
direct_response = { status = 200, body = "ok" }
"""

# Low enough that a test exhausts it quickly, high enough for the runtime's own descriptors.
FD_LIMIT = 64


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks


def keep_alive_get(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/")
    res = conn.getresponse()
    res.read()
    return res.status


def closed_without_answer(sock: socket.socket) -> bool:
    """Whether the peer closed `sock` (EOF or reset) without sending a byte."""
    sock.settimeout(WAIT)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_out_of_file_descriptors_existing_connections_work_and_the_proxy_recovers(
    bins: Binaries, tmp_path: Path, procs: list[Proc]
) -> None:
    config = tmp_path / "exhaust.toml"
    config.write_text(EXHAUSTION_CONFIG)
    proxy = Proc(
        "sluice",
        ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", str(bins.sluice), "run", "-c", str(config),
         "--log-format", "json", "--workers", "1"],
    )
    procs.append(proxy)
    line = proxy.wait_line(lambda l: '"message":"listening"' in l, "listening")
    host, port = line.split('"addr":"', 1)[1].split('"', 1)[0].rsplit(":", 1)
    addr = (host, int(port))

    established = http.client.HTTPConnection(*addr, timeout=WAIT)
    assert keep_alive_get(established) == 200

    # Idle connections until the proxy has no descriptor left for another.
    idle = [socket.create_connection(addr) for _ in range(FD_LIMIT)]
    proxy.wait_line(lambda l: '"message":"accept failed' in l, "the accept failure's log line")

    # Out of descriptors: a new connection is reset at once instead of waiting unanswered in
    # the backlog; the established connection is still served; the proxy does not spin.
    late = socket.create_connection(addr)
    late.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed_without_answer(late)
    before = cpu_seconds(proxy.popen.pid)
    started = time.monotonic()
    for _ in range(20):
        assert keep_alive_get(established) == 200
        time.sleep(0.1)
    used = cpu_seconds(proxy.popen.pid) - before
    elapsed = time.monotonic() - started
    # A spinning accept loop burns a whole core; backing off costs next to nothing.
    assert used < 0.5 * elapsed, f"{used:.2f} s of CPU in {elapsed:.2f} s while out of descriptors"
    failures_logged = sum(1 for l in proxy.lines if '"message":"accept failed' in l)
    assert failures_logged <= 2, "accept failures are logged once per interval"

    # Descriptors free up: new connections are served again, the old one still is.
    for s in idle:
        s.close()
    for _ in range(3):
        fresh = http.client.HTTPConnection(*addr, timeout=WAIT)
        assert keep_alive_get(fresh) == 200
        fresh.close()
    assert keep_alive_get(established) == 200
