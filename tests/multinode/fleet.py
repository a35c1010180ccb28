"""Several Sluice nodes behind one name, services that dial all of them, and an open-loop
client load skewed across the nodes: what the many-node test (tests/multinode) and the
`multinode` benchmark (bench/multinode) drive.

Everything here runs inside a network namespace of its own (`ip netns exec NS`), whose
`/etc/netns/NS/hosts` names the nodes `nodes.test` (127.0.0.2, .3, .4 on the namespace's own
loopback), so fixed ports are private to one run and `dns:nodes.test:PORT` resolves to every
node. `netns.py` creates and removes the namespace; this module never touches the host's
network.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

NODES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
NAME = "nodes.test"
LISTEN, ACCEPTOR, ADMIN = 18080, 17070, 19901
# Generous: a slow machine must not fail a correct run. Never a timing assertion.
WAIT = 60.0


def node_config(ip: str, clusters: list[str], queue_timeout: str = "10s",
                startup_wait: str = "10s") -> str:
    routes = "".join(
        f'[[route]]\nname = "{c}"\npath_prefix = "/{c}/"\ncluster = "{c}"\n' for c in clusters
    )
    cluster_tables = "".join(
        f'[cluster.{c}]\nkind = "reverse"\nqueue_max = 4096\nqueue_timeout = "{queue_timeout}"\n'
        f'startup_wait = "{startup_wait}"\n'
        for c in clusters
    )
    return (
        f'[runtime]\nshutdown_grace = "5s"\n'
        f'[acceptor]\nlisten = "{ip}:{ACCEPTOR}"\nhandshakes_per_second = 0\n'
        f'[admin]\nlisten = "{ip}:{ADMIN}"\n'
        f'[[listener]]\nname = "public"\nlisten = "{ip}:{LISTEN}"\n'
        f"{routes}{cluster_tables}"
    )


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def post(url: str, timeout: float = 5.0) -> str:
    req = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def wait_for(what: str, cond, timeout: float = WAIT, every: float = 0.05):
    """Polls `cond` until it is true (returns its value); fails after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except OSError as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@dataclass
class Node:
    ip: str
    config: Path
    sluice: str
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.config.with_suffix(".log"), "ab")
        self.proc = subprocess.Popen(
            [self.sluice, "--log-format", "json", "run", "-c", str(self.config)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )
        # Serving, not ready: a node is ready for clients once its services have found it
        # (each cluster holds a session) or its start-up window has passed.
        wait_for(f"node {self.ip} up", lambda: self._answers("/healthz"))

    def ready(self) -> bool:
        return self._answers("/ready")

    def _answers(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.ip}:{ADMIN}{path}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def drain(self) -> None:
        """`sluice ctl drain-node`'s request: /ready turns 503, clients should go elsewhere."""
        post(f"http://{self.ip}:{ADMIN}/drain")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def sessions(self, cluster: str) -> int:
        """Sessions registered for `cluster` here; 0 when the node is down."""
        try:
            status = get_json(f"http://{self.ip}:{ADMIN}/status", timeout=2)
        except OSError:
            return 0
        for c in status.get("clusters", []):
            if c["name"] == cluster:
                return sum(s.get("sessions", 0) for s in c.get("slices", []))
        return 0

    def busy(self) -> int:
        """Requests in flight or queued here, in every cluster (the node must be up)."""
        status = get_json(f"http://{self.ip}:{ADMIN}/status", timeout=2)
        return sum(s.get("in_flight", 0) + s.get("queued", 0)
                   for c in status.get("clusters", []) for s in c.get("slices", []))

    def instances(self, cluster: str) -> dict[str, int]:
        """Sessions registered here for `cluster`, by instance; empty when the node is down."""
        try:
            status = get_json(f"http://{self.ip}:{ADMIN}/status", timeout=2)
        except OSError:
            return {}
        for c in status.get("clusters", []):
            if c["name"] == cluster:
                return {i["id"]: i.get("sessions", 0) for i in c.get("instances") or []}
        return {}


@dataclass
class Service:
    """A service process dialing every node, with a local stats port: GET /max, POST
    /capacity?n=K (where the SDK's example offers it)."""

    name: str
    cluster: str
    argv: list[str]
    stats: str
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log: Path | None = None

    def start(self, logdir: Path) -> None:
        self.log = logdir / f"{self.name}.log"
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
        )
        wait_for(f"{self.name}'s stats port", lambda: self.max() is not None)

    def max(self) -> int | None:
        """The most requests its handler ever had at once."""
        try:
            with urllib.request.urlopen(f"http://{self.stats}/max", timeout=2) as r:
                return int(r.read().strip())
        except (OSError, ValueError):
            return None

    def set_capacity(self, n: int) -> None:
        post(f"http://{self.stats}/capacity?n={n}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Fleet:
    """Three nodes serving `clusters`, in the current network namespace."""

    def __init__(self, sluice: str, clusters: list[str], workdir: Path | None = None,
                 queue_timeout: str = "10s", startup_wait: str = "10s"):
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="fleet-"))
        self.nodes = []
        for i, ip in enumerate(NODES):
            config = self.dir / f"node{i}.toml"
            config.write_text(node_config(ip, clusters, queue_timeout, startup_wait))
            self.nodes.append(Node(ip, config, sluice))
        self.services: list[Service] = []

    def start(self) -> None:
        for n in self.nodes:
            n.start()

    def add(self, service: Service) -> Service:
        service.start(self.dir)
        self.services.append(service)
        return service

    def sessions(self, cluster: str) -> list[int]:
        return [n.sessions(cluster) for n in self.nodes]

    def instances(self, cluster: str) -> dict[str, list[int]]:
        """Each instance's sessions of `cluster` per node (what every SDK's split holds)."""
        per_node = [n.instances(cluster) for n in self.nodes]
        ids = sorted({i for at in per_node for i in at})
        return {i: [at.get(i, 0) for at in per_node] for i in ids}

    def stop(self) -> None:
        for s in self.services:
            s.stop()
        for n in self.nodes:
            n.stop()


