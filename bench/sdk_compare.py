#!/usr/bin/env python3
"""The hello service of each SDK (Rust, Go, Python) through Sluice, two ways: dialing in as
sessions (a reverse cluster) vs listening behind Sluice's static cluster (pooled keep-alive).

Each language runs its interop service (crates/sluice-sdk/examples/interop_service.rs,
sdk/go/internal/interopsvc, sdk/python/tests/interop_service.py; the same handler, no delay)
once listening and once dialing in with as many sessions as wrk has connections. Every target
has a Sluice of its own with one worker pinned to CPU 1; wrk and the services share CPU 0.
Rounds are interleaved in rotated order; the table gives the median and min-max of per-round
values, and per language the median of per-round ratios sessions / static.

Usage: bench/sdk_compare.py [--rounds 5] [--seconds 5] [--connections 32]
Builds nothing: cargo build --release --bin sluice --example interop_service -p sluice-cli
  -p sluice-sdk; (cd sdk/go && go build -o ../../target/release/interopsvc-go ./internal/interopsvc);
  the Python package installed in the interpreter given by --python (default: target/venv).
Needs: wrk, taskset.
"""

import argparse
import os
import statistics
import tempfile
import time
import urllib.request

from nginx_compare import ROOT, fmt, free_port, start, wait_port, wrk
from reverse_compare import sluice_conf, start_registered

LANGS = ("rust", "go", "python")


def service_cmd(lang, args):
    return {
        "rust": [os.path.join(ROOT, "target/release/examples/interop_service")],
        "go": [os.path.join(ROOT, "target/release/interopsvc-go")],
        "python": [args.python, os.path.join(ROOT, "sdk/python/tests/interop_service.py")],
    }[lang]


def wait_ok(port, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"no 200 through port {port}")


def setup(lang, args, tmp, procs):
    """Starts both targets of `lang`; returns {target name: proxy port}."""
    cmd = service_cmd(lang, args)
    svc = free_port()
    procs.append(start(cmd + ["--listen", f"127.0.0.1:{svc}", "--acceptor", "unused:0",
                              "--service", "hello", "--instance", lang, "--capacity", "1"], 0))
    wait_port(svc)
    static = free_port()
    conf = sluice_conf(tmp, f"{lang}-static", static,
                       f'[cluster.hello]\nkind = "static"\nendpoints = ["127.0.0.1:{svc}"]\n')
    procs.append(start([args.sluice, "run", "-c", conf], 1))
    reverse, acceptor = free_port(), free_port()
    conf = sluice_conf(tmp, f"{lang}-reverse", reverse, '[cluster.hello]\nkind = "reverse"\n')
    with open(conf, "a") as f:
        f.write(f'\n[acceptor]\nlisten = "127.0.0.1:{acceptor}"\n')
    procs.append(start([args.sluice, "run", "-c", conf], 1))
    wait_port(acceptor)
    procs.append(start_registered(cmd + ["--acceptor", f"127.0.0.1:{acceptor}", "--service",
                                         "hello", "--instance", lang, "--capacity",
                                         str(args.connections)], args.connections))
    wait_ok(static)
    wait_ok(reverse)
    return {f"{lang}-static": static, f"{lang}-sessions": reverse}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--sluice", default=os.path.join(ROOT, "target/release/sluice"))
    ap.add_argument("--python", default=os.path.join(ROOT, "target/venv/bin/python"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sluice-sdk-bench-")
    procs, targets = [], {}
    try:
        for lang in LANGS:
            targets.update(setup(lang, args, tmp, procs))
        names = list(targets)
        results = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                wrk(targets[name], 1, args.connections)  # warm-up
                results[name].append(wrk(targets[name], args.seconds, args.connections))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        report(results, args)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def report(results, args):
    print(f"\nwrk -t1 -c{args.connections} -d{args.seconds}s x {args.rounds} rounds; each Sluice "
          "1 worker on CPU 1, wrk + services on CPU 0; median (min-max)")
    print(f"{'target':<18}{'RPS':>24}{'p99 us':>24}{'non-2xx':>9}")
    for name, rows in results.items():
        rps, p99 = [r[0] for r in rows], [r[2] for r in rows]
        print(f"{name:<18}{fmt(rps):>24}{fmt(p99):>24}{sum(r[3] for r in rows):>9}")
    print("\nsessions / static, per round: median (min-max)")
    for lang in LANGS:
        s, t = results[f"{lang}-sessions"], results[f"{lang}-static"]
        rps = [a[0] / b[0] for a, b in zip(s, t)]
        p99 = [a[2] / b[2] for a, b in zip(s, t)]
        print(f"  {lang:<8} RPS {fmt(rps, 2)}   p99 {fmt(p99, 2)}   "
              f"(median RPS {statistics.median(x[0] for x in s):.0f} vs {statistics.median(x[0] for x in t):.0f})")


if __name__ == "__main__":
    main()
