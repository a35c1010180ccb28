#!/usr/bin/env python3
"""Sessions through the in-process acceptor vs the multi-process topology (docs/design.md §4).

Targets, each serving the same Rust hello service (interop_service, no delay) that dials in
with as many sessions as wrk has connections:
  in-process    one `sluice run` with its own [acceptor]
  handoff       `sluice acceptor` (the service dials this) lending the sessions to one
                `sluice run` consumer over the handoff socket (`handoff = PATH`)
The proxy that serves requests (the single Sluice, or the consumer) has one worker pinned to
CPU 1; the standalone acceptor, wrk and the service run on CPU 0. Rounds are interleaved in
rotated order; the table gives the median and min-max of per-round values and the per-round
ratio handoff / in-process.

Usage: bench/handoff_compare.py [--rounds 5] [--seconds 5] [--connections 32]
Builds nothing: cargo build --release --bin sluice --example interop_service -p sluice-cli -p sluice-sdk
Needs: wrk, taskset.
"""

import argparse
import os
import tempfile

from nginx_compare import ROOT, cpu_seconds, fmt, free_port, start, wait_port, wrk
from reverse_compare import start_registered
from sdk_compare import wait_ok

SERVICE = os.path.join(ROOT, "target/release/examples/interop_service")


def write(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def service(acceptor, capacity):
    return [SERVICE, "--acceptor", f"127.0.0.1:{acceptor}", "--service", "hello",
            "--instance", "hello", "--capacity", str(capacity)]


def in_process(args, tmp, procs):
    port, acceptor = free_port(), free_port()
    conf = write(tmp, "in-process.toml", f"""[runtime]\nworkers = 1\n
[acceptor]\nlisten = "127.0.0.1:{acceptor}"\n
[[listener]]\nname = "bench"\nlisten = "127.0.0.1:{port}"\n
[[route]]\ncluster = "hello"\n\n[cluster.hello]\nkind = "reverse"\n""")
    proxy = start([args.sluice, "run", "-c", conf], 1)
    procs.append(proxy)
    wait_port(acceptor)
    procs.append(start_registered(service(acceptor, args.connections), args.connections))
    wait_ok(port)
    return port, proxy.pid


def handoff(args, tmp, procs):
    port, acceptor = free_port(), free_port()
    sock = os.path.join(tmp, "handoff.sock")
    conf = write(tmp, "acceptor.toml", f"""[acceptor]\nlisten = "127.0.0.1:{acceptor}"\n
[handoff]\nlisten = "{sock}"\n\n[cluster.hello]\nkind = "reverse"\n""")
    procs.append(start([args.sluice, "acceptor", "-c", conf], 0))
    wait_port(acceptor)
    conf = write(tmp, "consumer.toml", f"""[runtime]\nworkers = 1\n
[[listener]]\nname = "bench"\nlisten = "127.0.0.1:{port}"\n
[[route]]\ncluster = "hello"\n
[cluster.hello]\nkind = "reverse"\nhandoff = "{sock}"\nhandoff_idle = 4\n""")
    consumer = start([args.sluice, "run", "-c", conf], 1)
    procs.append(consumer)
    procs.append(start_registered(service(acceptor, args.connections), args.connections))
    wait_ok(port)
    return port, consumer.pid


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target/release/sluice"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sluice-handoff-bench-")
    procs = []
    try:
        targets = {"in-process": in_process(args, tmp, procs), "handoff": handoff(args, tmp, procs)}
        names = list(targets)
        results = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % 2:] + names[:r % 2]:
                port, pid = targets[name]
                wrk(port, 1, args.connections)  # warm-up
                before = cpu_seconds(pid)
                rps, total, p99, non2xx = wrk(port, args.seconds, args.connections)
                cpu_us = (cpu_seconds(pid) - before) / total * 1e6
                results[name].append((rps, p99, cpu_us, non2xx))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        report(results, args)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def report(results, args):
    print(f"\nwrk -t1 -c{args.connections} -d{args.seconds}s x {args.rounds} rounds; serving "
          "proxy 1 worker on CPU 1; median (min-max)")
    print(f"{'target':<12}{'RPS':>24}{'p99 us':>24}{'proxy CPU us/req':>22}{'non-2xx':>9}")
    for name, rows in results.items():
        cols = [fmt([r[i] for r in rows], 1 if i == 2 else 0) for i in range(3)]
        print(f"{name:<12}{cols[0]:>24}{cols[1]:>24}{cols[2]:>22}{sum(r[3] for r in rows):>9}")
    h, i = results["handoff"], results["in-process"]
    print("\nhandoff / in-process, per round: "
          f"RPS {fmt([a[0] / b[0] for a, b in zip(h, i)], 2)}   "
          f"p99 {fmt([a[1] / b[1] for a, b in zip(h, i)], 2)}   "
          f"CPU/req {fmt([a[2] / b[2] for a, b in zip(h, i)], 2)}")


if __name__ == "__main__":
    main()
