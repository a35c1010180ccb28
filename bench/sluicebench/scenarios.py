"""The scenarios. Each starts the targets it needs (fresh processes, fresh ports, so one
scenario's TIME_WAIT sockets never count against the next), runs the load in rotated order
round after round, and returns plain data (lists of `Run`s as dicts) for the report."""

import dataclasses
import gzip
import json
import math
import os
import sys
import time
import urllib.request

from . import cache, globallimit, grpc, h2, http3, idle, load, multinode, targets, tls
from .procs import Group, established, peak_rss_kib, sample_proc
from .targets import Backend


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    targets: tuple
    concurrencies: tuple  # steady sweep
    headline_c: int  # the steady point with many rounds and the syscall pass
    headline_rounds: int
    sweep_rounds: int
    seconds: int  # per wrk run
    warmup: int  # seconds of wrk per target before each steady point (0: none)
    spike_levels: tuple  # offered load as multiples of declared capacity
    spike_seconds: float
    slow_clients: int
    slow_seconds: int
    ports_requests: int
    sizes: tuple
    size_rounds: int
    # nginx-module: the seed paper's concurrency sweep, all of it in every round.
    module_targets: tuple = targets.MODULE
    module_concurrencies: tuple = (1, 4, 16, 64, 256)
    module_rounds: int = 4
    module_seconds: int = 2
    module_syscalls_c: int = 16  # the concurrency of the syscall pass
    # idle: client connections held open and idle per target, and rounds.
    idle_connections: int = 10_000
    idle_rounds: int = 3


SMOKE_TARGETS = ("direct", "sluice-static", "sluice-reverse", "nginx-keepalive", "nginx",
                 "haproxy")
PROFILES = {
    "smoke": Profile("smoke", SMOKE_TARGETS, (16,), 16, 1, 1, 1, 0, (0.5, 2.0), 1.0, 20, 2,
                     2000, (1024,), 1, module_concurrencies=(4,), module_rounds=1,
                     module_seconds=1, module_syscalls_c=4, idle_connections=200,
                     idle_rounds=1),
    "quick": Profile("quick", targets.ALL, (1, 16, 64, 256), 64, 10, 1, 2, 1,
                     (0.5, 1.0, 2.0, 5.0, 10.0), 4.0, 500, 6, 100_000,
                     (1024, 65536, 1 << 20), 1, module_rounds=4, module_seconds=2),
    "full": Profile("full", targets.ALL, (1, 8, 16, 32, 64, 128, 256), 64, 15, 3, 3, 1,
                    (0.5, 1.0, 2.0, 5.0, 10.0), 10.0, 500, 10, 1_000_000,
                    (1024, 65536, 1 << 20), 3, module_rounds=8, module_seconds=3,
                    idle_rounds=5),
}

# The spike's service: 16 sessions (or a 16-connection limit) x 5 ms per request = 3200 rps,
# so that 10x (32k rps) stays within what one open-loop generator thread offers on time here
# (measured: 20-30k reliably, 40k usually, 60k never).
SPIKE_CAPACITY = 16
SPIKE_DELAY_MS = 5
SPIKE_BODY = "/"
# What each slow client fetches: 4 MiB, more than socket buffers hold, so a proxy that streams
# keeps its upstream connection (or session) until the client has read nearly all of it.
SLOW_BODY_BYTES = 4 << 20
SLOW_FAST_CONNECTIONS = 16
# How long the slow clients' start may take before wrk measures anyway, and how often the
# proxy's CPU is sampled to see that it is over (below 5% busy).
SLOW_SETTLE_MAX_S = 10.0
SLOW_SETTLE_STEP_S = 0.5


class Bench:
    """Shared state of one harness invocation: the profile, where logs go, progress output."""

    def __init__(self, profile, work_dir):
        self.p = profile
        self.work = work_dir
        self.started = time.monotonic()

    def say(self, text):
        print(f"[{time.monotonic() - self.started:6.0f} s] {text}", file=sys.stderr, flush=True)

    def targets(self, names, backend, gzip=False):
        """Starts `names` with `backend` (compressing with `gzip`); returns (group,
        {name: Target})."""
        group = Group(self.work)
        try:
            started = {}
            for name in names:
                started[name] = targets.start(group, self.work, name, backend, gzip)
            return group, started
        except BaseException:
            group.close()
            raise


