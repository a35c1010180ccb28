"""The HTTP/3 scenario (issue 51): Sluice's HTTP/3 beside Caddy's and beside Sluice's own
HTTP/2, on loopback, each proxy with one worker on the proxy CPU.

* `sluice`, `sluice-b`: Sluice, `workers = 1`, one TLS listener with `http2 = true` and
  `http3 = true` (the same port over TCP and UDP; ECDSA P-256, the tls scenario's
  certificate), a static cluster over HTTP/1.1 keep-alive to its own `bench-backend`.
* `caddy`: Caddy (`go install github.com/caddyserver/caddy/v2/cmd/caddy@CADDY_VERSION`, built
  once into $CARGO_TARGET_DIR/caddy/VERSION), `GOMAXPROCS=1`, HTTP/1.1, HTTP/2 and HTTP/3 on
  (its default) with the same certificate, `reverse_proxy` to its own `bench-backend` with a
  keep-alive pool as large as Sluice's.

**cpu**: rounds in rotated order of `sluice-h3`, `sluice-h3-b` (the A/A pair), `caddy-h3`
(h3load: HTTP/3 over quinn, CONNECTIONS x STREAMS, as h2load's `-c -m`), `sluice-h2` and
`caddy-h2` (h2load, the h2 scenario's shape) for each body size: the proxy's CPU (utime +
stime of every thread, warm-up included) per request its backend served.

**idle**: memory per idle connection, after one request each (h3load --mode idle for HTTP/3,
idle.py's client for HTTP/2), fresh processes every round: (RSS with - RSS before) / N.

Whether GSO/GRO were in use: Sluice logs what its UDP socket takes (`gso_segments`,
`gro_segments`); quic-go (Caddy) turns both on by itself where the kernel has them, unless
`QUIC_GO_DISABLE_GSO`/`QUIC_GO_DISABLE_GRO` are set (neither is, here). Both are recorded, and
(outside the smoke, where strace is found) a pass of its own, after the cpu rounds, traces each
proxy's UDP system calls under one second of the same load: how many sends carried a
`UDP_SEGMENT` (GSO) control message and how many of them sent more than one datagram's
bytes (quic-go attaches the message to single datagrams too), how many receives a `UDP_GRO`
one, and the bytes per call. Tracing slows the calls it counts, so this pass gives no other number.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time

from . import h2, idle, load, targets, tls
from .procs import LOAD_CPU, PROXY_CPU, Group, cpu_times, free_port, sample_proc, wait_port
from .targets import Backend, Target, binary

CADDY_MODULE = "github.com/caddyserver/caddy/v2/cmd/caddy"
CADDY_VERSION = "v2.11.9"
PROXIES = ("sluice", "sluice-b", "caddy")
# (run name, process, protocol)
RUNS = (("sluice-h3", "sluice", "h3"), ("sluice-h3-b", "sluice-b", "h3"),
        ("caddy-h3", "caddy", "h3"), ("sluice-h2", "sluice", "h2"), ("caddy-h2", "caddy", "h2"))
CONNECTIONS = h2.CONNECTIONS
STREAMS = h2.STREAMS  # Sluice's default http3_max_streams and quic-go's are 100 too
BODIES = {"smoke": ("/",), "quick": ("/", "/?bytes=65536"), "full": ("/", "/?bytes=65536")}
IDLE_MAX = 2000  # idle QUIC connections per round, at most (the client holds them all)
IDLE_TIMEOUT_S = idle.IDLE_TIMEOUT_S


def caddy_binary():
    """Caddy at the pinned version, built from the Go module proxy once per target directory."""
    out = os.path.join(targets.CARGO_TARGET_DIR, "caddy", CADDY_VERSION)
    path = os.path.join(out, "caddy")
    if not os.path.exists(path):
        os.makedirs(out, exist_ok=True)
        subprocess.run(["go", "install", f"{CADDY_MODULE}@{CADDY_VERSION}"],
                       env={**os.environ, "GOBIN": out, "GOFLAGS": "-mod=mod"}, check=True)
    return path


def tools_missing(smoke=False):
    """What the scenario needs that is not here: h3load, and Caddy or go to build it (not for
    the smoke, which leaves Caddy out)."""
    missing = [] if os.path.exists(binary("h3load")) else [
        f"{binary('h3load')} (build: cargo build --release -p sluice-bench)"]
    caddy = os.path.join(targets.CARGO_TARGET_DIR, "caddy", CADDY_VERSION, "caddy")
    if not smoke and not os.path.exists(caddy) and not targets._which("go"):
        missing.append("go (to build Caddy from the Go module proxy)")
    return missing


def _start(group, tmp, name, pem, idle_timeout=None):
    """Proxy `name` in front of a backend of its own; its TLS port serves h2 over TCP and h3
    over UDP. Returns the Target (scheme https) and the proxy's log path."""
    upstream, stats, port = free_port(), free_port(), free_port()
    backend_pid = targets._backend(group, f"{name}-backend", Backend(), stats,
                                   ["--listen", f"127.0.0.1:{upstream}"], "listening")
    starter = _caddy if name.startswith("caddy") else _sluice
    pid = starter(group, tmp, name, pem, port, upstream, idle_timeout)
    wait_port(port)
    _wait_h3(group, name, port, pem)
    return Target(name, port, pid, upstream, stats, scheme="https", backend_pid=backend_pid)


