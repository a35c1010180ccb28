"""h2load -c4 -m100 over TLS against each proxy: its CPU per request, user and system, in
interleaved rounds. Usage: measure.py ROUNDS SECONDS name=pid:port ... (one must be haproxy)."""

import os
import re
import statistics as st
import subprocess
import sys

HZ = os.sysconf("SC_CLK_TCK")


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) / HZ, int(f[12]) / HZ


def main():
    rounds, secs = int(sys.argv[1]), int(sys.argv[2])
    targets = dict(a.split("=") for a in sys.argv[3:])
    res = {}
    for r in range(rounds):
        names = list(targets)
        names = names[r % len(names):] + names[:r % len(names)]
        for n in names:
            pid, port = targets[n].split(":")
            a = cpu(int(pid))
            cmd = ["taskset", "-c", "1", "h2load", "-c4", "-m100", "-D", str(secs),
                   f"https://127.0.0.1:{port}/"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            b = cpu(int(pid))
            done = int(re.search(r"(\d+) succeeded", out).group(1))
            u, s = (b[0] - a[0]) * 1e6 / done, (b[1] - a[1]) * 1e6 / done
            res.setdefault(n, []).append((u, s))
            print(f"r{r} {n:8} {done / secs:8.0f} rps  user {u:5.2f} sys {s:5.2f} us/req",
                  flush=True)
    base = res["haproxy"]
    for n, v in res.items():
        rat = sorted((u + s) / (bu + bs) for (u, s), (bu, bs) in zip(v, base))
        user, system = st.median(x[0] for x in v), st.median(x[1] for x in v)
        print(f"{n:8} user {user:5.2f} sys {system:5.2f} "
              f"vs haproxy {st.median(rat):.2f} ({rat[0]:.2f}-{rat[-1]:.2f})")


if __name__ == "__main__":
    main()
