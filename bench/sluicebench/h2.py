"""The HTTP/2 scenario: each proxy terminates TLS (ECDSA P-256, the tls scenario's certificate
and start-up) offering h2 by ALPN, and forwards over HTTP/1.1 keep-alive to its own plain
backend. The load is h2load (Debian's nghttp2-client): CONNECTIONS connections with STREAMS
concurrent streams each, rounds interleaved. What counts is the proxy's CPU per request, as a
ratio to NGINX's and HAProxy's in the same round. `sluice-h2-b` is a second, identical Sluice:
the A/A pair. `sluice-h2own` is Sluice with its own HTTP/2 transport (`own_http2 = true`); the
other two are on hyper's."""

import dataclasses
import re
import subprocess

from . import load, tls
from .procs import LOAD_CPU, Group, cpu_times, sample_proc

TARGETS = ("sluice-h2", "sluice-h2-b", "sluice-h2own", "nginx-h2", "haproxy-h2")
KEY = "ecdsa"
CONNECTIONS = 4
STREAMS = 100  # HAProxy's default tune.h2.max-concurrent-streams; NGINX's is 128, hyper's 200
WARMUP_S = 1
_UNITS_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


def h2load(target, seconds, path="/", args=(), protocol="h2"):
    """h2load for `seconds` after a warm-up, to `path` with `args` added (the gRPC scenario's
    body and headers), expecting `protocol` (h2 by ALPN, or h2c with prior knowledge): a `Run`
    with h2load's counts, and the proxy's CPU over the whole run (warm-up included) divided by
    the requests its backend served in it."""
    cmd = ["taskset", "-c", str(LOAD_CPU), "h2load", "-c", str(CONNECTIONS), "-m", str(STREAMS),
           "-D", str(seconds), f"--warm-up-time={WARMUP_S}", *args,
           f"{target.scheme}://127.0.0.1:{target.port}{path}"]
    stats = load.backend_stats(target)
    before, busy = sample_proc(target.pid), cpu_times(LOAD_CPU)
    backend = sample_proc(target.backend_pid) if target.backend_pid else None
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    after, busy_after = sample_proc(target.pid), cpu_times(LOAD_CPU)
    backend_after = sample_proc(target.backend_pid) if backend else None
    stats_after = load.backend_stats(target)
    served = stats_after["requests"] - stats["requests"]
    if done.returncode != 0:
        raise RuntimeError(f"h2load against {target.name} exited {done.returncode}: "
                           f"{done.stderr.strip()[-300:]}")
    run = parse_h2load(target.name, done.stdout, protocol)
    run.seconds = seconds  # h2load counts requests and req/s over the main duration only
    run.cpu_us_per_req = (after.cpu_s - before.cpu_s) * 1e6 / max(served, 1)
    run.load_cpu_busy = (busy_after[0] - busy[0]) / max(1, busy_after[1] - busy[1])
    run.extra["backend_requests"] = served
    if backend:  # it shares the load CPU: a proxy that costs it more lowers everyone's rps
        run.extra["backend_cpu_us_per_req"] = (backend_after.cpu_s - backend.cpu_s) * 1e6 / max(served, 1)
    # Dialing in, the backend accepts nothing: count the sessions it registered (re-dials).
    key = "registrations" if target.reverse else "connections"
    run.new_upstream_conns = stats_after[key] - stats[key]
    return run


def parse_h2load(name, out, protocol="h2"):
    run = load.Run(name)

    def find(pattern):
        m = re.search(pattern, out, re.M)
        if not m:
            raise RuntimeError(f"h2load against {name}: no match for {pattern!r} in its "
                               f"output:\n{out}")
        return m

    spoken = find(r"^Application protocol: (\S+)").group(1)
    if spoken != protocol:
        raise RuntimeError(f"h2load against {name}: it spoke {spoken}, not {protocol}")
    if protocol == "h2":
        run.extra["cipher"] = find(r"^Cipher: (\S+)").group(1)
    run.bytes_read = int(find(r"^traffic: .*\((\d+)\) data$").group(1))  # response bodies
    run.rps = float(find(r"^finished in [\d.]+m?s, ([\d.]+) req/s").group(1))
    counts = find(r"^requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed")
    run.requests, run.errors = int(counts.group(1)), int(counts.group(2))
    codes = find(r"^status codes: \d+ 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
    run.non2xx = sum(int(x) for x in codes.groups())
    latency = find(r"^time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)"
                   r"\s+([\d.]+)(us|ms|s)")
    run.latency_us = {"max": float(latency.group(3)) * _UNITS_US[latency.group(4)],
                      "mean": float(latency.group(5)) * _UNITS_US[latency.group(6)]}
    return run


def h2(b):
    """Rounds of every target in rotated order, one certificate, one set of processes."""

    rounds = max(2, b.p.headline_rounds // 2) if b.p.name != "smoke" else 1
    out = {"connections": CONNECTIONS, "streams": STREAMS, "rounds": rounds,
           "seconds": b.p.seconds, "warmup_s": WARMUP_S}
    group = Group(b.work)
    try:
        pem = tls._certificate(b.work, KEY)
        ts = {name: tls._start(group, b.work, name, pem, h2=True)[0] for name in TARGETS}
        runs = out["targets"] = {name: [] for name in ts}
        for r in range(rounds):
            for name in load.rotated(ts, r):
                group.check_alive()
                run = h2load(ts[name], b.p.seconds)
                runs[name].append(dataclasses.asdict(run))
                b.say(f"h2 round {r + 1}/{rounds} {name:12} {run.rps:8.0f} rps  "
                      f"{run.cpu_us_per_req:6.1f} us CPU/req  mean {run.latency_us['mean']:7.0f} us"
                      f"  errors {run.non2xx + run.errors}"
                      f"{'  LOAD CPU BUSY' if run.load_saturated else ''}")
    finally:
        group.close()
    return out