def _sluice(group, tmp, name, pem, port, upstream, idle_timeout):
    _, cert, priv, _ = pem
    timeouts = (f'request_header_timeout = "{idle_timeout}s"\nidle_timeout = "{idle_timeout}s"\n'
                if idle_timeout else "")
    conf = targets._write(tmp, f"{name}-h3.toml", f"""[runtime]
workers = 1

[[listener]]
name = "bench"
listen = "127.0.0.1:{port}"
tls = {{ cert = "{cert}", key = "{priv}" }}
http2 = true
http3 = true
{timeouts}
[[route]]
cluster = "{targets.SERVICE}"

[cluster.{targets.SERVICE}]
kind = "static"
endpoints = ["127.0.0.1:{upstream}"]
pool = {{ max_idle_per_endpoint = {targets.KEEPALIVE} }}
""")
    return group.start(name, [targets._sluice(name), "run", "-c", conf], PROXY_CPU).pid


def _caddy(group, tmp, name, pem, port, upstream, idle_timeout):
    _, cert, priv, _ = pem
    home = os.path.join(tmp, f"{name}-home")
    os.makedirs(home, exist_ok=True)
    timeouts = (f"\t\ttimeouts {{\n\t\t\tidle {idle_timeout}s\n\t\t}}\n" if idle_timeout else "")
    conf = targets._write(tmp, f"{name}.Caddyfile", f"""{{
\tadmin off
\tpersist_config off
\tskip_install_trust
\tauto_https disable_redirects
\tdefault_sni localhost
\tservers {{
\t\tprotocols h1 h2 h3
{timeouts}\t}}
}}

https://:{port} {{
\tbind 127.0.0.1
\ttls {cert} {priv}
\treverse_proxy 127.0.0.1:{upstream} {{
\t\ttransport http {{
\t\t\tkeepalive 120s
\t\t\tkeepalive_idle_conns {targets.KEEPALIVE}
\t\t\tkeepalive_idle_conns_per_host {targets.KEEPALIVE}
\t\t}}
\t}}
}}
""")
    env = ["env", "GOMAXPROCS=1", f"HOME={home}", f"XDG_DATA_HOME={home}",
           f"XDG_CONFIG_HOME={home}"]
    cmd = env + [caddy_binary(), "run", "--config", conf, "--adapter", "caddyfile"]
    return group.start(name, cmd, PROXY_CPU).pid


def _wait_h3(group, name, port, pem, timeout=15.0):
    """Until one HTTP/3 request is answered (the UDP socket has no connect() to wait for)."""
    deadline = time.monotonic() + timeout
    while True:
        group.check_alive()
        r = _h3load(port, pem, connections=1, streams=1, seconds=0.2, warmup=0)
        if r["requests"] > 0 or time.monotonic() > deadline:
            if r["requests"] == 0:
                raise RuntimeError(f"http3: {name} answered no HTTP/3 request: {r}")
            return
        time.sleep(0.1)


def _h3load(port, pem, connections=CONNECTIONS, streams=STREAMS, seconds=1.0,
            warmup=h2.WARMUP_S, path="/"):
    cmd = ["taskset", "-c", str(LOAD_CPU), binary("h3load"), "--addr", f"127.0.0.1:{port}",
           "--ca", pem[0], "--connections", str(connections), "--streams", str(streams),
           "--seconds", str(seconds), "--warmup", str(warmup), "--path", path]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"h3load exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout)