def steady(b):
    """Closed-loop wrk at each concurrency; extra rounds and the syscall pass at the headline."""
    group, ts = b.targets(b.p.targets, Backend())
    out = {"points": {}, "syscalls": {}}
    try:
        for c in b.p.concurrencies:
            rounds = b.p.headline_rounds if c == b.p.headline_c else b.p.sweep_rounds
            if b.p.warmup:
                for t in ts.values():
                    load.wrk(t, c, seconds=b.p.warmup, measure=False)
            runs = out["points"][c] = {name: [] for name in ts}
            for r in range(rounds):
                for name in load.rotated(ts, r):
                    group.check_alive()
                    run = load.wrk(ts[name], c, seconds=b.p.seconds)
                    runs[name].append(dataclasses.asdict(run))
                    b.say(f"steady c={c} round {r + 1}/{rounds} {name:16} {run.rps:8.0f} rps  "
                          f"p99 {run.latency_us['p99']:7.0f} us  {_cpu(run)}  "
                          f"non-2xx+errors {run.non2xx + run.errors}"
                          f"{'  LOAD CPU BUSY' if run.load_saturated else ''}")
        for name, t in ts.items():
            per_req = load.syscalls_per_request(t, b.p.headline_c, b.p.seconds)
            out["syscalls"][name] = per_req
            if per_req is not None:
                b.say(f"syscalls c={b.p.headline_c} {name:16} {per_req:5.2f} per request")
    finally:
        group.close()
    return out


def _cpu(run):
    return (f"{run.cpu_us_per_req:5.1f} us CPU/req" if run.cpu_us_per_req is not None
            else "   (no proxy)")


def spike(b):
    """Open loop at multiples of a declared capacity, against proxies holding the service to it."""
    backend = Backend(delay_ms=SPIKE_DELAY_MS, capacity=SPIKE_CAPACITY)
    names = [n for n in targets.LIMITED if n in b.p.targets]
    group, ts = b.targets(names + ["direct"], backend)
    try:
        # The capacity in requests/s is measured, not computed: the backend's sleep overshoots
        # its nominal delay (timer granularity), so 16 x 5 ms gives less than 3200 rps.
        capacity_rps = load.wrk(ts.pop("direct"), SPIKE_CAPACITY, seconds=2, measure=False).rps
    except BaseException:
        group.close()
        raise
    b.say(f"spike: {SPIKE_CAPACITY} concurrent requests directly to the backend: "
          f"{capacity_rps:.0f} rps (the declared capacity)")
    out = {"capacity": SPIKE_CAPACITY, "delay_ms": SPIKE_DELAY_MS, "capacity_rps": capacity_rps,
           "queue_max": targets.QUEUE_MAX, "queue_timeout_s": targets.QUEUE_TIMEOUT_S,
           "levels": {}}
    try:
        for i, level in enumerate(b.p.spike_levels):
            runs = out["levels"][level] = {}
            for name in load.rotated(names, i):
                group.check_alive()
                run = load.openloop(ts[name], int(level * capacity_rps), b.p.spike_seconds,
                                    timeout_ms=(targets.QUEUE_TIMEOUT_S + 3) * 1000)
                runs[name] = dataclasses.asdict(run)
                b.say(f"spike {level:4}x {name:16} goodput {run.rps / capacity_rps:6.1%}  "
                      f"p99 ok {run.latency_us.get('p99', 0) / 1e3:7.1f} ms  "
                      f"max in service {run.extra['backend_max_in_flight']:3}  "
                      f"non-2xx {run.non2xx}  errors {run.errors}"
                      f"{'  GENERATOR LATE' if _generator_late(run) else ''}")
                time.sleep(0.5)  # let queues and timers settle before the next target
    finally:
        group.close()
    return out


def _settle(pid):
    """Waits until the slow clients' start is over: each response first flows at full speed
    until the socket buffers on its way are full. Returns what that start cost the proxy (CPU
    seconds, peak RSS) and how long it took, so that wrk then measures the slow clients' steady
    state rather than the start."""
    began = time.monotonic()
    first = sample_proc(pid) if pid else None
    time.sleep(1.0)  # the slow clients connect staggered over their first second
    last = sample_proc(pid) if pid else None
    while pid and time.monotonic() - began < SLOW_SETTLE_MAX_S:
        time.sleep(SLOW_SETTLE_STEP_S)
        now = sample_proc(pid)
        busy = (now.cpu_s - last.cpu_s) / SLOW_SETTLE_STEP_S
        last = now
        if busy < 0.05:
            break
    return {"seconds": time.monotonic() - began,
            "proxy_cpu_s": last.cpu_s - first.cpu_s if pid else 0.0,
            "peak_rss_mib": peak_rss_kib(pid) / 1024 if pid else 0.0}


