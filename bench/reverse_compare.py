#!/usr/bin/env python3
"""One Rust hello service reached four ways: dialing in as sessions vs listening behind a proxy.

Targets, each a proxy with one worker pinned to CPU 1 (wrk and every hello instance on CPU 0):
  sluice-reverse      the hello service dials in to Sluice's acceptor and registers as many
                      sessions as wrk has connections; Sluice never connects to it
  sluice-static       Sluice's static cluster (pooled keep-alive connections) to a listening hello
  nginx-keepalive     NGINX with `keepalive N` upstream connections
  nginx-no-keepalive  NGINX's default: one upstream connection per request
Each listening target has a hello instance of its own, so its TIME_WAIT sockets can be told apart.

Per target: wrk RPS and p99; proxy CPU per request (/proc/PID/stat utime+stime); proxy context
switches per request (voluntary + nonvoluntary, summed over /proc/PID/task/*/status); and the
TIME_WAIT sockets on the proxy's side of its upstream connections right after a fixed number of
requests (h2load -n, run once per target before the timed rounds, on fresh ports). Rounds are
interleaved in rotated order; the table gives the median and min-max of per-round values.

Usage: bench/reverse_compare.py [--rounds 5] [--seconds 5] [--connections 64]
                                [--tw-requests 200000] [--sluice PATH] [--hello PATH]
Builds nothing: cargo build --release --bin sluice --example hello_service \\
                  -p sluice-cli -p sluice-examples
Needs: nginx, wrk, h2load (apt-get install nginx-light wrk nghttp2-client), taskset, ss.
"""

import argparse
import glob
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

from nginx_compare import (
    ROOT,
    cpu_seconds,
    fmt,
    free_port,
    nginx_conf,
    nginx_worker_pid,
    start,
    wait_port,
    wrk,
)

SERVICE = "hello"


def ctx_switches(pid):
    """Voluntary + nonvoluntary context switches of every live thread of `pid`."""
    total = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def time_wait(port):
    """TIME_WAIT sockets with `port` at one end: (local end is `port`, remote end is `port`)."""
    out = subprocess.run(["ss", "-tanH", "state", "time-wait"], capture_output=True, text=True,
                         check=True).stdout
    local = remote = 0
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        ends = [c.rsplit(":", 1)[1] for c in cols[-2:]]
        local += ends[0] == str(port)
        remote += ends[1] == str(port)
    return local, remote


def h2load(port, requests, connections):
    subprocess.run(["taskset", "-c", "0", "h2load", "--h1", "-t1", f"-c{connections}",
                    f"-n{requests}", f"http://127.0.0.1:{port}/"], capture_output=True, check=True)


def sluice_conf(tmp, name, port, body):
    path = os.path.join(tmp, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f"""[runtime]\nworkers = 1\n\n[[listener]]\nname = "bench"\nlisten = "127.0.0.1:{port}"\n
[[route]]\ncluster = "{SERVICE}"\n\n{body}""")
    return path


