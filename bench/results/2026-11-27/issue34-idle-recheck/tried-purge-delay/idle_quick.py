"""By hand: the idle scenario's rounds for one mode and chosen targets, interleaved; run from the
repository's root as `target/venv/bin/python .../idle_quick.py plain 10000 4 sluice,sluice-b`
(with SLUICE_B set for the `-b` targets). The scenario's own functions (bench/sluicebench/idle.py)."""

import statistics
import sys
import tempfile
import types

sys.path.insert(0, "bench")
from sluicebench import idle, tls  # noqa: E402

mode, n, rounds, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
work = tempfile.mkdtemp(prefix="idleq-")
b = types.SimpleNamespace(work=work)
idle._raise_nofile(n + 4096)
pem = tls._certificate(work, "ecdsa")
res = {t: [] for t in names}
for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
        run = idle._round(b, name, mode, pem, n)
        res[name].append(run["per_conn_kib"])
        print(f"round {r + 1} {name:10} {run['per_conn_kib']:.2f} KiB/conn returned {run['returned']:.0%} "
              f"peak {run['peak_mib']:.1f} MiB failed {run['failed']}", flush=True)
for name, v in res.items():
    print(f"{name:10} median {statistics.median(v):.2f} min {min(v):.2f} max {max(v):.2f}")
