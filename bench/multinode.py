"""The `multinode` benchmark (issue 27), run inside a network namespace of its own by
`bench/run` (or by hand: `bench/run --quick --only multinode`): three Sluice nodes behind
`nodes.test`, one service instance that declares N sessions with a fixed service time, and an
open-loop client load at 1.25x the declared capacity (N / service time), skewed 80/10/10 across
the nodes and then flipped to 10/10/80.

Two ways to hold the same N, one after the other on fresh processes:
* split by demand: one instance dialing `dns:nodes.test:PORT` (the SDK splits N by demand);
* an even static split: three instances of N/3 (5, 5, 6 for 16), each dialing one node.

Reported per way: goodput as a fraction of the declared capacity over the skew (after its first
second) and over the flip, the time from the flip to goodput back at 95 % of capacity (500 ms
bins, sustained), the time from the flip until the node now busiest holds the most sessions,
the most requests the service ever had in flight (must be <= N), and the 503s. Prints JSON."""

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


def run_way(args, way: str) -> dict:
    # The default queue_timeout (2 s): a backlog older than that is answered 503, as it would
    # be in production, instead of holding sessions at the node the load left.
    fleet = Fleet(args.sluice, ["bench"], queue_timeout="2s")
    n, service_s = args.capacity, args.service_ms / 1000
    capacity = n / service_s
    try:
        fleet.start()
        if way == "demand":
            shares = [(f"dns:{NAME}:{ACCEPTOR}", n)]
        else:
            shares = [(f"{ip}:{ACCEPTOR}", n // 3 + (1 if i < n % 3 else 0))
                      for i, ip in enumerate(NODES)]
        for i, (address, k) in enumerate(shares):
            fleet.add(Service(
                f"{way}-{i}", "bench",
                [args.go, "-acceptor", address, "-service", "bench", "-instance", f"{way}-{i}",
                 "-capacity", str(k), "-delay", f"{args.service_ms}ms",
                 "-stats", f"127.0.0.1:{19200 + i}"],
                f"127.0.0.1:{19200 + i}",
            ))
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
        most = max(s.max() or 0 for s in fleet.services)
        moved = next((t - flip for t, v in samples if t >= flip and v[2] == max(v) and v[2] > v[0]), None)
        return {
            "way": way,
            "capacity_rps": capacity,
            "offered_rps": rate,
            "goodput_skew": goodput(records, 1.0, flip) / capacity,
            "goodput_flip": goodput(records, flip, end) / capacity,
            "recovery_s": recovery(records, flip, end, capacity),
            "sessions_moved_s": moved,
            "max_in_flight": most,
            "declared": n,
            "refused_503": sum(1 for r in records if r[2] == 503),
            "failed": sum(1 for r in records if r[2] not in (200, 503)),
            "requests": len(records),
        }
    finally:
        fleet.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sluice", required=True)
    p.add_argument("--go", required=True)
    p.add_argument("--capacity", type=int, default=16)
    p.add_argument("--service-ms", type=int, default=50)
    p.add_argument("--phase", type=float, default=10.0, help="seconds of skew, then of flip")
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args()
    rounds = []
    for r in range(a.rounds):
        ways = ("demand", "static") if r % 2 == 0 else ("static", "demand")
        rounds.append({w: run_way(a, w) for w in ways})
    print(json.dumps({"rounds": rounds, "capacity": a.capacity, "service_ms": a.service_ms,
                      "phase_s": a.phase}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
