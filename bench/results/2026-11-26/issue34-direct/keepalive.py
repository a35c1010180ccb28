"""CPU per request, keep-alive: wrk -t1 -c32 over plaintext, interleaved rounds.
Usage: keepalive.py ROUNDS SECONDS name=pid:port ... (one must be nginx)."""
import re
import statistics as st
import subprocess
import sys
from pathlib import Path

# The same CPU reading as the new-connection runs: ../issue34-close/by-hand/measure.py.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "issue34-close" / "by-hand"))
from measure import cpu  # noqa: E402


def main():
    rounds, secs = int(sys.argv[1]), int(sys.argv[2])
    targets = dict(a.split("=", 1) for a in sys.argv[3:])
    res = {}
    for r in range(rounds):
        names = list(targets)
        names = names[r % len(names):] + names[:r % len(names)]
        for n in names:
            pid, port = targets[n].split(":")
            a = cpu(int(pid))
            out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", "-c32", f"-d{secs}s",
                                  f"http://127.0.0.1:{port}/"], capture_output=True, text=True,
                                 check=True).stdout
            b = cpu(int(pid))
            reqs = int(re.search(r"(\d+) requests in", out).group(1))
            per = (b[0] - a[0]) * 1e6 / reqs
            res.setdefault(n, []).append(per)
            print(f"r{r} {n:8} {reqs / secs:8.0f} rps {per:6.2f} us/req", flush=True)
    base = res["nginx"]
    for n, v in res.items():
        ratios = sorted(x / y for x, y in zip(v, base))
        print(f"{n:8} median {st.median(v):6.2f} us  vs nginx {st.median(ratios):.2f} "
              f"({ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
