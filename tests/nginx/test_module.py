"""NGINX with ngx_http_sluice_module as a consumer of `sluice acceptor` (docs/handoff.md),
serving services written with the Go SDK: requests flow over lent sessions and a service
never sees more at once than it declared; workers share the pool and overload waits or gets
503 + Retry-After; drains, reloads, a killed service and a restarted acceptor cost nothing
they should not. Every assertion is about statuses and counts, never about time."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Callable

from conftest import Built, Nginx
from harness import WAIT, Load, Proc, Result, registrations, start_acceptor, start_consumer, start_service


def ok(results: list[Result]) -> None:
    failed = [r for r in results if r.status != 200]
    assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:5]}"


def status(n: Nginx) -> dict:
    """One worker's sluice_status (whichever worker takes the connection)."""
    with urllib.request.urlopen(f"http://{n.addr[0]}:{n.addr[1]}/sluice", timeout=30) as res:
        assert res.headers["Content-Type"] == "application/json"
        return json.loads(res.read())


def test_requests_flow_and_the_service_never_sees_more_than_it_declared(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 4, 5)
    procs.append(service)
    nginx = nginx_factory(sock, workers=2, idle=4)
    nginx.wait_connected(2)
    load = Load(nginx.addr, 16).start()  # POSTs, 4x the service's sessions
    load.wait_for(400)
    results = load.stop()
    ok(results)
    assert {r.body for r in results} == {"go"}
    # Sixteen clients, four sessions: requests queued in the workers, and no session ever
    # carried two requests at once.
    assert max(r.in_flight for r in results) <= 4
    assert registrations([acceptor]) == 4, "no session was lost and re-dialed"
    st = status(nginx)["upstreams"][0]
    assert st["name"] == "interop" and st["connected"] is True
    assert st["protocol_errors"] == 0 and st["received"] >= 1


def test_four_workers_share_the_pool_and_overload_waits_or_gets_503(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 4, 10)
    procs.append(service)
    # Four sessions, four workers with a queue of 4 each: 40 clients are 10x what the
    # service declared and more than sessions plus queues (4 + 4 x 4) can hold.
    nginx = nginx_factory(sock, workers=4, idle=1, queue=4, queue_timeout="5s")
    nginx.wait_connected(4)
    load = Load(nginx.addr, 40, method="GET").start()
    # 503s come back at once, 200s at the service's pace: run until enough of both.
    for _ in range(500):  # at most 50 000 requests
        if sum(r.status == 200 for r in list(load.results)) >= 200:
            break
        load.wait_for(100)
    results = load.stop()
    by_status = Counter(r.status for r in results)
    assert set(by_status) <= {200, 503}, f"only 200 or 503, never 502 or a reset: {by_status}"
    assert by_status[200] >= 200 and by_status[503] > 0, by_status
    assert all(r.retry_after == "1" for r in results if r.status == 503)
    assert max(r.in_flight for r in results) <= 4
    assert registrations([acceptor]) == 4, "the workers shared the four sessions; none re-dialed"
    # Four distinct workers were consumers of the one acceptor.
    consumers = {line.split("#")[1].split(":")[0] for line in nginx.proc.lines
                 if "sluice: connected to the acceptor" in line}
    assert len(consumers) == 4


