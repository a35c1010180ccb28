"""The many-node scenario, run inside the test's network namespace (`ip netns exec`): three
Sluice nodes named by `nodes.test`, a service in each SDK language dialing
`dns:nodes.test:PORT`, and client load skewed across the nodes while nodes die and come back,
capacities change and a node leaves the name. Prints what it saw as JSON on stdout for
`test_multinode.py` to judge; asserts nothing itself, except that each step's condition was
reached in time (a step that never converges fails the run with what it last saw)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import ACCEPTOR, NAME, NODES, SENDING, Fleet, Service, open_loop, wait_for  # noqa: E402
from netns import rewrite  # noqa: E402

N = 6
RATE = 240.0
# The rolling restart's load runs until the last node is back, at most this long.
ROLLING_LIMIT = 45.0
# The quiet steps: the sessions are sampled for a while once QUIET_SETTLE has passed since the
# load ended (the last responses, and a move the last demand asked for). After the two
# instances' skew, 15 s: the base commit's Go and Python SDKs moved 5 times in 15 s there, and
# not at all in the first 4 s.
QUIET_SETTLE, QUIET_SECONDS, QUIET_MIXED_SECONDS = 1.0, 4.0, 15.0


def settled(fleet: Fleet, s: Service, what: str, cond) -> list[int]:
    """The nodes' session counts for `s` once `cond` holds for two reads 0.3 s apart (fails
    after the wait's limit). A count read once can catch a session in passing: the SDK closes
    one before it dials its replacement, and the nodes are read one after another (seen once:
    capacity 2 read as 1 + 0 + 0 just after it had read 2)."""

    def steady():
        first = fleet.sessions(s.cluster)
        if not cond(first):
            return None
        time.sleep(0.3)
        return first if fleet.sessions(s.cluster) == first else None

    return wait_for(f"{s.name}: {what}", steady)


def quiet(read, seconds: float = QUIET_SECONDS) -> list:
    """What `read` says every 0.2 s for `seconds`, once QUIET_SETTLE has passed since the load
    ended: with no request anywhere, it must not change."""
    time.sleep(QUIET_SETTLE)
    samples, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(read())
        time.sleep(0.2)
    return samples


def mixed(args) -> list[Service]:
    """Two instances of one service, in two SDKs, of unequal capacity (the trial's FastAPI 6 +
    Go 4), 50 ms a request: together 10 sessions, 200 requests a second."""
    address = f"dns:{NAME}:{ACCEPTOR}"
    return [
        Service("mix-py", "mix",
                [*args.python.split(), "--acceptor", address, "--service", "mix",
                 "--instance", "mix-py", "--capacity", "6", "--stats", "127.0.0.1:19103"],
                "127.0.0.1:19103", env={"MULTINODE_DELAY": "0.05"}),
        Service("mix-go", "mix",
                [args.go, "-acceptor", address, "-service", "mix", "-instance", "mix-go",
                 "-capacity", "4", "-delay", "50ms", "-stats", "127.0.0.1:19104"],
                "127.0.0.1:19104"),
    ]


def services(args) -> list[Service]:
    address = f"dns:{NAME}:{ACCEPTOR}"
    out = [
        Service(
            "go", "go",
            [args.go, "-acceptor", address, "-service", "go", "-instance", "go-1",
             "-capacity", str(N), "-delay", "20ms", "-stats", "127.0.0.1:19100"],
            "127.0.0.1:19100",
        )
    ]
    if args.python:
        out.append(Service(
            "python", "py",
            [*args.python.split(), "--acceptor", address, "--service", "py",
             "--instance", "py-1", "--capacity", str(N), "--stats", "127.0.0.1:19101"],
            "127.0.0.1:19101", env={"MULTINODE_DELAY": "0.02"},
        ))
    if args.rust:
        out.append(Service(
            "rust", "rs",
            [args.rust, "--acceptor", address, "--service", "rs", "--instance", "rs-1",
             "--capacity", str(N), "--delay-ms", "20", "--stats", "127.0.0.1:19102"],
            "127.0.0.1:19102",
        ))
    return out


class Sampler:
    """Samples every service's sessions per node while a step runs."""

    def __init__(self, fleet: Fleet):
        self.fleet, self.samples, self._stop = fleet, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.samples.append({s.cluster: self.fleet.sessions(s.cluster) for s in self.fleet.services})
            time.sleep(0.2)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.samples


def load(cluster: str, weights, seconds: float, rate: float = RATE, until=None):
    return asyncio.run(open_loop(cluster, rate, weights, seconds, until=until))


