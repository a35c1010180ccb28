"""The `multinode` scenario: bench/multinode.py (three nodes, one capacity split by demand
against an even static split, under skewed and flipped load) inside a network namespace of its
own, created and removed here (root and iproute2 needed)."""

import json
import os
import subprocess
import sys

from . import targets

ROOT = targets.ROOT
sys.path.insert(0, os.path.join(ROOT, "tests", "multinode"))

# (seconds of skew and of flip, rounds) by profile.
SETTINGS = {"smoke": (2.0, 1), "quick": (10.0, 2), "full": (15.0, 3)}


def multinode(b):
    from netns import namespace  # tests/multinode

    phase, rounds = SETTINGS.get(b.p.name, SETTINGS["quick"])
    go = os.path.join(b.work, "multinode-go")
    subprocess.run(["go", "build", "-o", go, "./examples/multinode"],
                   cwd=os.path.join(ROOT, "sdk", "go"), check=True)
    sluice = targets.binary("sluice")
    with namespace() as (name, _hosts):
        argv = ["ip", "netns", "exec", name, sys.executable,
                os.path.join(ROOT, "bench", "multinode.py"), "--sluice", sluice, "--go", go,
                "--phase", str(phase), "--rounds", str(rounds)]
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"multinode: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for r in out["rounds"]:
        for way, v in r.items():
            b.say(f"multinode {way:7} goodput skew {v['goodput_skew']:.3f} flip "
                  f"{v['goodput_flip']:.3f} recovery {v['recovery_s']} s, sessions moved "
                  f"{v['sessions_moved_s']} s, max in flight {v['max_in_flight']}/{v['declared']}, "
                  f"503s {v['refused_503']}")
    return out
