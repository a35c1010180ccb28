"""The gRPC scenario: each proxy takes cleartext HTTP/2 with prior knowledge (h2c) from the
client and carries gRPC calls over HTTP/2 to its own `bench-backend --grpc` (Sluice: a static
cluster with `protocol = "h2c"`; NGINX: `grpc_pass` with upstream keep-alive; HAProxy: `proto
h2` on both sides). The load is h2load with gRPC framing (a POST of one gRPC message,
`content-type: application/grpc`, `te: trailers`), rounds interleaved, two kinds of call:

* `unary`: one message each way.
* `stream`: server streaming, one message in and STREAM_MESSAGES out, each its own DATA frame.
  h2load sends the whole request before it reads, so a call that streams both ways at once
  (or paces its messages) cannot be expressed; this is the per-message relay cost.

What counts is the proxy's CPU per call, as a ratio to NGINX's and HAProxy's in the same round,
calls/s and p99 (from h2load's per-request log). `sluice-grpc-b` is a second, identical Sluice:
the A/A pair. `sluice-grpc-reverse` is Sluice with a reverse cluster instead: its backend dials
in with HTTP/2 sessions (the SDK's `streams`), and its CPU per call is compared to
`sluice-grpc`'s (issue 31: at most 1.1x the static h2c path). `sluice-grpc-own` is the static
target with Sluice's own HTTP/2 transport on its listener (`own_http2 = true`), the others on
hyper's."""

import dataclasses
import os
import statistics
import subprocess

from . import h2, load, targets
from .procs import LOAD_CPU, PROXY_CPU, Group, free_port, only_child, wait_port
from .targets import Backend, Target

STATIC, REVERSE = "sluice-grpc", "sluice-grpc-reverse"
OWN = "sluice-grpc-own"
TARGETS = (STATIC, "sluice-grpc-b", OWN, REVERSE, "nginx-grpc", "haproxy-grpc")
# The smoke checks the harness: one static Sluice is enough (the dial-in one has a start-up of
# its own to keep working).
SMOKE_TARGETS = (STATIC, OWN, REVERSE, "nginx-grpc", "haproxy-grpc")
# The dial-in backend's HTTP/2 sessions: as many as the static cluster's connections to its
# backend under this load (h2load's 4 x 100 streams fill its 4 of 100), each with room to spare
# (4 x 128 = 512 > 400 calls at once), so that capacity never queues a call.
REVERSE_SESSIONS = 4
REVERSE_STREAMS = 128
CALLS = {"unary": "/bench.Bench/Unary", "stream": "/bench.Bench/Stream"}
STREAM_MESSAGES = 10  # bench-backend's, for a method named Stream
# The request: one gRPC message (uncompressed, 4-byte big-endian length) holding a protobuf
# string field, "hello, world".
REQUEST = b"\x00\x00\x00\x00\x0e\x0a\x0chello, world"
# The answer's message: the backend's default 13-byte body in the 5-byte gRPC prefix.
REPLY_BYTES = 5 + Backend().body_bytes
PROBE_CALLS = 2000


def _start(group, tmp, name):
    """Starts proxy `name` (`sluice-*`, `nginx-*` or `haproxy-*`) taking h2c in front of a
    gRPC backend of its own."""
    if name == REVERSE:
        return _sluice_reverse(group, tmp, name)
    upstream, stats, port = free_port(), free_port(), free_port()
    served = targets._backend(group, f"{name}-backend", Backend(), stats,
                              ["--listen", f"127.0.0.1:{upstream}", "--grpc"], "listening")
    starter = (_sluice if name.startswith("sluice") else
               _nginx if name.startswith("nginx") else _haproxy)
    pid = starter(group, tmp, name, port, upstream)
    wait_port(port)
    return Target(name, port, pid, upstream, stats, backend_pid=served)