def _generator_late(run):
    """The open-loop generator fell more than 10 ms behind its schedule: the offered load was
    not what the table says."""
    return run.extra["openloop"].get("max_lag_us", 0) > 10_000


def slow(b):
    """Slow readers (1 KiB/s) hold responses while fast wrk clients measure what is left."""
    # The A/A pairs add nothing here; with SLUICE_B, an A/B of the start's peak RSS does.
    second = () if targets.second_bin() else ("sluice-static-b", "sluice-reverse-b")
    names = [n for n in b.p.targets if n not in ("direct", "nginx") + second]
    group, ts = b.targets(names, Backend())
    out = {"clients": b.p.slow_clients, "body_bytes": SLOW_BODY_BYTES,
           "fast_connections": SLOW_FAST_CONNECTIONS, "targets": {}}
    try:
        for name in names:
            t = ts[name]
            group.check_alive()
            slow_proc = load.slowclients(t, b.p.slow_clients,
                                         SLOW_SETTLE_MAX_S + b.p.slow_seconds + 3,
                                         f"/?bytes={SLOW_BODY_BYTES}")
            start = _settle(t.pid)
            run = load.wrk(t, SLOW_FAST_CONNECTIONS, seconds=b.p.slow_seconds)
            # Upstream capacity the slow clients hold: open connections to a listening backend
            # (busy or pooled), or leased sessions.
            held = load.leased_sessions(t) if t.reverse else established(t.upstream_port)
            slow_proc.terminate()  # it reports what it counted and exits
            stdout, stderr = slow_proc.communicate(timeout=30)
            if slow_proc.returncode != 0:
                raise RuntimeError(f"slowclients failed against {name}: {stderr.strip()}")
            run.extra.update(slow=json.loads(stdout), upstream_held=held, start=start)
            out["targets"][name] = dataclasses.asdict(run)
            b.say(f"slow {name:16} fast p99 {run.latency_us['p99'] / 1e3:7.1f} ms  "
                  f"{run.rps:7.0f} rps  upstream conns/sessions held {held:4}  "
                  f"start: {start['proxy_cpu_s']:.2f} s CPU, peak RSS {start['peak_rss_mib']:.0f} MiB")
    finally:
        group.close()
    return out


def ports(b):
    """A fixed number of requests per target; new connections and TIME_WAIT they leave."""
    group, ts = b.targets(b.p.targets, Backend())
    out = {"requests": b.p.ports_requests, "connections": 64, "targets": {}}
    try:
        for name in b.p.targets:
            group.check_alive()
            # wrk stops counting at the limit but then idles out its -d: size -d from a
            # one-second probe of the target's rate so that little time is wasted.
            rate = load.wrk(ts[name], 64, seconds=1, measure=False).rps
            seconds = math.ceil(1.3 * b.p.ports_requests / max(rate, 1.0)) + 1
            run = load.wrk(ts[name], 64, seconds=seconds, requests=b.p.ports_requests)
            out["targets"][name] = dataclasses.asdict(run)
            b.say(f"ports {name:16} {run.requests} requests  new upstream conns "
                  f"{run.new_upstream_conns}  TIME_WAIT upstream {run.tw_upstream} "
                  f"client {run.tw_client}")
    finally:
        group.close()
    return out


def size(b):
    """Throughput in MB/s for response bodies of each size."""
    group, ts = b.targets(b.p.targets, Backend())
    out = {"sizes": {}, "connections": 16}
    try:
        for body in b.p.sizes:
            runs = out["sizes"][body] = {name: [] for name in ts}
            for r in range(b.p.size_rounds):
                for name in load.rotated(ts, r):
                    group.check_alive()
                    run = load.wrk(ts[name], 16, seconds=b.p.seconds, path=f"/?bytes={body}")
                    runs[name].append(dataclasses.asdict(run))
                    b.say(f"size {body:8} B round {r + 1}/{b.p.size_rounds} {name:16} "
                          f"{run.rps * body / 1e6:8.1f} MB/s  {_cpu(run)}")
    finally:
        group.close()
    return out


