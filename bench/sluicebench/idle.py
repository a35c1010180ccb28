"""The idle scenario: memory per idle keep-alive client connection. Each proxy (one worker, on
CPU 1, in front of its own plain keep-alive backend) is given CONNECTIONS client connections,
each after one request, which then stay open and idle (`idleclients.py` on the load CPU:
plain HTTP/1.1, HTTP/1.1 over TLS, HTTP/2 over TLS by ALPN). What counts is the proxy's resident
set (VmRSS) before, with the connections open and after they close:

  per connection = (with - before) / CONNECTIONS
  returned       = (with - after) / (with - before)

"before" is taken after a warm-up of WARMUP connections opened and closed the same way, so
that pools, caches and the allocator's first pages are in both. Fresh processes every round
and every mode, targets rotated. `sluice` is Sluice's default (the fast path serves HTTP/1.1),
`sluice-hyper` the same with `fast_path = false`; with SLUICE_B set, `sluice-b` and
`sluice-hyper-b` run that binary too (before/after in the same rounds)."""

import json
import os
import resource
import subprocess
import sys
import time

from . import targets, tls
from .procs import LOAD_CPU, PROXY_CPU, Group, free_port, only_child, wait_port
from .targets import Backend, Target

# SLUICE_BENCH_IDLE_MODES=h2 (a comma-separated subset) measures only those: an HTTP/2 change
# need not wait for the plain and TLS rounds.
MODES = tuple(m for m in os.environ.get("SLUICE_BENCH_IDLE_MODES", "plain,tls,h2").split(",")
              if m in ("plain", "tls", "h2"))
# `sluice-h2own` (HTTP/2 only) has its own HTTP/2 transport on (`own_http2`).
PROXIES = ("sluice", "sluice-hyper", "sluice-h2own", "nginx", "haproxy")
WARMUP = 256
# Every timeout that would close an idle connection (Sluice's header timeout is also its
# keep-alive wait, 10 s by default) is set well above how long a round holds them.
IDLE_TIMEOUT_S = 300
SETTLE_S = 1.0  # after the last connection opened / closed, before RSS is read
CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "idleclients.py")


def names():
    second = ("sluice-b", "sluice-hyper-b") if targets.second_bin() else ()
    return PROXIES + second


def idle(b):
    n, rounds = b.p.idle_connections, b.p.idle_rounds
    _raise_nofile(n + 4096)
    out = {"connections": n, "warmup": WARMUP, "rounds": rounds, "modes": {}}
    pem = tls._certificate(b.work, "ecdsa")
    for mode in MODES:
        ts = [t for t in names() if not (mode == "h2" and "hyper" in t)
              and not (mode != "h2" and "h2own" in t)]
        runs = out["modes"][mode] = {t: [] for t in ts}
        for r in range(rounds):
            for name in ts[r % len(ts):] + ts[:r % len(ts)]:
                run = _round(b, name, mode, pem, n)
                runs[name].append(run)
                b.say(f"idle {mode:5} round {r + 1}/{rounds} {name:14} "
                      f"{run['per_conn_kib']:6.2f} KiB/conn  returned {run['returned']:5.0%}  "
                      f"peak {run['peak_mib']:6.1f} MiB  failed {run['failed']}")
    return out


def _round(b, name, mode, pem, n):
    """One target, fresh: warm-up, then `n` idle connections; RSS around them."""
    group = Group(b.work)
    try:
        t = _start(group, b.work, name, mode, pem, n)
        _hold(t, mode, pem, WARMUP, lambda: None)
        time.sleep(SETTLE_S)
        before = _rss_kib(t.pid)
        held = {}
        opened = _hold(t, mode, pem, n, lambda: held.update(rss=_rss_kib(t.pid)))
        time.sleep(SETTLE_S)
        after = _rss_kib(t.pid)
        group.check_alive()
        grown = held["rss"] - before
        return {"target": name, "before_kib": before, "with_kib": held["rss"],
                "after_kib": after, "open": opened["open"], "failed": opened["failed"],
                "open_seconds": opened["seconds"], "per_conn_kib": grown / n,
                "returned": (held["rss"] - after) / grown if grown > 0 else 0.0,
                "peak_mib": _peak_kib(t.pid) / 1024}
    finally:
        group.close()