def start_registered(cmd, capacity, timeout=15.0):
    """Starts the dial-in hello on CPU 0 and waits for its `registered N` line."""
    proc = subprocess.Popen(["taskset", "-c", "0"] + cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != f"registered {capacity}":
        raise RuntimeError(f"the dial-in hello did not register: {line!r}")
    return proc


def start_targets(args, tmp, procs):
    """Starts every proxy and hello instance; returns {target: (port, proxy pid, upstream port,
    whether the proxy's side of the upstream connections is the local end of that port)}."""
    targets = {}
    for name in ("sluice-static", "nginx-keepalive", "nginx-no-keepalive"):
        hello = free_port()
        procs.append(start([args.hello, "--listen", f"127.0.0.1:{hello}"], 0))
        wait_port(hello)
        targets[name] = [free_port(), None, hello, False]
    port, acceptor = free_port(), free_port()
    targets["sluice-reverse"] = [port, None, acceptor, True]
    conf = sluice_conf(tmp, "sluice-reverse", port, f"""[acceptor]\nlisten = "127.0.0.1:{acceptor}"
handshakes_per_second = 0\n\n[cluster.{SERVICE}]\nkind = "reverse"\nqueue_max = 4096
queue_timeout = "5s"\n""")
    procs.append(start([args.sluice, "run", "-c", conf], 1))
    targets["sluice-reverse"][1] = procs[-1].pid
    wait_port(acceptor)
    procs.append(start_registered([args.hello, "--acceptor", f"127.0.0.1:{acceptor}",
                                   "--service", SERVICE, "--capacity", str(args.connections)],
                                  args.connections))
    port, _, hello, _ = targets["sluice-static"]
    conf = sluice_conf(tmp, "sluice-static", port, f"""[cluster.{SERVICE}]\nkind = "static"
endpoints = ["127.0.0.1:{hello}"]\n""")
    procs.append(start([args.sluice, "run", "-c", conf], 1))
    targets["sluice-static"][1] = procs[-1].pid
    for name, keepalive in (("nginx-keepalive", True), ("nginx-no-keepalive", False)):
        port, _, hello, _ = targets[name]
        upstream = f"keepalive {args.connections}; keepalive_requests 1000000;" if keepalive else ""
        location = "proxy_http_version 1.1; proxy_set_header Connection \"\";" if keepalive else ""
        conf = nginx_conf(tmp, name, f"""
            upstream backend {{ server 127.0.0.1:{hello}; {upstream} }}
            server {{ listen 127.0.0.1:{port}; keepalive_requests 1000000;
              location / {{ proxy_pass http://backend; {location} }} }}""")
        master = start(["nginx", "-c", conf, "-p", tmp], 1)
        procs.append(master)
        wait_port(port)
        targets[name][1] = nginx_worker_pid(master)
    for port, *_ in targets.values():
        wait_port(port)
    return {name: tuple(t) for name, t in targets.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--tw-requests", type=int, default=200_000)
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target/release/sluice"))
    ap.add_argument("--hello", default=os.path.join(ROOT, "target/release/examples/hello_service"))
    args = ap.parse_args()
    for tool in ("nginx", "wrk", "h2load", "taskset", "ss"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install nginx-light wrk nghttp2-client")
    for binary in (args.sluice, args.hello):
        if not os.access(binary, os.X_OK):
            sys.exit(f"{binary} missing: cargo build --release --bin sluice --example "
                     "hello_service -p sluice-cli -p sluice-examples")
    tmp = tempfile.mkdtemp(prefix="sluice-reverse-bench-")
    procs = []
    try:
        targets = start_targets(args, tmp, procs)
        tw = measure_time_wait(targets, args)
        for port, *_ in targets.values():  # warm-up: pools, caches, page faults
            wrk(port, 1, args.connections)
        results = run_rounds(targets, args)
        report(results, tw, args)
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def measure_time_wait(targets, args):
    """TIME_WAIT on the proxy's side after exactly --tw-requests requests, per target."""
    tw = {}
    for name, (port, _, upstream, proxy_is_local) in targets.items():
        # Readiness probes left a TIME_WAIT socket or two; count only what the requests leave.
        before = time_wait(upstream)
        h2load(port, args.tw_requests, args.connections)
        local, remote = (after - b for after, b in zip(time_wait(upstream), before))
        tw[name] = (local, remote) if proxy_is_local else (remote, local)
        print(f"{name:18} after {args.tw_requests} requests: TIME_WAIT proxy side {tw[name][0]}, "
              f"service side {tw[name][1]}", flush=True)
    return tw


def run_rounds(targets, args):
    results = {name: [] for name in targets}
    names = list(targets)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            port, pid = targets[name][:2]
            cpu, ctx = cpu_seconds(pid), ctx_switches(pid)
            rps, total, p99, errors = wrk(port, args.seconds, args.connections)
            cpu_us = (cpu_seconds(pid) - cpu) * 1e6 / max(total, 1)
            ctx_per = (ctx_switches(pid) - ctx) / max(total, 1)
            results[name].append((rps, p99, cpu_us, ctx_per, errors))
            print(f"round {r + 1}/{args.rounds} {name:18} {rps:9.0f} rps  p99 {p99:7.0f} us  "
                  f"{cpu_us:5.1f} us CPU/req  {ctx_per:6.3f} cs/req  non-2xx {errors}", flush=True)
    return results


def report(results, tw, args):
    print(f"\nwrk -t1 -c{args.connections} -d{args.seconds}s x {args.rounds} rounds; proxies "
          "(1 worker) pinned to CPU 1, wrk + hello to CPU 0; median (min-max)")
    print(f"TIME_WAIT: sockets on the proxy side (service side) of its upstream connections right "
          f"after h2load -n {args.tw_requests} -c {args.connections}")
    print(f"{'target':18} {'RPS':>22} {'p99 us':>18} {'CPU us/req':>17} {'ctx sw/req':>20} "
          f"{'non-2xx':>8} {'TIME_WAIT':>15}")
    for name, rows in results.items():
        cols = [fmt([row[i] for row in rows], d) for i, d in ((0, 0), (1, 0), (2, 1), (3, 3))]
        errors = sum(row[4] for row in rows)
        tws = f"{tw[name][0]} ({tw[name][1]})"
        print(f"{name:18} {cols[0]:>22} {cols[1]:>18} {cols[2]:>17} {cols[3]:>20} {errors:>8} "
              f"{tws:>15}")
    base, ours = results["sluice-static"], results["sluice-reverse"]
    print("\nsluice-reverse / sluice-static, per round:")
    for i, label in enumerate(("RPS", "p99", "CPU/req", "ctx/req")):
        print(f"  {label:8} {fmt([x[i] / y[i] if y[i] else float('nan') for x, y in zip(ours, base)], 2)}")


def stop_all(procs):
    # Newest first: the dial-in hello drains while its proxy still runs.
    for p in reversed(procs):
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main()
