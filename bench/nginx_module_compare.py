#!/usr/bin/env python3
"""NGINX with ngx_http_sluice_module against stock NGINX, with and without upstream keep-alive,
and Sluice reverse: one Go service (sdk/go's interop service, no delay) reached four ways.

Targets, each a proxy with one worker pinned to CPU 1 (wrk, the services and the standalone
acceptor on CPU 0):
  nginx-no-keepalive  stock NGINX, one upstream connection per request (the paper's baseline)
  nginx-keepalive     stock NGINX with `keepalive N` upstream connections (and its A/A twin,
  nginx-keepalive-aa  a second identical instance: the spread between the two is the noise)
  nginx-sluice        NGINX + this module; the service dials in to `sluice acceptor`, which
                      lends the sessions to the worker; NGINX never connects to the service
  sluice-reverse      `sluice run` with its own acceptor; the service dials in to it
The listening targets each have a service instance of their own; the dial-in ones register as
many sessions as wrk has connections (the largest --connections).

Per target and concurrency: wrk RPS and p99, proxy CPU per request (/proc/PID/stat), proxy
context switches per request. Rounds are interleaved in rotated order; the table gives the
median and min-max of per-round values, then per-round ratios.

Usage: bench/nginx_module_compare.py [--rounds 5] [--seconds 5] [--connections 16,64]
Builds nothing: cargo build --release --bin sluice; nginx/build.sh;
                (cd sdk/go && go build -o ../../target/interopsvc ./internal/interopsvc)
Needs: nginx, nginx-dev, wrk, taskset.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from nginx_compare import ROOT, cpu_seconds, fmt, free_port, nginx_conf, nginx_worker_pid, start, wait_port, wrk
from reverse_compare import ctx_switches, stop_all

SERVICE = "hello"


def service_cmd(args, *extra):
    return [args.service, "--service", SERVICE, "--instance", "go", *extra]


def start_dial_in(args, acceptor, capacity):
    """The Go service dialing in with `capacity` sessions; waits for `registered N`."""
    proc = subprocess.Popen(["taskset", "-c", "0"] + service_cmd(
        args, "--acceptor", f"127.0.0.1:{acceptor}", "--capacity", str(capacity)),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    line = proc.stdout.readline()
    if line.strip() != f"registered {capacity}":
        raise RuntimeError(f"the dial-in service did not register: {line!r}")
    return proc


def write(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def start_targets(args, tmp, procs, capacity):
    targets = {}
    for name in ("nginx-no-keepalive", "nginx-keepalive", "nginx-keepalive-aa"):
        backend, port = free_port(), free_port()
        procs.append(start(service_cmd(args, "--listen", f"127.0.0.1:{backend}"), 0))
        wait_port(backend)
        keepalive = name != "nginx-no-keepalive"
        upstream = f"keepalive {capacity}; keepalive_requests 1000000;" if keepalive else ""
        location = "proxy_http_version 1.1; proxy_set_header Connection \"\";" if keepalive else ""
        conf = nginx_conf(tmp, name, f"""
            upstream backend {{ server 127.0.0.1:{backend}; {upstream} }}
            server {{ listen 127.0.0.1:{port}; keepalive_requests 1000000;
              location / {{ proxy_pass http://backend; {location} }} }}""")
        procs.append(start(["nginx", "-c", conf, "-p", tmp], 1))
        wait_port(port)
        targets[name] = [port, nginx_worker_pid(procs[-1])]

    # nginx-sluice: sluice acceptor <- the service; NGINX + the module <- the acceptor.
    acceptor, sock, port = free_port(), os.path.join(tmp, "handoff.sock"), free_port()
    conf = write(tmp, "acceptor.toml", f"""[acceptor]\nlisten = "127.0.0.1:{acceptor}"
handshakes_per_second = 0\n\n[handoff]\nlisten = "{sock}"\n\n[cluster.{SERVICE}]\nkind = "reverse"\n""")
    procs.append(start([args.sluice, "acceptor", "-c", conf], 0))
    wait_port(acceptor)
    procs.append(start_dial_in(args, acceptor, capacity))
    conf = write(tmp, "nginx-sluice.conf", f"""load_module {args.module};
{"user root;" if os.geteuid() == 0 else ""}
worker_processes 1;
daemon off;
master_process on;
pid {tmp}/nginx-sluice.pid;
error_log {tmp}/nginx-sluice.error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-sluice-body;
    proxy_temp_path {tmp}/nginx-sluice-proxy;
    upstream backend {{
        sluice_sessions unix:{sock} cluster={SERVICE} idle={capacity} queue=4096 queue_timeout=5s;
    }}
    server {{ listen 127.0.0.1:{port}; keepalive_requests 1000000;
      location / {{ sluice_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }} }}
}}
""")
    procs.append(start(["nginx", "-c", conf, "-p", tmp], 1))
    wait_port(port)
    targets["nginx-sluice"] = [port, nginx_worker_pid(procs[-1])]

    port, acceptor = free_port(), free_port()
    conf = write(tmp, "sluice-reverse.toml", f"""[runtime]\nworkers = 1\n
[[listener]]\nname = "bench"\nlisten = "127.0.0.1:{port}"\n\n[[route]]\ncluster = "{SERVICE}"\n
[acceptor]\nlisten = "127.0.0.1:{acceptor}"\nhandshakes_per_second = 0\n
[cluster.{SERVICE}]\nkind = "reverse"\nqueue_max = 4096\nqueue_timeout = "5s"\n""")
    procs.append(start([args.sluice, "run", "-c", conf], 1))
    wait_port(acceptor)
    targets["sluice-reverse"] = [port, procs[-1].pid]
    procs.append(start_dial_in(args, acceptor, capacity))
    for port, _ in targets.values():
        wait_port(port)
    return targets


def run_rounds(targets, args, connections):
    results = {(name, c): [] for name in targets for c in connections}
    names = list(targets)
    for r in range(args.rounds):
        for c in connections:
            for name in names[r % len(names):] + names[:r % len(names)]:
                port, pid = targets[name]
                cpu, ctx = cpu_seconds(pid), ctx_switches(pid)
                rps, total, p99, errors = wrk(port, args.seconds, c)
                cpu_us = (cpu_seconds(pid) - cpu) * 1e6 / max(total, 1)
                ctx_per = (ctx_switches(pid) - ctx) / max(total, 1)
                results[(name, c)].append((rps, p99, cpu_us, ctx_per, errors))
                print(f"round {r + 1}/{args.rounds} c={c:<4} {name:19} {rps:9.0f} rps  p99 {p99:7.0f} us  "
                      f"{cpu_us:6.1f} us CPU/req  {ctx_per:6.3f} cs/req  non-2xx {errors}", flush=True)
    return results


def ratio(a, b, i):
    return fmt([x[i] / y[i] if y[i] else float("nan") for x, y in zip(a, b)], 2)


def report(results, targets, args, connections):
    print(f"\nwrk -t1 -d{args.seconds}s x {args.rounds} rounds; proxies (1 worker) pinned to CPU 1, "
          "wrk, services and the standalone acceptor to CPU 0; median (min-max)")
    for c in connections:
        print(f"\nconcurrency {c}")
        print(f"{'target':19} {'RPS':>22} {'p99 us':>20} {'CPU us/req':>17} {'ctx sw/req':>20} {'non-2xx':>8}")
        for name in targets:
            rows = results[(name, c)]
            cols = [fmt([row[i] for row in rows], d) for i, d in ((0, 0), (1, 0), (2, 1), (3, 3))]
            print(f"{name:19} {cols[0]:>22} {cols[1]:>20} {cols[2]:>17} {cols[3]:>20} "
                  f"{sum(row[4] for row in rows):>8}")
        mod, nk, ka, aa = (results[(n, c)] for n in
                           ("nginx-sluice", "nginx-no-keepalive", "nginx-keepalive", "nginx-keepalive-aa"))
        print("per-round ratios:")
        print(f"  RPS      nginx-sluice / nginx-no-keepalive  {ratio(mod, nk, 0)}")
        print(f"  RPS      nginx-sluice / nginx-keepalive     {ratio(mod, ka, 0)}")
        print(f"  CPU/req  nginx-sluice / nginx-keepalive     {ratio(mod, ka, 2)}")
        print(f"  ctx/req  nginx-sluice / nginx-keepalive     {ratio(mod, ka, 3)}")
        print(f"  RPS      A/A: nginx-keepalive-aa / nginx-keepalive  {ratio(aa, ka, 0)}")
        print(f"  CPU/req  A/A: nginx-keepalive-aa / nginx-keepalive  {ratio(aa, ka, 2)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", default="16,64")
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target/release/sluice"))
    ap.add_argument("--module", default=os.path.join(ROOT, "target/nginx/ngx_http_sluice_module.so"))
    ap.add_argument("--service", default=os.path.join(ROOT, "target/interopsvc"))
    args = ap.parse_args()
    connections = [int(c) for c in args.connections.split(",")]
    for tool in ("nginx", "wrk", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install nginx nginx-dev wrk")
    for path in (args.sluice, args.module, args.service):
        if not os.path.exists(path):
            sys.exit(f"{path} missing (see the usage above)")
    tmp = tempfile.mkdtemp(prefix="sluice-nginx-module-bench-")
    procs = []
    try:
        targets = start_targets(args, tmp, procs, max(connections))
        for port, _ in targets.values():  # warm-up: pools, caches, page faults
            wrk(port, 1, max(connections))
        report(run_rounds(targets, args, connections), targets, args, connections)
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