def h3(target, pem, seconds, path):
    """h3load for `seconds` after a warm-up: a `Run` as h2.h2load makes it."""
    stats = load.backend_stats(target)
    before, busy = sample_proc(target.pid), cpu_times(LOAD_CPU)
    report = _h3load(target.port, pem, seconds=seconds, path=path)
    after, busy_after = sample_proc(target.pid), cpu_times(LOAD_CPU)
    served = load.backend_stats(target)["requests"] - stats["requests"]
    run = load.Run(target.name)
    run.requests, run.non2xx, run.errors = report["requests"], report["non2xx"], report["errors"]
    run.seconds = report["seconds"]
    run.rps = report["requests"] / max(report["seconds"], 1e-9)
    run.bytes_read = report["bytes"]
    run.latency_us = {"mean": report["mean_latency_us"]}
    run.cpu_us_per_req = (after.cpu_s - before.cpu_s) * 1e6 / max(served, 1)
    run.load_cpu_busy = (busy_after[0] - busy[0]) / max(1, busy_after[1] - busy[1])
    run.extra["backend_requests"] = served
    if report.get("first_error"):
        run.extra["first_error"] = report["first_error"]
    return run


def http3(b):
    """The cpu rounds, then the idle rounds. The smoke (the test command's) leaves Caddy out:
    a first build of it takes minutes, and the smoke checks the harness, not speed."""
    smoke = b.p.name == "smoke"
    proxies = PROXIES if not smoke else tuple(p for p in PROXIES if p.startswith("sluice"))
    rounds = 1 if smoke else max(2, b.p.headline_rounds // 2)
    bodies = BODIES.get(b.p.name, BODIES["quick"])
    pem = tls._certificate(b.work, "ecdsa")
    out = {"connections": CONNECTIONS, "streams": STREAMS, "rounds": rounds,
           "seconds": b.p.seconds, "warmup_s": h2.WARMUP_S, "caddy": CADDY_VERSION,
           "bodies": {}}
    group = Group(b.work)
    try:
        ts = {name: _start(group, b.work, name, pem) for name in proxies}
        out["udp_offload"] = _offload(b.work, proxies)
        b.say(f"http3: UDP offload {out['udp_offload']}")
        runs_here = [x for x in RUNS if x[1] in proxies]
        for path in bodies:
            runs = out["bodies"][path] = {run: [] for run, _, _ in runs_here}
            for r in range(rounds):
                for run_name in load.rotated(runs, r):
                    _, proc, proto = next(x for x in RUNS if x[0] == run_name)
                    group.check_alive()
                    t = dataclasses.replace(ts[proc], name=run_name)
                    run = (h3(t, pem, b.p.seconds, path) if proto == "h3"
                           else h2.h2load(t, b.p.seconds, path=path))
                    runs[run_name].append(dataclasses.asdict(run))
                    b.say(f"http3 {path:14} round {r + 1}/{rounds} {run_name:12} {run.rps:8.0f} rps"
                          f"  {run.cpu_us_per_req:6.1f} us CPU/req  errors {run.non2xx + run.errors}"
                          f"{'  LOAD CPU BUSY' if run.load_saturated else ''}")
        if not smoke and shutil.which("strace"):
            out["udp_calls"] = {p: _udp_calls(b.work, ts[p], pem) for p in proxies}
            b.say(f"http3: UDP calls under strace {out['udp_calls']}")
    finally:
        group.close()
    out["idle"] = _idle(b, pem, proxies)
    return out


# strace prints a control message's type by name where it knows it, else by number
# (UDP_SEGMENT is 103, UDP_GRO 104, at level SOL_UDP 17).
_GSO = re.compile(r"cmsg_type=(UDP_SEGMENT|0x67)\b")
_GRO = re.compile(r"cmsg_type=(UDP_GRO|0x68)\b")
_CALLS = ("sendmsg", "sendmmsg", "recvmsg", "recvmmsg")
_START = re.compile(r"^(\d+)\s+(\w+)\(")
_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (\w+) resumed>")
_RESULT = re.compile(r"\)\s+=\s+(-?\d+)")


MAX_DATAGRAM = 1500  # quinn's and quic-go's largest UDP payload (1452) and below a second one


def _udp_calls(work, target, pem, seconds=1.0):
    """One second of h3load with strace on the proxy's threads: its UDP sends and receives,
    those with GSO and GRO control messages, and the bytes (or, for the mmsg calls, messages)
    per call."""
    log = os.path.join(work, f"{target.name}-strace.txt")
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", log, "-p", str(target.pid),
                               "-e", "trace=" + ",".join(_CALLS)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # attached to every thread
        _h3load(target.port, pem, seconds=seconds, warmup=0)
    finally:
        tracer.terminate()
        tracer.wait(timeout=10)
    with open(log, errors="replace") as f:
        return _count_udp_calls(f)


def _count_udp_calls(lines):
    """Counts strace -f lines; a call another thread interrupted comes as an "unfinished"
    line and a "resumed" one, joined here by thread id."""
    calls = {"sends": 0, "sends_gso": 0, "sends_batched": 0, "send_bytes": 0, "recvs": 0,
             "recvs_gro": 0, "recv_bytes": 0}
    pending = {}
    for line in lines:
        if m := _RESUMED.match(line):
            name, text = m.group(2), pending.pop(m.group(1), "") + line
        elif m := _START.match(line):
            name, text = m.group(2), line
            if line.rstrip().endswith("<unfinished ...>"):
                pending[m.group(1)] = line
                continue
        else:
            continue
        result = _RESULT.search(line)
        if name not in _CALLS or not result or int(result.group(1)) < 0:
            continue
        kind = "sends" if name.startswith("send") else "recvs"
        calls[kind] += 1
        calls["send_bytes" if kind == "sends" else "recv_bytes"] += int(result.group(1))
        if kind == "sends" and _GSO.search(text):
            calls["sends_gso"] += 1
            # quic-go marks single datagrams too; more than one datagram's bytes is a batch.
            calls["sends_batched"] += int(result.group(1)) > MAX_DATAGRAM
        if kind == "recvs" and _GRO.search(text):
            calls["recvs_gro"] += 1
    return calls


def _offload(work, proxies):
    """Whether GSO/GRO were in use: Sluice's log line for its QUIC socket, and quic-go's
    switches (its environment) for Caddy."""
    found = {}
    for name in (p for p in proxies if p.startswith("sluice")):
        with open(os.path.join(work, f"{name}.log"), errors="replace") as f:
            m = re.search(r"gso_segments=(\d+).*?gro_segments=(\d+)", f.read())
        found[name] = ({"gso_segments": int(m.group(1)), "gro_segments": int(m.group(2))}
                       if m else "not logged")
    if "caddy" in proxies:
        found["caddy"] = {"QUIC_GO_DISABLE_GSO": os.environ.get("QUIC_GO_DISABLE_GSO", "unset"),
                          "QUIC_GO_DISABLE_GRO": os.environ.get("QUIC_GO_DISABLE_GRO", "unset")}
    return found


IDLE_RUNS = (("sluice-h3", "sluice", "h3"), ("sluice-h2", "sluice", "h2"),
             ("caddy-h3", "caddy", "h3"), ("caddy-h2", "caddy", "h2"))


def _idle(b, pem, proxies):
    n = min(b.p.idle_connections, IDLE_MAX)
    rounds = b.p.idle_rounds
    idle._raise_nofile(n + 4096)
    here = [x for x in IDLE_RUNS if x[1] in proxies]
    out = {"connections": n, "warmup": idle.WARMUP, "rounds": rounds,
           "targets": {run: [] for run, _, _ in here}}
    for r in range(rounds):
        for run_name in load.rotated(out["targets"], r):
            _, proc, proto = next(x for x in IDLE_RUNS if x[0] == run_name)
            one = _idle_round(b, proc, proto, pem, n)
            one["target"] = run_name
            out["targets"][run_name].append(one)
            b.say(f"http3 idle round {r + 1}/{rounds} {run_name:10} {one['per_conn_kib']:6.2f} "
                  f"KiB/conn  returned {one['returned']:5.0%}  failed {one['failed']}")
    return out


def _idle_round(b, proc, proto, pem, n):
    group = Group(b.work)
    try:
        t = _start(group, b.work, proc, pem, idle_timeout=IDLE_TIMEOUT_S)
        _hold(t, proto, pem, idle.WARMUP, lambda: None)
        time.sleep(idle.SETTLE_S)
        before = idle._rss_kib(t.pid)
        held = {}
        opened = _hold(t, proto, pem, n, lambda: held.update(rss=idle._rss_kib(t.pid)))
        time.sleep(idle.SETTLE_S)
        after = idle._rss_kib(t.pid)
        group.check_alive()
        grown = held["rss"] - before
        return {"before_kib": before, "with_kib": held["rss"], "after_kib": after,
                "open": opened["open"], "failed": opened["failed"],
                "open_seconds": opened["seconds"], "per_conn_kib": grown / n,
                "returned": (held["rss"] - after) / grown if grown > 0 else 0.0}
    finally:
        group.close()


def _hold(t, proto, pem, n, while_open):
    if proto == "h2":
        return idle._hold(t, "h2", pem, n, while_open)
    cmd = ["taskset", "-c", str(LOAD_CPU), binary("h3load"), "--mode", "idle", "--addr",
           f"127.0.0.1:{t.port}", "--ca", pem[0], "--connections", str(n)]
    client = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        opened = json.loads(client.stdout.readline() or "null")
        if not opened or opened["open"] == 0:
            raise RuntimeError(f"http3 idle: no connection to {t.name} stayed open: "
                               f"{opened or client.stderr.read()[-300:]}")
        time.sleep(idle.SETTLE_S)
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