def size_gzip(b):
    """The size scenario with compression on: each target compresses with gzip at level 1
    (NGINX's default), the load asks for it (`Accept-Encoding: gzip`), and the bodies are JSON
    lines (`?text=1`) that compress as an API's do. CPU per request and bytes per response,
    side by side; each target's answer is checked to be gzip first."""
    names = [n for n in b.p.targets if n in targets.GZIP]
    if not names:
        raise RuntimeError(f"size-gzip: none of the targets compresses ({', '.join(targets.GZIP)})")
    group, ts = b.targets(names, Backend(), gzip=True)
    out = {"sizes": {}, "connections": 16, "encoded_bytes": {}}
    try:
        for body in b.p.sizes:
            path = f"/?bytes={body}&text=1"
            out["encoded_bytes"][body] = {n: _gzip_probe(t, path) for n, t in ts.items()}
            runs = out["sizes"][body] = {name: [] for name in ts}
            for r in range(b.p.size_rounds):
                for name in load.rotated(ts, r):
                    group.check_alive()
                    run = load.wrk(ts[name], 16, seconds=b.p.seconds, path=path,
                                   headers=("Accept-Encoding: gzip",))
                    runs[name].append(dataclasses.asdict(run))
                    b.say(f"size-gzip {body:8} B round {r + 1}/{b.p.size_rounds} {name:16} "
                          f"{run.rps:8.0f} rps  {_cpu(run)}  "
                          f"{run.bytes_read / max(run.requests, 1):9.0f} B/response")
    finally:
        group.close()
    return out


def _gzip_probe(t, path):
    """The gzip-encoded body's length of one answer from `t`, which must be gzip and decode to
    the size asked for."""
    req = urllib.request.Request(f"http://127.0.0.1:{t.port}{path}",
                                 headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as r:
        encoding, raw = r.headers.get("Content-Encoding"), r.read()
    asked = int(path.split("bytes=")[1].split("&")[0])
    if encoding != "gzip" or len(gzip.decompress(raw)) != asked:
        raise RuntimeError(f"size-gzip: {t.name} answered {encoding!r}, not gzip of {asked} B")
    return len(raw)


def nginx_module(b):
    """The seed paper's figures: RPS, time per request and the NGINX worker's context switches
    against concurrency, stock NGINX (without and with upstream keep-alive) against NGINX with
    ngx_http_sluice_module. Each round runs every concurrency, each concurrency every target in
    rotated order, so that each per-round ratio compares runs seconds apart."""
    group, ts = b.targets(b.p.module_targets, Backend())
    conc = b.p.module_concurrencies
    out = {"concurrencies": list(conc), "seconds": b.p.module_seconds,
           "load_average": {"start": os.getloadavg()}, "points": {}}
    try:
        if b.p.warmup:  # pools filled, pages faulted in
            for t in ts.values():
                load.wrk(t, max(conc), seconds=b.p.warmup, measure=False)
        for c in conc:
            out["points"][c] = {name: [] for name in ts}
        for r in range(b.p.module_rounds):
            for i, c in enumerate(conc):
                # Rotated by round and by concurrency: over rounds, each target runs at each
                # position at every concurrency.
                for name in load.rotated(ts, r + i):
                    group.check_alive()
                    run = load.wrk(ts[name], c, seconds=b.p.module_seconds)
                    out["points"][c][name].append(dataclasses.asdict(run))
                    b.say(f"nginx-module c={c} round {r + 1}/{b.p.module_rounds} {name:16} "
                          f"{run.rps:8.0f} rps  {_cpu(run)}  ctx/req vol "
                          f"{run.ctx_voluntary_per_req:.3f} invol {run.ctx_involuntary_per_req:.3f}"
                          f"  non-2xx+errors {run.non2xx + run.errors}"
                          f"{'  LOAD CPU BUSY' if run.load_saturated else ''}")
        c = out["syscalls_c"] = b.p.module_syscalls_c
        out["syscalls"] = {}
        for name, t in ts.items():
            out["syscalls"][name] = load.syscalls_per_request(t, c, b.p.module_seconds)
            b.say(f"syscalls c={c} {name:16} {out['syscalls'][name]:5.2f} per request")
    finally:
        out["load_average"]["end"] = os.getloadavg()
        group.close()
    return out


SCENARIOS = {"steady": steady, "spike": spike, "slow": slow, "ports": ports, "size": size,
             "size-gzip": size_gzip,
             "tls": tls.tls, "h2": h2.h2, "idle": idle.idle, "grpc": grpc.grpc,
             "nginx-module": nginx_module, "multinode": multinode.multinode,
             "global-limit": globallimit.global_limit, "http3": http3.http3, "cache": cache.cache}


def write_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.chmod(path, 0o644)
