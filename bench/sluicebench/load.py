"""Load generators and the counters read around each run.

Closed loop: wrk (`-t1`, pinned to the load CPU). Open loop (fixed offered rate, latency from
each request's scheduled time): `openloop`. Slow readers: `slowclients`. Syscalls per request
come from a separate pass under `perf stat -e raw_syscalls:sys_enter`, since tracing slows the
syscalls it counts.
"""

import json
import os
import re
import signal
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass, field

from .procs import LOAD_CPU, cpu_times, sample_proc, tcp_active_opens, time_wait
from .targets import binary

BUSY_FLAG = 0.95  # a run whose load CPU was this busy may have measured the load, not the proxy

_STOP_AFTER = """-- Stops wrk after a fixed number of responses (the ports scenario).
local limit = tonumber(os.getenv("BENCH_REQUESTS"))
local seen = 0
function response(status, headers, body)
  seen = seen + 1
  if seen >= limit then wrk.thread:stop() end
end
"""


@dataclass
class Run:
    """One load run against one target, with what the counters said about it."""

    target: str
    requests: int = 0
    seconds: float = 0.0
    rps: float = 0.0
    latency_us: dict = field(default_factory=dict)  # p50, p90, p99 (+ p999 open loop)
    non2xx: int = 0
    errors: int = 0
    cpu_us_per_req: float | None = None
    ctx_per_req: float | None = None  # voluntary + involuntary
    ctx_voluntary_per_req: float | None = None
    ctx_involuntary_per_req: float | None = None
    rss_kib: int | None = None
    new_upstream_conns: int = 0
    active_opens: int = 0  # every connect() on the machine during the run
    tw_upstream: tuple = (0, 0)  # TIME_WAIT added (backend side, proxy side)
    tw_client: tuple = (0, 0)  # TIME_WAIT added (proxy side, client side)
    load_cpu_busy: float = 0.0
    bytes_read: int = 0  # what wrk read: heads and bodies
    extra: dict = field(default_factory=dict)

    @property
    def load_saturated(self):
        return self.load_cpu_busy >= BUSY_FLAG


def backend_stats(target, reset=False):
    req = urllib.request.Request(f"http://127.0.0.1:{target.stats_port}/"
                                 f"{'reset' if reset else 'stats'}",
                                 method="POST" if reset else "GET")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read() or b"{}")


