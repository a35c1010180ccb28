"""The `multinode` benchmark (issues 27 and 46), run inside a network namespace of its own by
`bench/run` (or by hand: `bench/run --quick --only multinode`): three Sluice nodes behind
`nodes.test`, service instances that declare N sessions in all with a fixed service time, and an
open-loop client load at 1.25x the declared capacity (N / service time), skewed 80/10/10 across
the nodes and then flipped to 10/10/80.

Ways to hold the same N, one after the other on fresh processes:
* `demand`: one Go instance dialing `dns:nodes.test:PORT` (the SDK splits N by demand), and
  `demand-b`, the same again (A/A: the noise floor of every ratio to `demand`);
* `demand-python`, `demand-rust`: the same with the Python and the Rust SDK's instance;
* `instances-go`, `instances-python`, `instances-rust`: two instances of one service in that
  SDK, of unequal capacity (10 + 6 of 16): the floor of a session per node is the service's;
* `static`: an even static split, three Go instances of N/3 (5, 5, 6 for 16), each dialing
  one node (the comparator).

Reported per way: goodput as a fraction of the declared capacity over the skew (after its first
second) and over the flip, the time from the flip to goodput back at 95 % of capacity (500 ms
bins, sustained), the time from the flip until the node now busiest holds the most sessions,
the most requests the service ever had in flight (must be <= N), and the 503s.

Then a rolling restart (`--rolling`): tests/multinode's step, one service per SDK at once (N 6,
20 ms, 240 requests a second each, 0.8 of capacity, spread over the nodes that serve): each node
in turn drained, SIGTERMed at once with what was sent to it queued there, started again and
taken back once ready. Reported per SDK: requests, failed (not 200), 503s. Prints JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "multinode"))

import scenario  # noqa: E402  (tests/multinode: the rolling restart's step)
from fleet import ACCEPTOR, LISTEN, NAME, NODES, Fleet, Service, wait_for  # noqa: E402

OVERLOAD = 1.25
BIN = 0.5


async def _one(ip: str, timeout: float) -> int:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, LISTEN), timeout)
    except (OSError, asyncio.TimeoutError):
        return 0
    try:
        writer.write(f"GET /bench/x HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.read(), timeout)
        parts = head.split(b"\r\n", 1)[0].split()
        return int(parts[1]) if len(parts) > 1 else 0
    except (OSError, asyncio.TimeoutError, ValueError):
        return 0
    finally:
        writer.close()


async def load(rate: float, phases: list[tuple[float, list[int]]], timeout: float = 20.0):
    """Open loop: `rate` requests a second through `phases` of (seconds, weights by node).
    Returns (sent_at, done_at, status) for every request, times from the start."""
    rng = random.Random(11)
    records, tasks = [], []
    start = time.monotonic()

    async def one(ip: str, sent: float) -> None:
        status = await _one(ip, timeout)
        records.append((sent, time.monotonic() - start, status))

    t0 = 0.0
    for seconds, weights in phases:
        n = int(rate * seconds)
        for k in range(n):
            at = t0 + k / rate
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            ip = rng.choices(NODES, weights=weights)[0]
            tasks.append(asyncio.create_task(one(ip, at)))
        t0 += seconds
    await asyncio.gather(*tasks)
    return records


def goodput(records, start: float, end: float) -> float:
    done = sum(1 for _, d, s in records if s == 200 and start <= d < end)
    return done / (end - start)


def recovery(records, flip: float, end: float, capacity: float) -> float | None:
    """Seconds from the flip to the end of the first two bins in a row (1 s) whose goodput is
    at least 95 % of capacity; `None` if it never is."""
    bins = []
    t = flip
    while t + BIN <= end:
        bins.append((t, goodput(records, t, t + BIN)))
        t += BIN
    for (at, g), (_, h) in zip(bins, bins[1:]):
        if min(g, h) >= 0.95 * capacity:
            return at + 2 * BIN - flip
    return None


# Each way's SDK and the capacities of its instances (None: the static split, one per node).
SPLIT_BY = {"demand": "go", "demand-b": "go", "demand-python": "python", "demand-rust": "rust",
            "instances-go": "go", "instances-python": "python", "instances-rust": "rust",
            "static": "go"}


def shares(way: str, n: int) -> list[tuple[str, int]]:
    """(acceptor address, capacity) of each instance the way runs."""
    if way == "static":
        return [(f"{ip}:{ACCEPTOR}", n // 3 + (1 if i < n % 3 else 0)) for i, ip in enumerate(NODES)]
    if way.startswith("instances-"):
        big = (n * 5 + 7) // 8  # 10 of 16
        return [(f"dns:{NAME}:{ACCEPTOR}", big), (f"dns:{NAME}:{ACCEPTOR}", n - big)]
    return [(f"dns:{NAME}:{ACCEPTOR}", n)]


def instance(args, sdk: str, address: str, name: str, capacity: int, stats: str) -> Service:
    """One instance of the `bench` service in `sdk`'s multinode example."""
    if sdk == "python":
        return Service(name, "bench",
                       [*args.python.split(), "--acceptor", address, "--service", "bench",
                        "--instance", name, "--capacity", str(capacity), "--stats", stats],
                       stats, env={"MULTINODE_DELAY": str(args.service_ms / 1000)})
    if sdk == "rust":
        return Service(name, "bench",
                       [args.rust, "--acceptor", address, "--service", "bench", "--instance", name,
                        "--capacity", str(capacity), "--delay-ms", str(args.service_ms),
                        "--stats", stats], stats)
    return Service(name, "bench",
                   [args.go, "-acceptor", address, "-service", "bench", "-instance", name,
                    "-capacity", str(capacity), "-delay", f"{args.service_ms}ms", "-stats", stats],
                   stats)


