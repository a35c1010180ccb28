#!/usr/bin/env python3
"""Sluice (static cluster) vs NGINX (upstream keepalive) against the same backend, side by side.

One worker each: NGINX `worker_processes 1`, Sluice `--workers 1` (a current-thread runtime).
Both proxies are pinned to CPU 1; wrk and the backend (a separate NGINX answering a fixed
body) share CPU 0. Targets are interleaved in rotated order each round; the report gives the
median and min-max of per-round values and of Sluice/NGINX ratios. Proxy CPU time per request
comes from /proc/<pid>/stat (utime + stime) around each run.

With --aa a second, identical Sluice process runs as its own target: the spread of its ratio
to the first is the session's noise floor.

Usage: bench/nginx_compare.py [--rounds 5] [--seconds 5] [--connections 64] [--aa]
Needs: nginx, wrk (apt-get install nginx-light wrk), a release build of sluice.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

from sluicebench.procs import free_port, wait_port  # noqa: F401 (the other scripts import them from here)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sluice_conf(tmp, name, port, backend):
    path = os.path.join(tmp, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f"""[runtime]\nworkers = 1\n\n[[listener]]\nname = "bench"\nlisten = "127.0.0.1:{port}"\n
[[route]]\ncluster = "backend"\n\n[cluster.backend]\nkind = "static"\nendpoints = ["127.0.0.1:{backend}"]\n""")
    return path


def nginx_conf(tmp, name, server_block):
    path = os.path.join(tmp, f"{name}.conf")
    with open(path, "w") as f:
        f.write(f"""
worker_processes 1;
daemon off;
master_process on;
pid {tmp}/{name}.pid;
error_log {tmp}/{name}.error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/{name}-body;
    proxy_temp_path {tmp}/{name}-proxy;
    {server_block}
}}
""")
    return path


def start(cmd, cpu):
    return subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def nginx_worker_pid(master):
    out = subprocess.run(["pgrep", "-P", str(master.pid)], capture_output=True, text=True, check=False).stdout
    pids = [int(p) for p in out.split()]
    # taskset execs nginx in place, so master.pid is nginx's master; its child is the worker.
    return pids[0] if pids else master.pid


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wrk(port, seconds, connections):
    out = subprocess.run(
        ["taskset", "-c", "0", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
         f"http://127.0.0.1:{port}/"], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1.0, "ms": 1000.0, "s": 1e6}[p99.group(2)]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, total, float(p99.group(1)) * scale, int(errors.group(1)) if errors else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target/release/sluice"))
    ap.add_argument("--aa", action="store_true", help="add a second Sluice (A/A noise floor)")
    args = ap.parse_args()
    for tool in ("nginx", "wrk", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install nginx-light wrk util-linux")
    tmp = tempfile.mkdtemp(prefix="sluice-bench-")
    backend, p_nginx, p_sluice, p_sluice2 = free_port(), free_port(), free_port(), free_port()
    procs = []
    try:
        conf = nginx_conf(tmp, "backend", f"""server {{ listen 127.0.0.1:{backend};
            keepalive_requests 1000000;
            location / {{ return 200 "hello from the backend\\n"; }} }}""")
        procs.append(start(["nginx", "-c", conf, "-p", tmp], 0))
        conf = nginx_conf(tmp, "proxy", f"""
            upstream backend {{ server 127.0.0.1:{backend}; keepalive {args.connections}; keepalive_requests 1000000; }}
            server {{ listen 127.0.0.1:{p_nginx}; keepalive_requests 1000000;
              location / {{ proxy_pass http://backend; proxy_http_version 1.1;
                            proxy_set_header Connection ""; }} }}""")
        nginx = start(["nginx", "-c", conf, "-p", tmp], 1)
        procs.append(nginx)
        sluices = [(p_sluice, "sluice-static")] + ([(p_sluice2, "sluice-static-2")] if args.aa else [])
        targets = {"nginx-keepalive": (p_nginx, None)}
        for port, name in sluices:
            proc = start([args.sluice, "run", "-c", sluice_conf(tmp, name, port, backend)], 1)
            procs.append(proc)
            targets[name] = (port, proc.pid)
        for port in [backend] + [port for port, _ in targets.values()]:
            wait_port(port)
        targets["nginx-keepalive"] = (p_nginx, nginx_worker_pid(nginx))
        for port, _ in targets.values():  # warm-up: pools, caches, page faults
            wrk(port, 1, args.connections)
        results = {name: [] for name in targets}
        names = list(targets)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                port, pid = targets[name]
                before = cpu_seconds(pid)
                rps, total, p99, errors = wrk(port, args.seconds, args.connections)
                cpu_us = (cpu_seconds(pid) - before) * 1e6 / max(total, 1)
                results[name].append((rps, p99, cpu_us, errors))
                print(f"round {r + 1}/{args.rounds} {name:16} {rps:9.0f} rps  p99 {p99:7.0f} us  "
                      f"{cpu_us:5.1f} us CPU/req  non-2xx {errors}", flush=True)
        report(results, args)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def report(results, args):
    print(f"\nwrk -t1 -c{args.connections} -d{args.seconds}s x {args.rounds} rounds; proxies pinned to CPU 1,"
          " wrk + backend to CPU 0; median (min-max)")
    print(f"{'target':16} {'RPS':>22} {'p99 us':>20} {'CPU us/req':>20}")
    for name, rows in results.items():
        cols = [fmt([row[i] for row in rows]) for i in range(3)]
        print(f"{name:16} {cols[0]:>22} {cols[1]:>20} {cols[2]:>20}")
    base, ours = results["nginx-keepalive"], results["sluice-static"]
    pairs = [("sluice / nginx-keepalive", ours, base)]
    if "sluice-static-2" in results:
        pairs.append(("sluice-2 / sluice (A/A noise floor)", results["sluice-static-2"], ours))
    for title, a, b in pairs:
        print(f"\n{title}, per round:")
        for i, label in enumerate(("RPS", "p99", "CPU/req")):
            print(f"  {label:8} {fmt([x[i] / y[i] for x, y in zip(a, b)], 2)}")


def fmt(values, digits=0):
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


if __name__ == "__main__":
    main()