def _sluice(group, tmp, name, port, upstream):
    # A plaintext listener takes h2c with prior knowledge (http2 defaults to true); the
    # cluster's h2 settings are its defaults (100 streams per connection, up to 4 connections).
    conf = targets._write(tmp, f"{name}.toml", f"""[runtime]
workers = 1

[[listener]]
name = "bench"
listen = "127.0.0.1:{port}"
own_http2 = {"true" if name == OWN else "false"}

[[route]]
cluster = "{targets.SERVICE}"

[cluster.{targets.SERVICE}]
kind = "static"
endpoints = ["127.0.0.1:{upstream}"]
protocol = "h2c"
""")
    return group.start(name, [targets._sluice(name), "run", "-c", conf], PROXY_CPU).pid


def _sluice_reverse(group, tmp, name):
    """Sluice with a reverse cluster, the static target's config otherwise; its backend dials
    in with REVERSE_SESSIONS HTTP/2 sessions of REVERSE_STREAMS streams each."""
    port, acceptor, stats = free_port(), free_port(), free_port()
    conf = targets._write(tmp, f"{name}.toml", f"""[runtime]
workers = 1

[acceptor]
listen = "127.0.0.1:{acceptor}"
handshakes_per_second = 0

[[listener]]
name = "bench"
listen = "127.0.0.1:{port}"

[[route]]
cluster = "{targets.SERVICE}"

[cluster.{targets.SERVICE}]
kind = "reverse"
queue_max = {targets.QUEUE_MAX}
queue_timeout = "{targets.QUEUE_TIMEOUT_S}s"
""")
    proxy = group.start(name, [targets._sluice(name), "run", "-c", conf], PROXY_CPU)
    wait_port(acceptor)
    served = targets._backend(
        group, f"{name}-backend", Backend(), stats,
        ["--acceptor", f"127.0.0.1:{acceptor}", "--service", targets.SERVICE, "--sessions",
         str(REVERSE_SESSIONS), "--streams", str(REVERSE_STREAMS), "--grpc"], "registered")
    wait_port(port)
    return Target(name, port, proxy.pid, acceptor, stats, reverse=True, backend_pid=served)


def _nginx(group, tmp, name, port, upstream):
    # NGINX's gRPC proxy puts one call on each upstream connection at a time; `keepalive`
    # keeps them for the next calls.
    upstream_block = (f"server 127.0.0.1:{upstream}; keepalive {targets.KEEPALIVE}; "
                      "keepalive_requests 1000000;")
    conf = targets._nginx_conf(tmp, name, port, "", upstream_block, "", http2=True,
                               pass_="grpc_pass", scheme="grpc")
    return only_child(group.start(name, ["nginx", "-c", conf, "-p", tmp], PROXY_CPU).pid)


def _haproxy(group, tmp, name, port, upstream):
    conf = targets._write(tmp, f"{name}.cfg", f"""
global
    nbthread 1
    maxconn 8000

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    http-reuse always

frontend bench
    bind 127.0.0.1:{port} proto h2
    default_backend backend

backend backend
    server s1 127.0.0.1:{upstream} proto h2
""")
    return group.start(name, ["haproxy", "-db", "-f", conf], PROXY_CPU).pid


def _grpc_args(request_file):
    return ("-d", request_file, "-H", "content-type: application/grpc", "-H", "te: trailers")


def _reply_bytes(kind):
    return REPLY_BYTES * (STREAM_MESSAGES if kind == "stream" else 1)


