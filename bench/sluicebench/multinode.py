"""The `multinode` scenario: bench/multinode.py (three nodes, one capacity split by demand in
each SDK, by one instance and by two of unequal capacity, against an even static split, under
skewed and flipped load; then a rolling restart under load) inside a network namespace of its
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
PYTHON_SRC = os.path.join(ROOT, "sdk", "python", "src")


def python_example(env):
    """The Python SDK's example as a command, with `env` made to import the SDK from this tree
    (None: this interpreter lacks what the SDK needs: its way is not run)."""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_SRC, env.get("PYTHONPATH")) if p)
    if subprocess.run([sys.executable, "-c", "import sluice_sdk"], env=env,
                      capture_output=True, check=False).returncode != 0:
        return None
    return f"{sys.executable} {os.path.join(ROOT, 'sdk', 'python', 'examples', 'multinode.py')}"


def multinode(b):
    from netns import namespace  # tests/multinode

    phase, rounds = SETTINGS.get(b.p.name, SETTINGS["quick"])
    go = os.path.join(b.work, "multinode-go")
    subprocess.run(["go", "build", "-o", go, "./examples/multinode"],
                   cwd=os.path.join(ROOT, "sdk", "go"), check=True)
    sluice = targets.binary("sluice")
    rust = os.path.join(os.path.dirname(sluice), "examples", "multinode")
    env = dict(os.environ)
    python = python_example(env)
    for sdk, there in (("python", python), ("rust", os.path.isfile(rust))):
        if not there:
            b.say(f"multinode: no {sdk} SDK example here, its ways are not run")
    with namespace() as (name, _hosts):
        argv = ["ip", "netns", "exec", name, sys.executable,
                os.path.join(ROOT, "bench", "multinode.py"), "--sluice", sluice, "--go", go,
                "--python", python or "", "--rust", rust if os.path.isfile(rust) else "",
                "--phase", str(phase), "--rounds", str(rounds)]
        # The smoke leaves the rolling restart to tests/multinode, which the test command runs
        # just before it (the same step, asserted there): the bench smoke keeps its budget.
        if b.p.name != "smoke":
            argv.append("--rolling")
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=1800,
                              env=env)
    if done.returncode != 0:
        raise RuntimeError(f"multinode: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for r in out["rounds"]:
        for way, v in r.items():
            each = "+".join(str(m) for m in v.get("max_in_flight_each", [v["max_in_flight"]]))
            declared = "+".join(str(k) for k in v.get("instances", [v["declared"]]))
            b.say(f"multinode {way:16} goodput skew {v['goodput_skew']:.3f} flip "
                  f"{v['goodput_flip']:.3f} recovery {_s(v['recovery_s'])}, sessions moved "
                  f"{_s(v['sessions_moved_s'])}, max in flight {each}/{declared}, "
                  f"503s {v['refused_503']}")
    for sdk, v in out.get("rolling", {}).get("sdks", {}).items():
        b.say(f"multinode rolling {sdk:7} {v['requests']} requests, {v['failed']} failed "
              f"({v['refused_503']} 503s), max in flight {v['max_in_flight']}/{v['declared']}")
    return out


def _s(seconds):
    return "never" if seconds is None else f"{seconds:.2f} s"
