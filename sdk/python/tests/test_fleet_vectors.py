"""Every scenario of protocol/vectors/fleet.json (its ``_doc`` says how to replay one), against
the fleet's bookkeeping (``sluice_sdk.fleet``) on a fake clock: each event is the call the
control links (``links``) or the session slots (``nodeslot``) make for it, without sockets."""

from __future__ import annotations

import asyncio
import errno
import heapq
import itertools
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fakes import run
from sluice_sdk import control
from sluice_sdk.control import Demand, Draining
from sluice_sdk.dial import Endpoint
from sluice_sdk.errors import ConnectError, HandshakeTimeout
from sluice_sdk.fleet import Fleet, Node
from sluice_sdk.options import Backoff
from sluice_sdk.state import Shared

VECTORS = Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "fleet.json"


def load() -> dict[str, Any]:
    # A missing file fails the suite: it is the contract every SDK shares.
    return json.loads(VECTORS.read_text(encoding="utf-8"))


class FakeTimer:
    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.when, self.callback, self.args = when, callback, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """The fleet's clock: time stands still until :meth:`advance` moves it, firing each timer
    that falls due on the way at its own time, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> FakeTimer:
        timer = FakeTimer(self.now + delay, callback, args)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    def advance(self, to: float) -> None:
        while self._timers and self._timers[0][0] <= to:
            when, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self.now = max(self.now, when)
                timer.callback(*timer.args)
        self.now = max(self.now, to)


class LinkWriter:
    """One control link's writing end: the service's lines land in :attr:`replay`'s tally."""

    def __init__(self, replay: Replay, name: str) -> None:
        self.replay, self.name = replay, name
        self.closed = False

    def write(self, data: bytes) -> None:
        for line in data.decode("ascii").splitlines():
            verb, _, n = line.partition(" ")
            if verb == "RETIRE":
                self.replay.retired[self.name] += int(n)

    def close(self) -> None:
        self.closed = True


class FakeSession:
    """A registered session: always idle (no request in these scenarios)."""

    def __init__(self) -> None:
        self.retired = False
        self.closing = False  # the SDK closed it; it ends once the step settles

    @property
    def idle(self) -> bool:
        return True

    def close_if_idle(self) -> bool:
        self.closing = True
        return True