def probe(target, kind, request_file):
    """PROBE_CALLS calls of `kind` without a warm-up, where h2load's counts cover every call:
    each must be answered with all its messages, else the target is misconfigured (a proxy's
    own gRPC error is HTTP 200 with `grpc-status` and no body, which h2load counts as a
    success). Raises if not."""
    cmd = ["taskset", "-c", str(LOAD_CPU), "h2load", "-n", str(PROBE_CALLS), "-c",
           str(h2.CONNECTIONS), "-m", str(h2.STREAMS), *_grpc_args(request_file),
           f"http://127.0.0.1:{target.port}{CALLS[kind]}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    run = h2.parse_h2load(target.name, done.stdout, "h2c") if done.returncode == 0 else None
    if run is None or run.requests != PROBE_CALLS or run.bytes_read != PROBE_CALLS * _reply_bytes(kind):
        got = (f"{run.requests} calls answered, {run.bytes_read} bytes of messages" if run
               else done.stderr.strip()[-300:])
        raise RuntimeError(f"grpc {kind} probe of {target.name}: expected {PROBE_CALLS} calls "
                           f"with {_reply_bytes(kind)} bytes of messages each; got {got}")


def calls(target, kind, seconds, request_file, log_file):
    """h2load's gRPC calls of `kind` for `seconds` after its warm-up: a `Run` whose requests
    are the calls answered, with p50/p99 from h2load's per-request log (the measured seconds
    only). h2load's byte count covers the warm-up too, so it only bounds the calls answered
    without their messages: those it proves are counted as errors (the probe is exact)."""
    args = (*_grpc_args(request_file), f"--log-file={log_file}")
    run = h2.h2load(target, seconds, path=CALLS[kind], args=args, protocol="h2c")
    run.errors += max(0, run.requests - run.bytes_read // _reply_bytes(kind))
    run.latency_us.update(_percentiles(log_file, run.requests))
    os.unlink(log_file)
    return run


def _percentiles(log_file, measured):
    """p50 and p99 of the last `measured` 200s in h2load's log (columns: start time, status,
    microseconds to the end of the response; one h2load thread writes them in the order they
    ended, the warm-up's first)."""
    with open(log_file) as f:
        rows = [line.split("\t") for line in f]
    us = [int(r[2]) for r in rows if len(r) >= 3 and r[1] == "200"][-measured:]
    if len(us) < 2:
        return {}
    q = statistics.quantiles(us, n=100)
    return {"p50": q[49], "p99": q[98]}


def grpc(b):
    """Rounds of every target in rotated order, unary then streaming calls in each round."""
    smoke = b.p.name == "smoke"
    rounds = 1 if smoke else max(2, b.p.headline_rounds // 2)
    out = {"connections": h2.CONNECTIONS, "streams": h2.STREAMS, "rounds": rounds,
           "reverse_sessions": REVERSE_SESSIONS, "reverse_streams": REVERSE_STREAMS,
           "seconds": b.p.seconds, "warmup_s": h2.WARMUP_S, "stream_messages": STREAM_MESSAGES,
           "request_bytes": len(REQUEST), "reply_bytes": REPLY_BYTES,
           "load_average": {"start": os.getloadavg()}}
    request_file = targets._write(b.work, "grpc-request.bin", "")
    with open(request_file, "wb") as f:
        f.write(REQUEST)
    group = Group(b.work)
    try:
        ts = {name: _start(group, b.work, name) for name in (SMOKE_TARGETS if smoke else TARGETS)}
        for t in ts.values():
            for kind in CALLS:
                probe(t, kind, request_file)
        kinds = out["kinds"] = {kind: {name: [] for name in ts} for kind in CALLS}
        for r in range(rounds):
            for kind in CALLS:
                for name in load.rotated(ts, r):
                    group.check_alive()
                    log_file = os.path.join(b.work, f"{name}-{kind}.h2load.log")
                    run = calls(ts[name], kind, b.p.seconds, request_file, log_file)
                    kinds[kind][name].append(dataclasses.asdict(run))
                    b.say(f"grpc {kind:6} round {r + 1}/{rounds} {name:19} {run.rps:8.0f} calls/s  "
                          f"{run.cpu_us_per_req:6.1f} us CPU/call  "
                          f"p99 {run.latency_us.get('p99', 0) / 1e3:6.1f} ms  "
                          f"errors {run.non2xx + run.errors}"
                          f"{'  LOAD CPU BUSY' if run.load_saturated else ''}")
    finally:
        out["load_average"]["end"] = os.getloadavg()
        group.close()
    return out
