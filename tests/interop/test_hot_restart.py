"""Hot restart (`sluice run --upgrade`, docs/handoff.md) under continuous load: twenty times
in a row a new Sluice takes over the listening sockets and idle sessions of the running one,
which drains and exits. No request fails, and no service re-dials: the acceptor logs exactly
the registrations the services made at the start."""

from __future__ import annotations

import signal
import time
from pathlib import Path


from harness import CONFIG, Binaries, Load, registrations, start_service, start_sluice

RESTARTS = 20
SERVICES = {"rust": 8, "go": 4}  # language: sessions


def test_twenty_hot_restarts_under_load_fail_nothing_and_nobody_redials(bins: Binaries, tmp_path: Path) -> None:
    config = CONFIG.replace(
        "[acceptor]",
        f'[runtime]\nupgrade_socket = "{tmp_path / "upgrade.sock"}"\nshutdown_grace = "20s"\n\n[acceptor]',
    )
    sluice = start_sluice(bins, tmp_path, config)
    generations = [sluice.proc]
    services = [start_service(bins, lang, sluice, lang, n, 2) for lang, n in SERVICES.items()]
    try:
        # The services print `registered N` on their 101s; the acceptor logs each just after.
        generations[0].wait_line(lambda _: registrations(generations) == sum(SERVICES.values()), "every registration logged")
        load = Load(sluice.http, 16, method="GET").start()
        load.wait_for(300)
        takeover_to_exit = []
        for i in range(RESTARTS):
            old = generations[-1]
            started = time.monotonic()
            new = start_sluice(bins, tmp_path, config, upgrade=True, name=f"sluice-{i + 1}")
            assert (new.http, new.acceptor) == (sluice.http, sluice.acceptor), "not the same sockets"
            assert old.wait_exit() == 0, old.tail()
            takeover_to_exit.append(time.monotonic() - started)
            generations.append(new.proc)
            new.proc.wait_line(lambda l: '"message":"adopted the predecessor\'s sessions"' in l, "adoption")
            load.wait_for(100)  # the new generation serves
        results = load.stop()
        failed = [r for r in results if r.status != 200]
        assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:5]}"
        assert {r.body for r in results} == set(SERVICES)
        assert registrations(generations) == sum(SERVICES.values()), "a service re-dialed"
        for s in services:
            assert s.popen.poll() is None, f"{s.name} exited:\n{s.tail()}"
        takeover_to_exit.sort()
        print(
            f"\n{RESTARTS} hot restarts: {len(results)} requests, {len(failed)} failed, "
            f"{load.stale_retries} stale keep-alive retries; --upgrade to old exit: "
            f"median {takeover_to_exit[len(takeover_to_exit) // 2] * 1000:.0f} ms, "
            f"max {takeover_to_exit[-1] * 1000:.0f} ms"
        )
    finally:
        for s in services:
            s.stop()
        last = generations[-1]
        if last.popen.poll() is None:
            last.signal(signal.SIGTERM)
            assert last.wait_exit() == 0, last.tail()
        for p in generations:
            p.stop()