def test_a_draining_service_leaves_without_a_failed_request(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    leaving = start_service(built.bins, "go", addr, "leaving", 4, 5)
    staying = start_service(built.bins, "go", addr, "staying", 4, 5)
    procs += [leaving, staying]
    nginx = nginx_factory(sock, workers=2, idle=2)
    nginx.wait_connected(2)
    load = Load(nginx.addr, 8).start()  # POSTs: never retried, so any failure shows
    load.wait_for(300)
    leaving.signal(signal.SIGTERM)  # the SDK drains through the acceptor, then exits
    assert leaving.wait_exit() == 0, leaving.tail()
    assert "drained" in leaving.lines
    load.wait_for(300)
    results = load.stop()
    ok(results)
    served = Counter(r.body for r in results)
    assert served["leaving"] > 0 and served["staying"] > 0, served
    assert "sluice: instance \"leaving\" drains" in "\n".join(nginx.proc.lines)


def test_reload_ten_times_under_load_fails_nothing_and_nothing_re_dials(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 8, 2)
    procs.append(service)
    nginx = nginx_factory(sock, workers=2, idle=2)
    nginx.wait_connected(2)
    # GETs: a keep-alive connection that an old worker closes between two requests is
    # retried once on a new one, as HTTP clients do (harness.Load counts those).
    load = Load(nginx.addr, 6, method="GET").start()
    load.wait_for(200)
    for n in range(10):
        nginx.reload()
        nginx.wait_connected(2 * (n + 2))  # the new generation of workers is in
        load.wait_for(100)
    results = load.stop()
    ok(results)
    # Old workers RETURNed their sessions to the acceptor for the new ones: the service
    # registered its eight once, and never had to re-dial.
    assert registrations([acceptor]) == 8
    print("RECALLDBG", [st["recalled"] for st in (status(nginx)["upstreams"][0] for _ in range(6))])
    assert "exited on signal" not in "\n".join(nginx.proc.lines)


def test_requests_queued_in_an_old_worker_are_served_by_its_sessions_after_a_reload(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 4, 1500)
    procs.append(service)
    # Twelve requests for four sessions: four are served at once, eight wait, and with the
    # four sessions they are all served in two more rounds, well within queue_timeout. One
    # session fewer takes a third round, beyond it.
    nginx = nginx_factory(sock, workers=1, idle=4, queue=64, queue_timeout="3750ms")
    nginx.wait_connected(1)
    until(nginx, lambda st: st["idle"] == 4, "the four sessions")
    results: list[Result] = []
    clients = [threading.Thread(target=lambda n=n: results.append(get(nginx, f"old-{n}")), daemon=True)
               for n in range(12)]
    for c in clients:
        c.start()
    until(nginx, lambda st: st["leased"] == 4 and st["queued"] == 8, "four served and eight waiting")
    # The new worker asks for sessions of its own, and the acceptor RECALLs one from the old
    # worker. The old worker's waiting requests are older than anything the new one will
    # get: it serves them first, and gives its sessions back once its queue is empty.
    nginx.reload()
    nginx.wait_connected(2)
    for c in clients:
        c.join(WAIT)
    by_status = Counter(r.status for r in results)
    assert by_status == {200: 12}, [r for r in results if r.status != 200]
    assert registrations([acceptor]) == 4, "no session was lost and re-dialed"


def until(n: Nginx, pred: Callable[[dict], bool], what: str) -> dict:
    """The worker's sluice_status once `pred` holds (polled; fails after WAIT)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        st = status(n)["upstreams"][0]
        if pred(st):
            return st
        time.sleep(0.01)
    raise AssertionError(f"sluice_status never showed {what}: {st}")


def served_by(n: Nginx) -> tuple[str, str]:
    """One request's instance and session (the Go service's local address of it)."""
    conn = http.client.HTTPConnection(*n.addr, timeout=WAIT)
    try:
        conn.request("GET", "/work", headers={"X-Echo-Session": "1"})
        res = conn.getresponse()
        assert res.status == 200, res.status
        instance, session = res.read().decode().split()
        return instance, session
    finally:
        conn.close()


def test_instances_take_turns_and_each_serves_from_its_warmest_session(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    """The Sluice proxy's leasing rule (docs/design.md, "Leasing"): requests rotate across
    instances in proportion to their idle sessions, and within an instance the session that
    came back last serves, so one request at a time keeps one session per instance busy
    instead of cycling through all of them (cold sockets, cold service threads)."""
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    for name, sessions in (("a", 4), ("b", 2)):
        procs.append(start_service(built.bins, "go", addr, name, sessions, 0))
    nginx = nginx_factory(sock, workers=1, idle=6)
    nginx.wait_connected(1)
    until(nginx, lambda st: st["idle"] == 6, "the six sessions idle in the worker")
    served = [served_by(nginx) for _ in range(36)]
    assert Counter(instance for instance, _ in served) == {"a": 24, "b": 12}
    # Each six requests in a row went four to a and two to b, whatever the order the
    # sessions arrived in.
    for i in range(0, 36, 6):
        assert Counter(instance for instance, _ in served[i:i + 6]) == {"a": 4, "b": 2}, served
    sessions = {name: {s for instance, s in served if instance == name} for name in "ab"}
    assert {name: len(s) for name, s in sessions.items()} == {"a": 1, "b": 1}, served


def test_a_service_killed_mid_load_fails_only_its_own_requests(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    victim = start_service(built.bins, "go", addr, "victim", 4, 20)
    survivor = start_service(built.bins, "go", addr, "survivor", 4, 20)
    procs += [victim, survivor]
    nginx = nginx_factory(sock, workers=2, idle=4)
    nginx.wait_connected(2)
    load = Load(nginx.addr, 8).start()  # POSTs: NGINX does not retry them
    load.wait_for(200)
    victim.signal(signal.SIGKILL)
    assert victim.wait_exit() == -signal.SIGKILL
    load.wait_for(400)
    results = load.stop()
    failed = [r for r in results if r.status != 200]
    # Each of the victim's four sessions can fail at most the one request it carried
    # (in flight, or leased at the moment it died); the survivor's sessions fail none.
    assert len(failed) <= 4, failed
    assert all(r.status == 502 for r in failed), failed
    # Then the survivor serves everything.
    ok(results[-200:])
    assert {r.body for r in results[-200:]} == {"survivor"}


def test_the_acceptor_restarts_under_load(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    first, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(first)
    service = start_service(built.bins, "go", addr, "go", 8, 2)
    procs.append(service)
    nginx = nginx_factory(sock, workers=1, idle=4)
    nginx.wait_connected(1)
    load = Load(nginx.addr, 2, method="GET").start()
    load.wait_for(200)
    first.signal(signal.SIGTERM)
    assert first.wait_exit() == 0, first.tail()
    load.wait_for(200)  # the sessions the worker holds keep serving without an acceptor
    second, _ = start_acceptor(built.bins, tmp_path, sock, listen=addr)
    procs.append(second)
    nginx.wait_connected(2)  # the worker reconnected (with backoff) to the new acceptor
    second.wait_line(lambda line: '"message":"session registered"' in line, "a re-dialed session")
    load.wait_for(300)
    ok(load.stop())


def test_no_connect_and_no_blocking_recvmsg_in_a_worker_under_load(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 4, 1)
    procs.append(service)
    nginx = nginx_factory(sock, workers=1, idle=2)
    nginx.wait_connected(1)
    [worker] = nginx.worker_pids()
    trace = tmp_path / "strace.txt"
    strace = Proc("strace", ["strace", "-f", "-qq", "-e", "trace=connect,recvmsg", "-o", str(trace),
                             "-p", str(worker)])
    procs.append(strace)
    load = Load(nginx.addr, 8).start()
    load.wait_for(100)  # strace may attach a little late: wait for load it must see
    load.wait_for(400)
    # RECALLs and returns make the acceptor talk to the worker: a second service adds some.
    extra = start_service(built.bins, "go", addr, "extra", 4, 1)
    procs.append(extra)
    load.wait_for(300)
    ok(load.stop())
    strace.signal(signal.SIGINT)
    strace.wait_exit()
    lines = trace.read_text().splitlines()
    assert lines, "strace saw nothing"
    assert not [line for line in lines if "connect(" in line], "the worker called connect()"
    # strace decodes recvmsg's flags when the call returns: one it was inside when it detached
    # shows as "recvmsg(8,  <detached ...>" and can only be the worker's last traced line.
    unfinished = [line for line in lines if line.endswith("<detached ...>")]
    assert unfinished in ([], lines[-1:]), unfinished
    recvmsgs = [line for line in lines if "recvmsg(" in line and line not in unfinished]
    assert recvmsgs, "the worker received no handoff message (SESSION) while traced"
    assert all("MSG_DONTWAIT" in line for line in recvmsgs), [
        line for line in recvmsgs if "MSG_DONTWAIT" not in line][:5]


def test_a_request_waits_at_most_queue_timeout_and_one_that_leaves_frees_its_place(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 1, 2000)  # one session, slow answers
    procs.append(service)
    nginx = nginx_factory(sock, workers=1, idle=1, queue=8, queue_timeout="500ms")
    nginx.wait_connected(1)

    def until(pred: Callable[[dict], bool], what: str) -> dict:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            st = status(nginx)["upstreams"][0]
            if pred(st):
                return st
            time.sleep(0.01)
        raise AssertionError(f"sluice_status never showed {what}: {st}")

    until(lambda st: st["idle"] == 1, "the session")
    first: list[Result] = []
    holder = threading.Thread(target=lambda: first.append(get(nginx, "first")), daemon=True)
    holder.start()
    service.wait_line(lambda line: line == "start first", "the first request")
    # The only session is busy for far longer than queue_timeout: the next request waits
    # its 500 ms in the queue, then gets 503 with Retry-After.
    res = get(nginx, "late")
    assert res.status == 503 and res.retry_after == "1", res
    assert until(lambda st: st["rejected"] == 1, "one rejection")["queued"] == 0
    # A client that leaves while queued frees its place, and its request never reaches
    # the service.
    with socket.create_connection(nginx.addr, timeout=WAIT) as s:
        s.sendall(b"GET /work HTTP/1.1\r\nHost: x\r\nX-Request-Id: gone\r\n\r\n")
        until(lambda st: st["queued"] == 1, "the request in the queue")
    st = until(lambda st: st["queued"] == 0, "the queue empty again")
    assert st["rejected"] == 1
    holder.join(WAIT)
    assert first and first[0].status == 200
    assert get(nginx, "after").status == 200  # the session went back to the pool
    assert "gone" not in service.started_ids()


def get(n: Nginx, rid: str) -> Result:
    conn = http.client.HTTPConnection(*n.addr, timeout=WAIT)
    try:
        conn.request("GET", "/work", headers={"X-Request-Id": rid})
        res = conn.getresponse()
        return Result(rid, res.status, res.read().decode(errors="replace"), 0, res.getheader("retry-after"))
    finally:
        conn.close()


def test_a_slow_upload_holds_no_session(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 1, 0)  # one session only
    procs.append(service)
    nginx = nginx_factory(sock, workers=1, idle=1)
    nginx.wait_connected(1)
    with socket.create_connection(nginx.addr, timeout=WAIT) as slow:
        # Half a body: the request must not hold the only session while the rest trickles.
        slow.sendall(b"POST /work HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow\r\nContent-Length: 10\r\n\r\n12345")
        for n in range(3):
            assert get(nginx, f"fast-{n}").status == 200
        st = status(nginx)["upstreams"][0]
        assert st["reserved"] == 0 and st["queued"] == 0 and st["leased"] == 0, st
        assert "slow" not in service.started_ids()
        slow.sendall(b"67890")
        assert slow.recv(4096).startswith(b"HTTP/1.1 200 ")
    # The service printed it before answering; its line may reach us after the answer.
    service.wait_line(lambda line: line == "start slow", "the slow request at the service")


def test_nginx_gives_sessions_back_when_recalled_for_a_sluice_consumer(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 8, 5)
    procs.append(service)
    nginx = nginx_factory(sock, workers=1, idle=8)
    nginx.wait_connected(1)
    deadline = time.monotonic() + WAIT
    while status(nginx)["upstreams"][0]["idle"] < 8:  # the worker holds every session
        assert time.monotonic() < deadline, status(nginx)
        time.sleep(0.01)
    # A Sluice consumer arrives with nothing: the acceptor RECALLs sessions from the worker,
    # which returns them; they serve the other process without being re-dialed.
    consumer, http = start_consumer(built.bins, tmp_path, sock, "sluice-consumer")
    procs.append(consumer)
    loads = [Load(nginx.addr, 8, method="GET").start(), Load(http, 8, method="GET").start()]
    for load in loads:
        load.wait_for(400)
    results = [r for load in loads for r in load.stop()]
    ok(results)
    assert max(r.in_flight for r in results) <= 8
    assert registrations([acceptor]) == 8
    st = status(nginx)["upstreams"][0]
    assert st["recalled"] > 0 and st["returned"] >= st["recalled"], st


def test_a_recall_passes_over_idle_sessions_of_an_earlier_acceptor(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    """Sessions lent before the acceptor restarted stay with the worker (the new acceptor does
    not know them) and are never returned to it; a RECALL takes the worker's other idle
    sessions instead, with no request needed to move them."""
    sock = tmp_path / "handoff.sock"
    first, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(first)
    procs.append(start_service(built.bins, "go", addr, "old", 2, 0))
    nginx = nginx_factory(sock, workers=1, idle=4)
    nginx.wait_connected(1)
    until(nginx, lambda st: st["idle"] == 2, "the first acceptor's two sessions in the worker")
    first.signal(signal.SIGTERM)
    assert first.wait_exit() == 0, first.tail()
    second, _ = start_acceptor(built.bins, tmp_path, sock, listen=addr)
    procs.append(second)
    nginx.wait_connected(2)
    procs.append(start_service(built.bins, "go", addr, "new", 2, 0))
    until(nginx, lambda st: st["idle"] == 4, "the second acceptor's two sessions too")
    # A Sluice consumer with nothing: the acceptor, with no session idle, recalls from the
    # worker, which holds both of its sessions. Nothing is requested anywhere meanwhile.
    consumer, _ = start_consumer(built.bins, tmp_path, sock, "sluice-consumer")
    procs.append(consumer)
    st = until(nginx, lambda st: st["recalled"] >= 1, "a recalled session given back")
    assert st["returned"] >= st["recalled"], st
    assert served_by(nginx)[0] in ("old", "new")
