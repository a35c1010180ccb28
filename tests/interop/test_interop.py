"""One real `sluice` and three services, one per SDK (Rust, Go, Python), registered to the
same reverse cluster: requests spread across all three; each drains in turn under load with no
failed request; a Python and a Go service killed with SIGKILL fail only the requests they
held (502) while the rest keep succeeding."""

from __future__ import annotations

import signal
import socket
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from harness import Binaries, Load, Proc, Sluice, start_service, start_sluice, terminate

LANGS = ("rust", "go", "python")
CAPACITY = 4  # sessions per instance
DELAY_MS = 20  # work per request, so that sessions are busy when a service is drained or killed
CLIENTS = 16  # more than the 12 sessions: the admission queue is in play


@pytest.fixture
def sluice(bins: Binaries, tmp_path: Path) -> Iterator[Sluice]:
    proxy = start_sluice(bins, tmp_path)
    yield proxy
    code = proxy.proc.popen.poll()
    if code is None:
        proxy.proc.signal(signal.SIGTERM)
        code = proxy.proc.wait_exit()
    assert code == 0, f"sluice exited {code}:\n{proxy.proc.tail()}"


@pytest.fixture
def services(bins: Binaries, sluice: Sluice) -> Iterator[dict[str, Proc]]:
    procs = {lang: start_service(bins, lang, sluice, lang, CAPACITY, DELAY_MS) for lang in LANGS}
    yield procs
    for p in procs.values():
        p.stop()


def test_requests_spread_across_all_three(sluice: Sluice, services: dict[str, Proc]) -> None:
    load = Load(sluice.http, CLIENTS).start()
    load.wait_for(600)
    results = load.stop()
    assert all(r.status == 200 for r in results), [r for r in results if r.status != 200][:5]
    served = Counter(r.body for r in results)
    assert set(served) == set(LANGS), served
    # Equal sessions and a FIFO ring of idle sessions: each instance gets a fair share.
    for lang in LANGS:
        assert served[lang] >= len(results) * 0.15, served


def test_each_drains_in_turn_under_load_without_a_failed_request(
    bins: Binaries, sluice: Sluice, services: dict[str, Proc]
) -> None:
    load = Load(sluice.http, CLIENTS).start()
    load.wait_for(200)
    for lang in LANGS:
        old = services[lang]
        assert terminate(old) == 0, f"{lang} did not drain cleanly:\n{old.tail()}"
        assert "drained" in old.lines, old.tail()
        load.wait_for(100)  # the other two carry the load alone
        services[lang] = start_service(bins, lang, sluice, lang, CAPACITY, DELAY_MS)
        load.wait_for(100)
    results = load.stop()
    failed = [r for r in results if r.status != 200]
    assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:5]}"
    assert set(Counter(r.body for r in results)) == set(LANGS)


def test_killed_services_fail_only_the_requests_they_held(
    sluice: Sluice, services: dict[str, Proc]
) -> None:
    load = Load(sluice.http, CLIENTS).start()
    load.wait_for(200)
    killed = []
    for lang in ("python", "go"):
        proc = services[lang]
        assert proc.started_ids(), f"{lang} served nothing before the kill"
        proc.signal(signal.SIGKILL)
        assert proc.wait_exit() == -signal.SIGKILL
        killed.append(proc)
        load.wait_for(50)  # what the killed instance held has failed by now
    mark = load.count()
    load.wait_for(200)  # the rest keep succeeding
    results = load.stop()

    failed = [r for r in results if r.status != 200]
    assert all(r.status == 502 for r in failed), failed[:5]
    # A session holds one request at a time: each killed instance can fail at most CAPACITY.
    assert len(failed) <= CAPACITY * len(killed), failed
    survivor_ids = services["rust"].started_ids()
    assert not any(r.id in survivor_ids for r in failed), "a failed request had reached rust"
    after = results[mark:]
    assert all(r.status == 200 and r.body == "rust" for r in after), Counter((r.status, r.body) for r in after)


def test_every_sdk_reports_the_client_address_the_proxy_saw(
    sluice: Sluice, services: dict[str, Proc]
) -> None:
    """Each SDK gives its app the TCP peer Sluice saw (Sluice-Client-Addr), not an address the
    client wrote into X-Forwarded-For or into Sluice-Client-Addr itself."""
    seen: dict[str, str] = {}
    for _ in range(60):  # requests rotate across the instances; 60 reach all three
        with socket.create_connection(sluice.http) as conn:
            me = "%s:%d" % conn.getsockname()[:2]
            conn.sendall(
                b"GET /client HTTP/1.1\r\nHost: interop\r\nX-Echo-Client: 1\r\n"
                b"X-Forwarded-For: 6.6.6.6\r\nSluice-Client-Addr: 6.6.6.6:1\r\n"
                b"Connection: close\r\n\r\n"
            )
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        head, _, body = answer.decode().partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 200"), answer
        lang, _, client = body.strip().partition(" ")
        assert client == me, f"{lang} reported {client!r}, the client was {me}"
        seen[lang] = client
        if len(seen) == len(LANGS):
            break
    assert set(seen) == set(LANGS), seen
