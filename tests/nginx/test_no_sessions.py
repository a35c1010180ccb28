"""A slice with no session registered at all: the acceptor tells the workers (`SLICE ...
empty`, docs/handoff.md), and a request gets 503 "no sessions registered" at once instead of
waiting its whole queue_timeout (an hour here), unless `no_sessions_wait` lets it wait for a
service that is starting."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from conftest import Built, Nginx
from harness import WAIT, Proc, Result, start_acceptor, start_service

NO_SESSIONS = "no sessions registered for this service"


def status(n: Nginx) -> dict:
    with urllib.request.urlopen(f"http://{n.addr[0]}:{n.addr[1]}/sluice", timeout=WAIT) as res:
        return json.loads(res.read())["upstreams"][0]


def until(n: Nginx, pred: Callable[[dict], bool], what: str) -> dict:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        st = status(n)
        if pred(st):
            return st
        time.sleep(0.01)
    raise AssertionError(f"sluice_status never showed {what}: {st}")


def get(n: Nginx, rid: str) -> Result:
    conn = http.client.HTTPConnection(*n.addr, timeout=WAIT)
    try:
        conn.request("GET", "/work", headers={"X-Request-Id": rid})
        res = conn.getresponse()
        return Result(rid, res.status, res.read().decode(errors="replace").strip(), 0,
                      res.getheader("retry-after"))
    finally:
        conn.close()


def in_background(n: Nginx, rid: str) -> tuple[threading.Thread, list[Result]]:
    out: list[Result] = []
    t = threading.Thread(target=lambda: out.append(get(n, rid)), daemon=True)
    t.start()
    return t, out


def test_with_no_service_registered_a_request_gets_503_at_once(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    nginx = nginx_factory(sock, workers=1, idle=1, queue_timeout="1h")
    nginx.wait_connected(1)
    until(nginx, lambda st: st["registered"] is False, "the acceptor's SLICE empty")
    res = get(nginx, "early")
    assert (res.status, res.body, res.retry_after) == (503, NO_SESSIONS, "1"), res
    # The worker's log reaches the test through a pipe a thread reads: wait for the line.
    deadline = time.monotonic() + WAIT
    while "no sessions registered for upstream" not in "\n".join(nginx.proc.lines):
        assert time.monotonic() < deadline, "no 'no sessions registered' line in nginx's log"
        time.sleep(0.02)
    # A service registers: the slice has sessions again, and requests are served.
    procs.append(start_service(built.bins, "go", addr, "go", 1, 0))
    until(nginx, lambda st: st["registered"] is True, "the acceptor's SLICE registered")
    assert get(nginx, "later").status == 200
    # The 503 ended the request: the proxy never went looking for a session after it (it
    # logged "no live upstreams", then "[alert] header already sent" on a second answer).
    log = "\n".join(nginx.proc.lines)
    assert "no live upstreams" not in log and "[alert]" not in log, log


def test_requests_waiting_when_the_service_goes_away_get_503_at_once(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 1, 60_000)  # one session, stuck
    procs.append(service)
    nginx = nginx_factory(sock, workers=1, idle=1, queue_timeout="1h")
    nginx.wait_connected(1)
    until(nginx, lambda st: st["idle"] == 1, "the session")
    holder, held = in_background(nginx, "held")
    service.wait_line(lambda line: line == "start held", "the first request at the service")
    waiter, waited = in_background(nginx, "waiting")
    until(nginx, lambda st: st["queued"] == 1, "the second request waiting")
    # The service dies: its one request fails (502), and the one waiting for a session is
    # told at once that none is registered, not after an hour.
    service.signal(signal.SIGKILL)
    holder.join(WAIT)
    waiter.join(WAIT)
    assert held and held[0].status == 502, held
    assert waited and (waited[0].status, waited[0].body) == (503, NO_SESSIONS), waited


def test_no_sessions_wait_holds_requests_for_a_service_that_is_starting(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    nginx = nginx_factory(sock, workers=1, idle=1, queue_timeout="1h no_sessions_wait=1h")
    nginx.wait_connected(1)
    until(nginx, lambda st: st["registered"] is False, "the acceptor's SLICE empty")
    waiter, waited = in_background(nginx, "patient")
    until(nginx, lambda st: st["queued"] == 1, "the request waiting")
    procs.append(start_service(built.bins, "go", addr, "go", 1, 0))
    waiter.join(WAIT)
    assert waited and waited[0].status == 200, waited


def test_with_the_acceptor_unreachable_a_request_gets_502_that_says_so(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    # No acceptor listens on the socket: the worker cannot know whether any session exists,
    # so after its wait the request gets NGINX's answer for an upstream it cannot reach (502,
    # no Retry-After) with a body that says so, not a 503 that blames the queue.
    sock = tmp_path / "nobody.sock"
    nginx = nginx_factory(sock, workers=1, idle=1, queue_timeout="200ms")
    st = status(nginx)
    assert st["connected"] is False, st
    res = get(nginx, "lost")
    assert (res.status, res.body, res.retry_after) == (502, "acceptor unreachable", None), res
    deadline = time.monotonic() + WAIT
    while "is unreachable" not in "\n".join(nginx.proc.lines):
        assert time.monotonic() < deadline, "no 'is unreachable' line in nginx's log"
        time.sleep(0.02)
    assert str(sock) in "\n".join(nginx.proc.lines)
    # A service that comes up later is reached: the same upstream serves.
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    procs.append(start_service(built.bins, "go", addr, "go", 1, 0))
    nginx.wait_connected(1)
    until(nginx, lambda st: st["idle"] == 1, "the session")
    assert get(nginx, "found").status == 200
