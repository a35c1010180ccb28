"""protocol/README.md "A drained instance stays out" and "What SDKs log": a 410 stops the slots
and one slow probe brings the instance back after a resume; an outage, a refusal and a
capacity change are each one line per instance, never one per slot or attempt."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import sluice_sdk
from apps import hello
from fakes import FakeAcceptor, run
from sluice_sdk import Backoff, ConnectError, Options, Refused

PROBE = 0.05


def opts(acceptor: str, **kw: Any) -> Options:
    kw.setdefault("backoff", Backoff(initial=0.01, max=0.05))
    return Options(acceptor=acceptor, service="api", instance="api-1", **kw)


def lines(caplog: pytest.LogCaptureFixture, level: int, text: str = "") -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "sluice_sdk" and r.levelno == level and text in r.getMessage()]


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluice_sdk")


def test_a_drained_instance_probes_once_per_interval_and_comes_back_when_resumed(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=3,
                                                      drained_probe=PROBE))
        first = [await acc.session() for _ in range(3)]
        await sessions.wait_registered(3)
        # An operator drains the instance: the proxy closes its sessions and refuses it (410),
        # six times; the slots that re-dial (one to three: the others see the hold first and
        # wait) are refused, then so are probes, until one finds the instance resumed.
        acc.answers = [410] * 6
        for s in first:
            s.close()
        await acc.wait_attempts(3 + 6 + 1)
        # Every other slot dials at once.
        await sessions._shared.wait_until(lambda: sessions.registered == 3)
        assert acc.attempts == 3 + 6 + 1 + 2
        probes = acc.attempt_times[6:10]  # attempts 7 to 10 are probes, whatever re-dialed
        # One probe per interval for the whole instance, not one per slot: no two together.
        assert all(b - a > PROBE / 2 for a, b in zip(probes, probes[1:])), probes
        assert (await (await acc.session()).request()).status == 200
        sessions.close()

    run(main())
    assert len(lines(caplog, logging.WARNING)) == 1  # the 410: once, for all slots and probes
    assert "drained" in lines(caplog, logging.WARNING)[0]
    assert len(lines(caplog, logging.INFO, "resumed")) == 1


def test_setting_the_capacity_while_drained_dials_at_once() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=2,
                                                      drained_probe=3600))
        first = [await acc.session(), await acc.session()]
        acc.refuse_all = 410
        for s in first:
            s.close()
        shared = sessions._shared
        await shared.wait_until(lambda: shared.held is not None and sessions.registered == 0)
        with pytest.raises(Refused) as err:
            await sessions.wait_registered(1)
        assert err.value.drained
        acc.refuse_all = None  # resumed; the next probe is an hour away
        sessions.set_capacity(2)  # so the resize itself dials
        await shared.wait_until(lambda: sessions.registered == 2)
        sessions.close()

    run(main())


def test_a_410_answered_before_the_capacity_was_set_again_does_not_hold_anew(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=2,
                                                      drained_probe=3600))
        first, second = await acc.session(), await acc.session()
        shared = sessions._shared
        acc.refuse_all = 410
        acc.hold_answers = True
        first.close()
        second.close()
        await acc.wait_attempts(4)  # both slots dialed again; both answers will be 410
        held, stale = acc.waiting_answers
        held.set()
        await shared.wait_until(lambda: shared.held is not None)
        acc.refuse_all = None
        sessions.set_capacity(2)  # while the other 410 is on its way: dial at once
        await acc.wait_attempts(5)
        acc.hold_answers = False
        acc.waiting_answers[2].set()
        await shared.wait_until(lambda: sessions.registered == 1)
        stale.set()  # the 410 from before must not stop the slots for another hour
        await shared.wait_until(lambda: sessions.registered == 2)
        sessions.close()

    run(main())
    assert len(lines(caplog, logging.WARNING, "drained")) == 1


def test_a_drained_instance_still_shuts_down() -> None:
    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=2,
                                                      drained_probe=3600))
        first = [await acc.session(), await acc.session()]
        acc.refuse_all = 410
        for s in first:
            s.close()
        shared = sessions._shared
        await shared.wait_until(lambda: shared.held is not None and sessions.registered == 0)
        err = sessions.last_error
        assert isinstance(err, Refused) and err.status == 410 and err.drained and not err.retryable
        await sessions.shutdown()
        assert len(acc.drains) == 1 and not sessions._tasks

    run(main())


def test_an_outage_is_one_warning_and_one_line_when_registered_again(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=1))
        first = await acc.session()
        acc.answers = [503] * 5
        first.close()
        await acc.session()
        await sessions._shared.wait_until(lambda: sessions.registered == 1)
        assert acc.attempts == 7
        sessions.close()

    run(main())
    [warning] = lines(caplog, logging.WARNING)
    assert "cannot register with the acceptor 127.0.0.1:" in warning and "503" in warning
    [again] = lines(caplog, logging.INFO, "again")
    assert "5 dials failed" in again


def test_a_proxy_restart_is_two_lines_whatever_the_capacity(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        addr = await acc.start_tcp()
        sessions = await sluice_sdk.serve(hello, opts(addr, capacity=4))
        first = [await acc.session() for _ in range(4)]
        acc.close()  # the proxy stops: its sessions close and nobody listens
        for s in first:
            s.close()
        shared = sessions._shared
        await shared.wait_until(lambda: sessions.registered == 0 and isinstance(
            sessions.last_error, ConnectError))
        await acc.restart_tcp(addr)
        await sessions.wait_registered(4)
        sessions.close()

    run(main())
    [warning] = lines(caplog, logging.WARNING)
    assert "cannot register with the acceptor 127.0.0.1:" in warning and "cannot connect" in warning
    assert len(lines(caplog, logging.INFO, "again after")) == 1


def test_a_refusal_is_one_error_line_for_all_slots(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        acc = FakeAcceptor(answers=[401, 401, 401])
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=3))
        shared = sessions._shared
        await shared.wait_until(lambda: shared.counts.slots == 0)
        assert acc.attempts == 3
        sessions.close()

    run(main())
    [error] = lines(caplog, logging.ERROR)
    assert "401" in error


def test_a_capacity_change_is_one_line_with_both_counts(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=1))
        await sessions.wait_registered(1)
        sessions.set_capacity(3)
        await sessions.wait_registered(3)
        sessions.set_capacity(3)  # no change, no line
        sessions.close()

    run(main())
    assert lines(caplog, logging.INFO, "capacity") == ["capacity 0 -> 1", "capacity 1 -> 3"]
