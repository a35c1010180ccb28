"""Fleet-wide rate limits (issue 53) with the real parts: three `sluice` nodes ask Envoy's
reference rate-limit service (`envoyproxy/ratelimit`), which keeps its counters in a real
`redis-server`; both are started here with configurations of their own.

* The nodes share one limit: a tenant's requests, sent to all three, are admitted at most
  `LIMIT` times per window of the service (a minute) in total, counted, not timed, and the
  refusals carry the service's fields and a `Retry-After`.
* The local bucket is the first tier: what it refuses never costs a call (the nodes' call
  counters equal the requests that passed it).
* The service killed: a `failure_mode = "open"` route lets requests through, a `"closed"` one
  answers 503; the service started again, both answer as before.
* Redis restarted under the service: the same, and the limit holds again after it."""

from __future__ import annotations

import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from parts import (
    LIMIT,
    Node,
    RateLimitService,
    Redis,
    dump,
    node_config,
    ratelimit_binary,
    sluice_binary,
    wait_for,
)

NODES = 3
WINDOW = 60  # the service's window for the limit (`unit: minute`), in seconds


class Fleet:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.ratelimit_bin = ratelimit_binary()
        self.redis = Redis()
        self.service = RateLimitService(self.ratelimit_bin, tmp, self.redis)
        binary = sluice_binary()
        config = node_config(self.service.grpc)
        self.nodes = [Node(binary, tmp / "nodes", f"node{i}", config) for i in range(NODES)]

    def procs(self):
        return [self.redis.proc, self.service.proc] + [n.proc for n in self.nodes]

    def restart_service(self) -> None:
        self.service = RateLimitService(self.ratelimit_bin, self.tmp, self.redis, grpc=self.service.grpc)

    def restart_redis(self) -> None:
        self.redis = Redis(port=self.redis.port)

    def stop(self) -> None:
        for p in reversed(self.procs()):
            p.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("globallimit"))
    yield f
    f.stop()


def tenant() -> str:
    """A tenant of its own per check: the service's counters start at zero for it."""
    return uuid.uuid4().hex


def windows(started: float, ended: float) -> int:
    """How many of the service's windows (aligned to the clock's minutes) a load touched."""
    return int(ended // WINDOW) - int(started // WINDOW) + 1


def spread(fleet: Fleet, path: str, who: str, per_node: int):
    """`per_node` requests to each node at once, each node on its own connection; the answers
    and how many service windows the whole took."""
    started = time.time()
    with ThreadPoolExecutor(NODES) as pool:
        answers = pool.map(lambda n: n.burst(path, who, per_node), fleet.nodes)
        answers = [a for node in answers for a in node]
    return answers, windows(started, time.time())


def is_global_refusal(a) -> bool:
    """A 429 of the global tier carries the service's fields (`RateLimit-Limit`); the local
    bucket's does not."""
    return a.status == 429 and "ratelimit-limit" in a.headers


def test_three_nodes_share_one_limit_and_the_local_tier_answers_first(fleet):
    before = [n.calls() for n in fleet.nodes]
    answers, touched = spread(fleet, "/tiers/", tenant(), per_node=100)
    admitted = sum(a.status == 200 for a in answers)
    global_refused = [a for a in answers if is_global_refusal(a)]
    local_refused = [a for a in answers if a.status == 429 and not is_global_refusal(a)]
    assert admitted + len(global_refused) + len(local_refused) == len(answers), \
        sorted({a.status for a in answers})
    # One limit for the fleet: without it each node would admit its local 40, 120 in all.
    assert LIMIT <= admitted <= LIMIT * touched, (admitted, touched, dump(*fleet.procs()))
    assert global_refused, "the fleet's limit refused nothing"
    for a in global_refused:
        assert int(a.headers["retry-after"]) >= 1, a.headers
        assert a.headers["ratelimit-limit"].startswith(str(LIMIT)), a.headers
    # The local tier refused on every node (40 each, then none), and no refusal of its made a
    # call: the calls counted by the nodes are the requests it let through, exactly.
    assert len(local_refused) >= NODES * (100 - 40) - NODES, len(local_refused)
    after = [n.calls() for n in fleet.nodes]
    calls = sum(a.get(("tiers", r), 0) - b.get(("tiers", r), 0)
                for a, b in zip(after, before) for r in ("ok", "over_limit"))
    failed = sum(a.get(("tiers", r), 0) - b.get(("tiers", r), 0)
                 for a, b in zip(after, before) for r in ("error", "timeout"))
    assert failed == 0, dump(*fleet.procs())
    assert calls == admitted + len(global_refused), (calls, admitted, len(global_refused))


def test_the_limit_counts_every_node_alike(fleet):
    """Each node alone is refused once the fleet's count is used up through another one."""
    for _ in range(3):
        who = tenant()
        started = time.time()
        used = sum(a.status == 200 for a in fleet.nodes[0].burst("/open/", who, LIMIT))
        after = [n.get("/open/", who) for n in fleet.nodes[1:]]
        # A check the service's minute turned in counted in two windows: again, in one.
        if windows(started, time.time()) == 1:
            break
    assert used == LIMIT
    assert [a.status for a in after] == [429] * (NODES - 1), after


def test_the_service_killed_fails_open_or_closed_as_configured(fleet):
    node = fleet.nodes[0]
    who = tenant()
    assert node.get("/open/", who).status == 200
    assert node.get("/closed/", who).status == 200
    fleet.service.proc.kill()
    try:
        opened = node.get("/open/", who)
        closed = node.get("/closed/", who)
        assert opened.status == 200, (opened, dump(node.proc))
        assert closed.status == 503, (closed, dump(node.proc))
        assert closed.headers.get("retry-after") == "1", closed.headers
        calls = node.calls()
        assert calls.get(("closed", "error"), 0) + calls.get(("closed", "timeout"), 0) >= 1, calls
    finally:
        fleet.restart_service()
    # Recovery: tonic dials the service again; the closed route answers as before.
    wait_for("the closed route to pass again", lambda: node.get("/closed/", who).status == 200)
    assert node.get("/open/", who).status == 200


def test_redis_restarted_under_the_service(fleet):
    node = fleet.nodes[1]
    who = tenant()
    assert node.get("/closed/", who).status == 200
    fleet.redis.proc.kill()
    try:
        closed = node.get("/closed/", who)
        opened = node.get("/open/", who)
        assert closed.status == 503, (closed, dump(fleet.service.proc, node.proc))
        assert opened.status == 200, opened
    finally:
        fleet.restart_redis()
    # The service's pool to Redis (10 connections) finds each broken one as it uses it:
    # recovered once more calls than that in a row pass.
    wait_for("the service to reach the restarted Redis",
             lambda: all(a.status == 200 for a in node.burst("/closed/", tenant(), 20)))
    # The limit holds again (a new Redis: counts from zero).
    answers, touched = spread(fleet, "/closed/", tenant(), per_node=30)
    admitted = sum(a.status == 200 for a in answers)
    assert LIMIT <= admitted <= LIMIT * touched, (admitted, touched)
    assert all(a.status in (200, 429) for a in answers), sorted({a.status for a in answers})
