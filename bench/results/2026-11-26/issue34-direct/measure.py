"""CPU per new connection: wrk -t1 -c32 -H 'Connection: close', plain and TLS, interleaved
rounds. Usage: measure.py ROUNDS SECONDS name=pid:plainport:tlsport ... (one must be nginx)."""

import os
import re
import statistics as st
import subprocess
import sys

HZ = os.sysconf("SC_CLK_TCK")


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ, int(f[11]) / HZ, int(f[12]) / HZ


def run(pid, url, secs):
    a = cpu(pid)
    cmd = ["taskset", "-c", "1", "wrk", "-t1", "-c32", f"-d{secs}s", "-H", "Connection: close",
           url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    b = cpu(pid)
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    per = [(y - x) * 1e6 / reqs for x, y in zip(a, b)]
    return reqs / secs, per


def main():
    rounds, secs = int(sys.argv[1]), int(sys.argv[2])
    targets = dict(arg.split("=", 1) for arg in sys.argv[3:])
    res = {}
    for r in range(rounds):
        names = list(targets)
        names = names[r % len(names):] + names[:r % len(names)]
        for scheme in ("http", "https"):
            for n in names:
                pid, plain, tls = targets[n].split(":")
                port = plain if scheme == "http" else tls
                rps, (c, u, k) = run(int(pid), f"{scheme}://127.0.0.1:{port}/", secs)
                res.setdefault((scheme, n), []).append(c)
                print(f"r{r} {scheme:5} {n:8} {rps:8.0f} rps {c:6.1f} us/conn "
                      f"(user {u:5.1f} sys {k:5.1f})", flush=True)
    for scheme in ("http", "https"):
        base = res[(scheme, "nginx")]
        for n in targets:
            v = res[(scheme, n)]
            ratios = sorted(a / b for a, b in zip(v, base))
            print(f"{scheme:5} {n:8} median {st.median(v):6.1f} us  vs nginx "
                  f"{st.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