class Replay:
    """One scenario's SDK side: a fleet, its links' writers, its sessions and dials."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.shared = Shared()
        self.shared.resize(options["capacity"])
        self.clock = FakeClock()
        backoff = options.get("backoff", {"initial": 0.1, "max": 5.0})
        self.fleet = Fleet(self.shared, options["node_grace"], self._start_link, clock=self.clock,
                           first_wait=options["handshake_timeout"],
                           backoff=Backoff(backoff["initial"], backoff["max"], jitter=0.0))
        self.names: dict[str, Endpoint] = {}
        self.links: dict[str, tuple[int, LinkWriter]] = {}
        self.dialing: Counter[str] = Counter()
        self.sessions: dict[str, list[FakeSession]] = {}
        self.retired: Counter[str] = Counter()
        self.dialed: Counter[str] = Counter()
        self.closed: Counter[str] = Counter()

    @staticmethod
    def _start_link(node: Node) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()  # (cancelled when forgotten)

    def endpoint(self, name: str) -> Endpoint:
        if name not in self.names:
            self.names[name] = Endpoint(f"192.0.2.{len(self.names) + 1}", 7070)
        return self.names[name]

    def node(self, name: str) -> Node:
        key = str(self.endpoint(name))
        return next(n for n in self.fleet.nodes if str(n) == key)

    # -- a step ---------------------------------------------------------------------------

    def step(self, step: dict[str, Any]) -> dict[str, Any]:
        self.retired, self.dialed, self.closed = Counter(), Counter(), Counter()
        self.clock.advance(step["at"])
        self.settle()
        for event in step["do"]:
            getattr(self, "on_" + event[0])(*event[1:])
            self.check_sum()
        self.settle()
        return self.seen(step["expect"])

    def settle(self) -> None:
        """Sessions the SDK closed end; then the slots dial until the rules stop them."""
        while True:
            ended = self.end_closing()
            node = self.fleet.take()
            if node is not None:
                name = self.name_of(node)
                self.dialed[name] += 1
                self.dialing[name] += 1
            self.check_sum()
            if not ended and node is None:
                return

    def end_closing(self) -> bool:
        ended = False
        for name, sessions in self.sessions.items():
            for s in [s for s in sessions if s.closing]:
                self.end(name, s)
                self.closed[name] += 1
                ended = True
        return ended

    def end(self, name: str, session: FakeSession) -> None:
        node = self.node(name)
        self.sessions[name].remove(session)
        self.fleet.closed(node, session)
        self.fleet.release(node, session)

    def name_of(self, node: Node) -> str:
        return next(name for name, e in self.names.items() if str(e) == str(node))

    def check_sum(self) -> None:
        held = sum(self.dialing.values()) + sum(len(s) for s in self.sessions.values())
        assert held <= self.options["capacity"], f"{held} sessions held or being dialed"

    def seen(self, expect: dict[str, Any]) -> dict[str, Any]:
        """What the SDK did, in the shape of ``expect``."""
        out: dict[str, Any] = {}
        for key, tally in (("retire", self.retired), ("dials", self.dialed),
                           ("closes", self.closed)):
            if tally or key in expect:
                out[key] = {k: v for k, v in sorted(tally.items()) if v}
        if "targets" in expect:
            out["targets"] = {n: self.node(n).target for n in expect["targets"]}
        if "live" in expect:
            out["live"] = {n: self.node(n).live for n in expect["live"]}
        return out

    # -- the events -----------------------------------------------------------------------

    def on_resolve(self, names: list[str]) -> None:
        self.fleet.update([self.endpoint(n) for n in names])

    def on_up(self, name: str) -> None:
        writer = LinkWriter(self, name)
        gen = self.fleet.link_up(self.node(name), writer)  # type: ignore[arg-type]
        self.links[name] = (gen, writer)

    def on_line(self, name: str, text: str) -> None:
        gen, _ = self.links[name]
        heard = control.parse_node_line(text)
        if isinstance(heard, Demand):
            self.fleet.demand(self.node(name), gen, heard)
        elif isinstance(heard, Draining):
            self.fleet.draining(self.node(name), gen)
        else:
            self.fleet.floor(self.node(name), gen, heard.on)

    def on_lost(self, name: str) -> None:
        gen, _ = self.links[name]
        self.fleet.link_down(self.node(name), gen, "the link ended")

    def on_refused(self, name: str) -> None:
        cause = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        self.fleet.link_failed(self.node(name), ConnectError(name, cause))

    def on_timeout(self, name: str) -> None:
        self.fleet.link_failed(self.node(name), HandshakeTimeout(self.options["handshake_timeout"]))

    def on_registered(self, name: str, k: int) -> None:
        assert self.dialing[name] >= k, f"{k} registered at {name}, {self.dialing[name]} dialed"
        for _ in range(k):
            self.dialing[name] -= 1
            session = FakeSession()
            self.sessions.setdefault(name, []).append(session)
            if self.fleet.opened(self.node(name), session):
                session.closing = True  # unused: the slot closes it at once

    def on_failed(self, name: str, k: int) -> None:
        """``k`` session dials under way to ``name`` fail (a retryable refusal): as a slot does,
        the fleet hears of each and the dial's count ends."""
        assert self.dialing[name] >= k, f"{k} failed at {name}, {self.dialing[name]} dialed"
        node = self.node(name)
        for _ in range(k):
            self.dialing[name] -= 1
            self.fleet.release(node, None)
            self.fleet.dial_failed(node)

    def on_closed(self, name: str, k: int) -> None:
        sessions = [s for s in self.sessions.get(name, []) if not s.closing]
        assert len(sessions) >= k, f"{k} closed at {name}, {len(sessions)} open"
        for session in sessions[:k]:
            self.end(name, session)


def test_the_fleet_vectors_file_is_version_1() -> None:
    v = load()
    assert v["version"] == 1 and v["_doc"] and v["scenarios"]


@pytest.mark.parametrize("scenario", [pytest.param(s, id=s["name"]) for s in load()["scenarios"]])
def test_fleet_scenario(scenario: dict[str, Any]) -> None:
    async def main() -> None:
        replay = Replay(scenario["options"])
        try:
            for i, step in enumerate(scenario["steps"]):
                want = {k: v for k, v in step["expect"].items()}
                for key in ("retire", "dials", "closes"):
                    want.setdefault(key, {})
                got = replay.step(step)
                for key in ("retire", "dials", "closes"):
                    got.setdefault(key, {})
                assert got == want, f"step {i} (at {step['at']}s, {step['do']})"
        finally:
            replay.fleet.close()

    run(main())