def _hold(t, mode, pem, n, while_open):
    """Opens `n` idle connections to `t`, calls `while_open` once they are all open (and have
    settled), then closes them; returns the client's report of the opening."""
    cmd = ["taskset", "-c", str(LOAD_CPU), sys.executable, CLIENT, "--port", str(t.port),
           "--connections", str(n), "--mode", mode, "--ca", pem[0]]
    client = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        opened = json.loads(client.stdout.readline() or "null")
        if not opened or opened["open"] == 0:
            raise RuntimeError(f"idle: no connection to {t.name} ({mode}) stayed open: "
                               f"{opened or client.stderr.read()[-300:]}")
        time.sleep(SETTLE_S)
        while_open()
        client.stdin.write("close\n")
        client.stdin.flush()
        client.stdout.readline()
        client.wait(timeout=30)
        return opened
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def _raise_nofile(want):
    """The proxy and the client each hold a descriptor per idle connection (upstream
    connections are few: they are opened CONCURRENCY at a time): raises this process's limit,
    which the targets and the client inherit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, hard), max(want, hard)))
    except (ValueError, OSError) as e:
        raise RuntimeError(f"idle: needs {want} file descriptors (ulimit -n is {soft}, hard "
                           f"{hard}; raising it needs root): {e}") from e


def _rss_kib(pid):
    return _status_kib(pid, "VmRSS:")


def _peak_kib(pid):
    return _status_kib(pid, "VmHWM:")


def _status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def _start(group, tmp, name, mode, pem, n):
    upstream, stats, port = free_port(), free_port(), free_port()
    targets._backend(group, f"{name}-backend", Backend(), stats,
                     ["--listen", f"127.0.0.1:{upstream}"], "listening")
    starter = _sluice if name.startswith("sluice") else _nginx if name == "nginx" else _haproxy
    pid = starter(group, tmp, name, mode, pem, port, upstream, n)
    wait_port(port)
    return Target(name, port, pid, upstream, stats, scheme="http" if mode == "plain" else "https")


def _sluice(group, tmp, name, mode, pem, port, upstream, n):
    _, cert, priv, _ = pem
    listener = "" if mode == "plain" else (f'tls = {{ cert = "{cert}", key = "{priv}" }}\n'
                                           f'http2 = {"true" if mode == "h2" else "false"}\n')
    conf = targets._write(tmp, f"{name}-{mode}.toml", f"""[runtime]
workers = 1

[[listener]]
name = "bench"
listen = "127.0.0.1:{port}"
{listener}request_header_timeout = "{IDLE_TIMEOUT_S}s"
idle_timeout = "{IDLE_TIMEOUT_S}s"
fast_path = {"false" if "hyper" in name else "true"}
own_http2 = {"true" if "h2own" in name else "false"}

[[route]]
cluster = "{targets.SERVICE}"

[cluster.{targets.SERVICE}]
kind = "static"
endpoints = ["127.0.0.1:{upstream}"]
pool = {{ max_idle_per_endpoint = {targets.KEEPALIVE} }}
""")
    return group.start(name, [targets._sluice(name), "run", "-c", conf], PROXY_CPU).pid


def _nginx(group, tmp, name, mode, pem, port, upstream, n):
    _, cert, priv, _ = pem
    upstream_block = (f"server 127.0.0.1:{upstream}; keepalive {targets.KEEPALIVE}; "
                      "keepalive_requests 1000000;")
    location = (f'proxy_http_version 1.1; proxy_set_header Connection ""; '
                f"keepalive_timeout {IDLE_TIMEOUT_S}s;")
    conf = targets._nginx_conf(tmp, f"{name}-{mode}", port, f"worker_rlimit_nofile {n + 4096};",
                               upstream_block, location,
                               tls=None if mode == "plain" else (cert, priv), http2=mode == "h2",
                               connections=n + 4096)
    return only_child(group.start(name, ["nginx", "-c", conf, "-p", tmp], PROXY_CPU).pid)


def _haproxy(group, tmp, name, mode, pem, port, upstream, n):
    bind = {"plain": "", "tls": f" ssl crt {pem[3]} alpn http/1.1",
            "h2": f" ssl crt {pem[3]} alpn h2,http/1.1"}[mode]
    # HAProxy wants two descriptors per connection of `maxconn` (client and server side) and
    # refuses to start above the hard limit unless told it may: the idle connections need one.
    conf = targets._write(tmp, f"{name}-{mode}.cfg", f"""
global
    nbthread 1
    maxconn {n + 256}
    no strict-limits

defaults
    mode http
    timeout connect 2s
    timeout client {IDLE_TIMEOUT_S}s
    timeout http-keep-alive {IDLE_TIMEOUT_S}s
    timeout server 30s
    http-reuse always

frontend bench
    bind 127.0.0.1:{port}{bind}
    default_backend backend

backend backend
    server s1 127.0.0.1:{upstream}
""")
    return group.start(name, ["haproxy", "-db", "-f", conf], PROXY_CPU).pid