def loads(fleet: Fleet, weights, seconds: float, rate: float = RATE, until=None) -> dict:
    """The same load on every service at once; each window's counts by service."""
    results = {}

    def run(cluster):
        results[cluster] = load(cluster, weights, seconds, rate, until)

    threads = [threading.Thread(target=run, args=(s.cluster,)) for s in fleet.services]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {c: [w.__dict__ for w in ws] for c, ws in results.items()}


def rolling(fleet: Fleet) -> dict:
    """A rolling restart under load: each node in turn is drained (`sluice ctl drain-node`:
    clients leave it, as a Service's endpoints would), stopped (SIGTERM) at once, with the
    requests sent to it still in flight or queued there (issue 46: the services closed their
    sessions at its DRAINING, so the queued ones were refused), started, and taken back once
    it says ready. No request may fail. The only wait before the SIGTERM is for the requests
    already on their way to the node to be written to it: a connection that meets a closed
    listener is no node's to answer."""
    serving = [True, True, True]
    done = threading.Event()
    sampler = Sampler(fleet)
    result = {}
    t = threading.Thread(target=lambda: result.update(loads(
        fleet, lambda t: [1 if up else 0 for up in serving], ROLLING_LIMIT, until=done.is_set)))
    t.start()
    began = time.monotonic()
    events = []
    try:
        for i, node in enumerate(fleet.nodes):
            time.sleep(1.0)
            node.drain()
            SENDING.steer(lambda i=i: serving.__setitem__(i, False))
            wait_for(f"the requests to node {i} written", lambda: SENDING.unwritten(NODES[i]) == 0,
                     every=0.005)
            events.append((round(time.monotonic() - began, 2), f"node {i} stopping",
                           {"busy": node.busy()}))
            node.stop()
            events.append((round(time.monotonic() - began, 2), f"node {i} stopped"))
            node.start()
            events.append((round(time.monotonic() - began, 2), f"node {i} started"))
            wait_for(f"node {i} ready again", node.ready)
            events.append((round(time.monotonic() - began, 2), f"node {i} ready",
                           {s.cluster: s.max() for s in fleet.services}))
            SENDING.steer(lambda i=i: serving.__setitem__(i, True))
        time.sleep(1.0)
    finally:
        done.set()
        t.join()
    return {"windows": result, "samples": sampler.stop(), "events": events}