class Sending:
    """The requests each node was chosen for and has not been written to yet, across the load
    threads. A choice of node and a change of the weights never interleave (one lock), so once
    `steer` has taken a node out and `unwritten` of it is 0, no request is on its way there:
    the node can be stopped then without a client's connection meeting its closed listener
    (which no node can answer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unwritten: Counter[str] = Counter()

    def choose(self, pick) -> str:
        with self._lock:
            ip = pick()
            self._unwritten[ip] += 1
            return ip

    def written(self, ip: str) -> None:
        with self._lock:
            self._unwritten[ip] -= 1

    def steer(self, change) -> None:
        with self._lock:
            change()

    def unwritten(self, ip: str) -> int:
        with self._lock:
            return self._unwritten[ip]


SENDING = Sending()


@dataclass
class Window:
    """What one second of load brought, per status."""

    sent: int = 0
    ok: int = 0
    refused: int = 0  # 503
    failed: int = 0  # any other status, or no answer


async def _request(ip: str, path: str, timeout: float) -> int:
    """One request on a connection of its own; its status (0: no answer). It counts as
    written (`SENDING`) once its bytes are sent, or it failed before."""
    try:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, LISTEN), timeout)
        except (OSError, asyncio.TimeoutError):
            return 0
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
        except OSError:
            writer.close()
            return 0
    finally:
        SENDING.written(ip)
    try:
        data = await asyncio.wait_for(reader.read(), timeout)
        line = data.split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) > 1 else 0
    except (OSError, asyncio.TimeoutError, ValueError):
        return 0
    finally:
        writer.close()


async def open_loop(
    cluster: str, rate: float, weights, seconds: float, timeout: float = 15.0, until=None,
) -> list[Window]:
    """Sends `rate` requests a second for `seconds` (or until `until()` is true, checked at
    every request), each to node i with probability `weights(t)[i]` (t: seconds since the
    start), without waiting for answers (open loop). Returns one window per second, by when
    each request was sent."""
    windows = [Window() for _ in range(int(seconds) + 1)]
    tasks = []
    start = time.monotonic()
    rng = __import__("random").Random(7)

    async def one(ip: str, w: Window) -> None:
        status = await _request(ip, f"/{cluster}/x", timeout)
        if status == 200:
            w.ok += 1
        elif status == 503:
            w.refused += 1
        else:
            w.failed += 1

    n = int(rate * seconds)
    for k in range(n):
        at = start + k / rate
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if until is not None and until():
            break
        t = at - start
        ip = SENDING.choose(lambda: rng.choices(NODES, weights=weights(t))[0])
        w = windows[int(t)]
        w.sent += 1
        tasks.append(asyncio.create_task(one(ip, w)))
    await asyncio.gather(*tasks)
    return windows
