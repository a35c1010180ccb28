"""By hand: the idle scenario's plaintext rounds for chosen targets, interleaved, printing the
RSS readings (KiB) each figure comes from; run from the repository's root as
`target/venv/bin/python .../idle_detail.py 10000 3 sluice,sluice-b` (SLUICE_B set)."""

import sys
import tempfile
import types

sys.path.insert(0, "bench")
from sluicebench import idle, tls  # noqa: E402

n, rounds, names = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
work = tempfile.mkdtemp(prefix="idled-")
b = types.SimpleNamespace(work=work)
idle._raise_nofile(n + 4096)
pem = tls._certificate(work, "ecdsa")
for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
        x = idle._round(b, name, "plain", pem, n)
        print(name, "before", x["before_kib"], "with", x["with_kib"], "after", x["after_kib"],
              "per", round(x["per_conn_kib"], 3), flush=True)