def two_instances(fleet: Fleet, mix: list[Service]) -> dict:
    """Two instances of one service (6 + 4) under an 80/10/10 skew at 0.8 of what their 10
    sessions serve: the floor of one session per node is the service's, not each instance's,
    so the busy node holds enough. Judged on the last 6 s, once settled; every instance's
    sessions per node are sampled (each SDK's split as the nodes see it)."""
    wait_for("mix: 10 sessions over 3 nodes", lambda: sum(fleet.sessions("mix")) == 10)
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            samples.append(fleet.instances("mix"))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        windows = load("mix", lambda t: [8, 1, 1], 14.0, rate=160.0)
    finally:
        stop.set()
        sampler.join()
    return {"windows": [w.__dict__ for w in windows], "end": fleet.sessions("mix"),
            "instances": samples, "max": {s.name: s.max() for s in mix}}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sluice", required=True)
    p.add_argument("--go", required=True)
    p.add_argument("--python", default="")
    p.add_argument("--rust", default="")
    p.add_argument("--hosts", required=True)
    a = p.parse_args()
    # The default start-up window (10 s). Every cluster a node routes has its services from the
    # start: a restarted node is ready once each holds a session there, and a cluster that no
    # service serves would keep it unready for the whole window (issue 46's rolling restart
    # once waited out 30 s so, on the two instances' cluster, started last).
    fleet = Fleet(a.sluice, [s.cluster for s in services(a)] + ["mix"])
    seen: dict = {"steps": {}}
    mix = mixed(a)
    try:
        fleet.start()
        for s in services(a):
            fleet.add(s)
        for s in mix:
            s.start(fleet.dir)
        seen["steps"]["start"] = {
            s.cluster: settled(fleet, s, f"{N} sessions over 3 nodes",
                               lambda v: sum(v) == N and min(v) >= 1)
            for s in fleet.services}

        # Skew to node 0, then flip to node 2: the sessions follow the queue.
        for step, weights, busiest in (("skew", [8, 1, 1], 0), ("flip", [1, 1, 8], 2)):
            sampler = Sampler(fleet)
            windows = loads(fleet, lambda t, w=weights: w, 8.0)
            samples = sampler.stop()
            seen["steps"][step] = {"windows": windows, "samples": samples,
                                   "end": {s.cluster: fleet.sessions(s.cluster) for s in fleet.services},
                                   "busiest": busiest}

        # Quiet after the flip: once the last requests are answered no node reports demand, and
        # no SDK moves a session (each moved one about once a second, by the tails of the
        # smoothed demand, before the split read quiet from the samples).
        seen["steps"]["quiet"] = {"samples": quiet(
            lambda: {s.cluster: fleet.sessions(s.cluster) for s in fleet.services})}

        # A node dies under load and comes back: its share moves, then returns in part.
        killed = fleet.nodes[1]
        sampler = Sampler(fleet)
        result = {}
        t = threading.Thread(target=lambda: result.update(loads(fleet, lambda t: [1, 0, 1], 6.0)))
        t.start()
        time.sleep(1.0)
        killed.kill()
        killed_at = time.monotonic()
        moved_after = {}
        for s in fleet.services:
            wait_for(f"{s.name}: its share moved off the dead node",
                     lambda s=s: (lambda v: v[0] + v[2] == N)(fleet.sessions(s.cluster)),
                     every=0.02)
            moved_after[s.cluster] = time.monotonic() - killed_at
        t.join()
        # Restarted, it says ready only once every service has a session there; from then on
        # no client request it takes is refused for want of one.
        killed.start()
        wait_for("the restarted node says ready", killed.ready)
        joined = {s.cluster: fleet.sessions(s.cluster)[1] for s in fleet.services}
        restarted = loads(fleet, lambda t: [0, 1, 0], 3.0, rate=60.0)
        seen["steps"]["kill"] = {"windows": result, "samples": sampler.stop(),
                                 "moved_after": moved_after, "joined_when_ready": joined,
                                 "restarted": restarted}

        seen["steps"]["rolling"] = rolling(fleet)

        # Capacity shrinks and grows at runtime (where the example offers it).
        changed = {}
        for s in fleet.services:
            try:
                s.set_capacity(2)
            except OSError:
                continue
            low = settled(fleet, s, "capacity 2", lambda v: sum(v) == 2)
            s.set_capacity(N)
            high = settled(fleet, s, f"capacity {N}", lambda v: sum(v) == N)
            changed[s.cluster] = {"at_2": low, "at_n": high}
        seen["steps"]["capacity"] = changed

        seen["steps"]["mixed"] = two_instances(fleet, mix)
        # Quiet again, two instances of one service: each one's moves change what the nodes
        # report to the other's links, the cadence that swung the tails of the demand.
        seen["steps"]["mixed_quiet"] = {
            "samples": quiet(lambda: fleet.instances("mix"), QUIET_MIXED_SECONDS)}

        # Node 2 leaves the name: drained while clients use nodes 0 and 1.
        rewrite(Path(a.hosts), NODES[:2])
        sampler = Sampler(fleet)
        result = {}
        t = threading.Thread(target=lambda: result.update(loads(fleet, lambda t: [1, 1, 0], 6.0)))
        t.start()
        for s in fleet.services:
            wait_for(f"{s.name}: node 2 drained", lambda s=s: fleet.sessions(s.cluster)[2] == 0)
        t.join()
        # The share moves as sessions end and others are dialed: a node may still count a
        # session the service has closed (seen once: 4 + 3 + 0 on a loaded machine). The end
        # is read once the nodes agree with the service, which must happen within the wait.
        end = {s.cluster: settled(fleet, s, f"{N} sessions on nodes 0 and 1",
                                  lambda at: at[2] == 0 and sum(at) == N)
               for s in fleet.services}
        seen["steps"]["leave"] = {"windows": result, "samples": sampler.stop(), "end": end}
        seen["max_in_flight"] = {s.cluster: s.max() for s in fleet.services}
        seen["capacity"] = N
        print(json.dumps(seen))
        return 0
    except AssertionError as e:
        seen["error"] = str(e)
        seen["logs"] = {p.name: p.read_text()[-4000:] for p in fleet.dir.glob("*.log")}
        print(json.dumps(seen))
        return 1
    finally:
        for s in mix:
            s.stop()
        fleet.stop()
        # The logs stay when a step failed, or when asked (MULTINODE_KEEP=1).
        if "error" not in seen and not os.environ.get("MULTINODE_KEEP"):
            shutil.rmtree(fleet.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