def ways(args) -> list[str]:
    """The ways this run can run: an SDK's only where its example was given."""
    given = {"go": True, "python": bool(args.python), "rust": bool(args.rust)}
    return [w for w, sdk in SPLIT_BY.items() if given[sdk]]


def run_way(args, way: str) -> dict:
    # The default queue_timeout (2 s): a backlog older than that is answered 503, as it would
    # be in production, instead of holding sessions at the node the load left.
    fleet = Fleet(args.sluice, ["bench"], queue_timeout="2s")
    n, service_s = args.capacity, args.service_ms / 1000
    capacity = n / service_s
    try:
        fleet.start()
        for i, (address, k) in enumerate(shares(way, n)):
            stats = f"127.0.0.1:{19200 + i}"
            fleet.add(instance(args, SPLIT_BY[way], address, f"{way}-{i}", k, stats))
        wait_for("every session registered", lambda: sum(fleet.sessions("bench")) == n)
        samples, stop = [], threading.Event()

        def sample():
            t0 = time.monotonic()
            while not stop.is_set():
                samples.append((time.monotonic() - t0, fleet.sessions("bench")))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rate = OVERLOAD * capacity
        phases = [(args.phase, [8, 1, 1]), (args.phase, [1, 1, 8])]
        records = asyncio.run(load(rate, phases))
        stop.set()
        sampler.join()
        flip, end = args.phase, 2 * args.phase
        # Each instance's own most against its own capacity; the sum bounds the service's.
        each = [s.max() or 0 for s in fleet.services]
        declared = [k for _, k in shares(way, n)]
        moved = next((t - flip for t, v in samples if t >= flip and v[2] == max(v) and v[2] > v[0]), None)
        return {
            "way": way,
            "sdk": SPLIT_BY[way],
            "instances": declared,
            "capacity_rps": capacity,
            "offered_rps": rate,
            "goodput_skew": goodput(records, 1.0, flip) / capacity,
            "goodput_flip": goodput(records, flip, end) / capacity,
            "recovery_s": recovery(records, flip, end, capacity),
            "sessions_moved_s": moved,
            "max_in_flight": sum(each),
            "max_in_flight_each": each,
            "over_declared": sum(1 for m, k in zip(each, declared) if m > k),
            "declared": n,
            "refused_503": sum(1 for r in records if r[2] == 503),
            "failed": sum(1 for r in records if r[2] not in (200, 503)),
            "requests": len(records),
        }
    finally:
        fleet.stop()


def rolling(args) -> dict:
    """tests/multinode's rolling restart, one service per SDK given: per SDK its requests,
    those not answered 200, the 503s among them, and the most in flight against its N."""
    services = scenario.services(args)
    # Only the clusters served: one without a service keeps a restarted node unready for its
    # whole start-up window.
    fleet = Fleet(args.sluice, [s.cluster for s in services])
    try:
        fleet.start()
        for s in services:
            fleet.add(s)
        for s in fleet.services:
            wait_for(f"{s.name}: {scenario.N} sessions on 3 nodes",
                     lambda s=s: (lambda v: sum(v) == scenario.N and min(v) >= 1)(fleet.sessions(s.cluster)))
        began = time.monotonic()
        seen = scenario.rolling(fleet)
        took = time.monotonic() - began
        out = {}
        for s in fleet.services:
            windows = seen["windows"][s.cluster]
            sent = sum(w["sent"] for w in windows)
            ok = sum(w["ok"] for w in windows)
            refused = sum(w.get("refused", 0) for w in windows)
            out[s.name] = {"requests": sent, "failed": sent - ok, "refused_503": refused,
                           "max_in_flight": s.max(), "declared": scenario.N}
        return {"seconds": round(took, 1), "rate": scenario.RATE, "sdks": out,
                "events": seen["events"]}
    finally:
        fleet.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sluice", required=True)
    p.add_argument("--go", required=True)
    p.add_argument("--python", default="", help="the Python example's command (none: not run)")
    p.add_argument("--rust", default="", help="the Rust example (none: not run)")
    p.add_argument("--capacity", type=int, default=16)
    p.add_argument("--service-ms", type=int, default=50)
    p.add_argument("--phase", type=float, default=10.0, help="seconds of skew, then of flip")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--rolling", action="store_true", help="then a rolling restart under load")
    a = p.parse_args()
    rounds = []
    order = ways(a)
    for r in range(a.rounds):
        rounds.append({w: run_way(a, w) for w in (order if r % 2 == 0 else order[::-1])})
    out = {"rounds": rounds, "capacity": a.capacity, "service_ms": a.service_ms, "phase_s": a.phase}
    if a.rolling:
        out["rolling"] = rolling(a)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