def leased_sessions(target):
    """Sessions of a Sluice reverse target that are leased right now (connected - idle), from
    its admin API's metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{target.admin_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = {"sluice_sessions": 0.0, "sluice_idle_sessions": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in total:
            total[name] += float(line.rsplit(" ", 1)[1])
    return int(total["sluice_sessions"] - total["sluice_idle_sessions"])


class Measured:
    """Counters before and after a load run; `finish` fills a `Run` with the differences."""

    def __init__(self, target):
        self.target = target
        backend_stats(target, reset=True)
        self.proc = sample_proc(target.pid) if target.pid else None
        # The other processes on the request path, each reported apart: key -> (pid, sample).
        self.others = {key: (pid, sample_proc(pid)) for key, pid in
                       (("helper_cpu_us_per_req", target.helper_pid),
                        ("backend_cpu_us_per_req", target.backend_pid)) if pid}
        self.cpu = cpu_times(LOAD_CPU)
        self.opens = tcp_active_opens()
        self.tw_up = time_wait(target.upstream_port)
        self.tw_client = time_wait(target.port)
        stats = backend_stats(target)
        self.accepted = stats.get("connections", 0)
        self.registrations = stats.get("registrations", 0)

    def finish(self, run):
        t = self.target
        stats = backend_stats(t)
        busy, total = cpu_times(LOAD_CPU)
        run.load_cpu_busy = (busy - self.cpu[0]) / max(1, total - self.cpu[1])
        run.active_opens = tcp_active_opens() - self.opens
        if not t.reverse:
            # Each connection the backend accepted is one the proxy opened to it.
            run.new_upstream_conns = stats.get("connections", 0) - self.accepted
        else:
            # Sessions dialed in during the run (re-registrations after the proxy closed one).
            run.new_upstream_conns = stats.get("registrations", 0) - self.registrations
        run.tw_upstream = _delta(time_wait(t.upstream_port), self.tw_up)
        run.tw_client = _delta(time_wait(t.port), self.tw_client)
        run.extra["backend_max_in_flight"] = stats.get("max_in_flight", 0)
        run.extra["backend_requests"] = stats.get("requests", 0)
        if self.proc:
            after = sample_proc(t.pid)
            n = max(run.requests, 1)
            run.cpu_us_per_req = (after.cpu_s - self.proc.cpu_s) * 1e6 / n
            run.ctx_per_req = (after.ctx_switches - self.proc.ctx_switches) / n
            run.ctx_voluntary_per_req = (after.voluntary - self.proc.voluntary) / n
            run.ctx_involuntary_per_req = (after.involuntary - self.proc.involuntary) / n
            run.rss_kib = after.rss_kib
        for key, (pid, before) in self.others.items():
            run.extra[key] = ((sample_proc(pid).cpu_s - before.cpu_s) * 1e6
                              / max(run.requests, 1))
        return run


def _delta(after, before):
    return tuple(max(0, a - b) for a, b in zip(after, before))


def wrk(target, connections, seconds=None, requests=None, path="/", measure=True, headers=(),
        script=None):
    """wrk -t1 against `target`: for `seconds`, or until `requests` responses (then `seconds`
    is only the upper bound); `headers` are added to every request ("Name: value"); `script`
    is a wrk Lua script (not with `requests`)."""
    cmd = ["taskset", "-c", str(LOAD_CPU), "wrk", "-t1", f"-c{connections}",
           f"-d{seconds or 600}s", "--latency", "--timeout", "10s"]
    for h in headers:
        cmd += ["-H", h]
    env = dict(os.environ)
    if script:
        cmd += ["-s", script]
        script = None  # not ours to remove
    if requests:
        script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
        script.write(_STOP_AFTER)
        script.close()
        cmd += ["-s", script.name]
        env["BENCH_REQUESTS"] = str(requests)  # wrk -t1: one thread counts them all
    cmd.append(f"{target.scheme}://127.0.0.1:{target.port}{path}")
    m = Measured(target) if measure else None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    finally:
        if script:
            os.unlink(script.name)
    run = parse_wrk(target.name, out)
    return m.finish(run) if m else run


def parse_wrk(name, out):
    run = Run(name)

    def find(pattern, flags=0):
        m = re.search(pattern, out, flags)
        if not m:
            raise RuntimeError(f"wrk against {name}: no match for {pattern!r} in its output:\n{out}")
        return m

    took = find(r"(\d+) requests in ([\d.]+)(ms|s|m), ([\d.]+)(B|KB|MB|GB|TB) read")
    run.requests = int(took.group(1))
    run.seconds = float(took.group(2)) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[took.group(3)]
    # wrk's units are binary, printed with two decimals: good to a fraction of a percent.
    scale = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
    run.bytes_read = int(float(took.group(4)) * scale[took.group(5)])
    run.rps = float(find(r"Requests/sec:\s+([\d.]+)").group(1))
    for pct in ("50", "90", "99"):
        m = find(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)", re.M)
        run.latency_us[f"p{pct}"] = float(m.group(1)) * {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 6e7}[m.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    run.non2xx = int(non2xx.group(1)) if non2xx else 0
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    run.errors = sum(int(x) for x in errors.groups()) if errors else 0
    return run


def openloop(target, rate, seconds, timeout_ms=5000, threads=1, path="/"):
    """A fixed offered rate for `seconds`; latency counts from each request's scheduled time."""
    cmd = ["taskset", "-c", str(LOAD_CPU), binary("openloop"),
           "--url", f"http://127.0.0.1:{target.port}{path}", "--rate", str(rate),
           "--duration", str(seconds), "--timeout-ms", str(timeout_ms),
           "--threads", str(threads), "--spin-us", "0"]  # it shares its CPU with the backend
    m = Measured(target)
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    run = Run(target.name)
    run.requests = out["completed"]
    run.seconds = seconds
    ok = out["status"].get("200", 0)
    # Goodput: answers complete within the window (a queue's backlog answered later is not
    # capacity the service had during it).
    run.rps = out["ok_in_window"] / seconds
    run.latency_us = out["latency_us_ok"]
    run.non2xx = out["completed"] - ok
    run.errors = sum(out["errors"].values()) + out["not_sent"]
    run.extra["openloop"] = out
    return m.finish(run)


def slowclients(target, clients, seconds, path):
    """Starts `clients` slow readers in the background; returns the process (stdout: JSON)."""
    cmd = ["taskset", "-c", str(LOAD_CPU), binary("slowclients"),
           "--url", f"http://127.0.0.1:{target.port}{path}", "--clients", str(clients),
           "--duration", str(seconds)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def syscalls_per_request(target, connections, seconds):
    """Syscalls the proxy makes per request, counted by perf's raw_syscalls tracepoint."""
    if not target.pid:
        return None
    perf = subprocess.Popen(["perf", "stat", "-x", ",", "-e", "raw_syscalls:sys_enter",
                             "-p", str(target.pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        run = wrk(target, connections, seconds=seconds, measure=False)
    finally:
        perf.send_signal(signal.SIGINT)
        _, err = perf.communicate(timeout=10)
    count = next((line.split(",")[0] for line in err.splitlines()
                  if "raw_syscalls:sys_enter" in line), "")
    if not count.isdigit():
        raise RuntimeError(f"perf stat gave no syscall count: {err.strip()[-300:]}")
    return int(count) / max(run.requests, 1)


def rotated(names, r):
    """`names` rotated by round `r`, so that each target takes each place in turn."""
    names = list(names)
    k = r % len(names)
    return names[k:] + names[:k]
