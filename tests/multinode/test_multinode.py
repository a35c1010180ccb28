"""Many nodes, one declared capacity (issue 27): three real Sluice nodes in a network namespace
of the test's own, named together by `nodes.test`, and a service in each SDK language that
dials `dns:nodes.test:PORT` with capacity N. Under client load skewed to one node and then
flipped, a node killed and restarted, N shrunk and grown, and a node removed from the name:

* no service ever has more than N requests in its handler at once (each counts its own);
* the sessions follow the demand (the busiest node holds the most at the end of a skew), and
  stay where they are once no request comes;
* a dead node's share moves to the others, and a restarted one joins again;
* a node removed from the name is drained with no request failing;
* a node restarted under load says ready only once it can serve, and a rolling restart of
  all three fails no request;
* two instances of one service (6 + 4) serve an 80/10/10 skew at 0.8 of their capacity.

The scenario runs inside the namespace (`scenario.py`); this file builds what it needs, makes
and removes the namespace, and judges what the scenario saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(REPO / "tests/interop"))

from harness import prebuilt_or_build  # noqa: E402
from netns import namespace  # noqa: E402

# The whole scenario is bounded: each of its waits fails after 60 s, its loads last seconds.
SCENARIO_LIMIT = 600


@pytest.fixture(scope="module")
def binaries(tmp_path_factory) -> dict[str, str]:
    sluice = prebuilt_or_build("sluice-cli", "--bin", "sluice")
    rust = prebuilt_or_build("sluice-sdk", "--example", "multinode")
    out = tmp_path_factory.mktemp("bin")
    go = out / "multinode-go"
    subprocess.run(["go", "build", "-o", str(go), "./examples/multinode"], cwd=REPO / "sdk/go", check=True)
    python = f"{sys.executable} {REPO / 'sdk/python/examples/multinode.py'}"
    return {"sluice": str(sluice), "go": str(go), "python": python, "rust": str(rust)}


def run_scenario(binaries: dict[str, str]) -> dict:
    with namespace() as (name, hosts):
        argv = ["ip", "netns", "exec", name, sys.executable, str(HERE / "scenario.py"),
                "--sluice", binaries["sluice"], "--go", binaries["go"], "--python", binaries["python"],
                "--rust", binaries["rust"], "--hosts", str(hosts)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SCENARIO_LIMIT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the scenario printed nothing:\n{done.stdout}\n{done.stderr}"
    seen = json.loads(lines[-1])
    # The error first: the dump's tail is the nodes' logs.
    assert "error" not in seen, seen.get("error", "") + "\n" + json.dumps(seen, indent=1)[-6000:]
    return seen


@pytest.fixture(scope="module")
def seen(binaries) -> dict:
    return run_scenario(binaries)


def test_a_service_in_each_sdk_language_took_part(seen):
    assert sorted(seen["max_in_flight"]) == ["go", "py", "rs"], seen["max_in_flight"]
    assert sorted(seen["steps"]["capacity"]) == ["go", "py", "rs"], seen["steps"]["capacity"]


def test_no_service_ever_has_more_in_flight_than_it_declared(seen):
    for cluster, most in seen["max_in_flight"].items():
        assert most is not None and 1 <= most <= seen["capacity"], (cluster, most)


def test_every_node_gets_a_session_at_start(seen):
    for cluster, at in seen["steps"]["start"].items():
        assert sum(at) == seen["capacity"] and min(at) >= 1, (cluster, at)


@pytest.mark.parametrize("step", ["skew", "flip"])
def test_sessions_follow_the_queue(seen, step):
    s = seen["steps"][step]
    for cluster, at in s["end"].items():
        busiest = s["busiest"]
        assert at[busiest] == max(at) and at[busiest] > seen["capacity"] // 3, (step, cluster, at)


@pytest.mark.parametrize("step", ["quiet", "mixed_quiet"])
def test_no_sdk_moves_a_session_at_zero_demand(seen, step):
    """Issue 46: after a load every SDK moved a session about once a second with no request
    at all (the smoothed demand never reaches 0, and the ratios of its tails swung). Quiet,
    the split stays as the load left it: each service's after the flip, each instance's of
    the two after their skew."""
    samples = seen["steps"][step]["samples"]
    assert len(samples) >= 10, samples
    for cluster in samples[0]:
        splits = [s[cluster] for s in samples]
        assert all(at == splits[0] for at in splits), (cluster, splits)


def test_a_dead_nodes_share_moves_and_it_joins_again(seen):
    for cluster, windows in seen["steps"]["kill"]["windows"].items():
        # Clients used only the nodes that stayed: none of their requests failed.
        assert sum(w["failed"] for w in windows) == 0, (cluster, windows)


def test_a_node_removed_from_the_name_is_drained_without_a_failed_request(seen):
    s = seen["steps"]["leave"]
    for cluster, windows in s["windows"].items():
        assert sum(w["failed"] for w in windows) == 0, (cluster, windows)
        assert sum(w["ok"] for w in windows) > 0
    for cluster, at in s["end"].items():
        assert at[2] == 0 and sum(at) == seen["capacity"], (cluster, at)


def test_capacity_follows_runtime_changes(seen):
    for cluster, c in seen["steps"]["capacity"].items():
        assert sum(c["at_2"]) == 2 and sum(c["at_n"]) == seen["capacity"], (cluster, c)


def test_a_killed_nodes_share_moves_at_once_not_after_its_grace(seen):
    """Issue 46: the share moved only after `node_grace` (5 s). A closed link and a refused
    connect are a definite death: well within half the grace, in every SDK."""
    moved = seen["steps"]["kill"]["moved_after"]
    assert sorted(moved) == ["go", "py", "rs"], moved
    for cluster, after in moved.items():
        assert after < 2.5, (cluster, after, "seconds after the kill")


def test_a_restarted_node_refuses_nothing_once_it_says_ready(seen):
    """Issue 46: a restarted node said ready and answered 503 "no sessions" until the
    services found it (~7 s). It is ready once each service has a session there."""
    step = seen["steps"]["kill"]
    for cluster, at in step["joined_when_ready"].items():
        assert at >= 1, (cluster, at, "sessions on the node when it said ready")
    for cluster, windows in step["restarted"].items():
        assert sum(w["ok"] for w in windows) == sum(w["sent"] for w in windows) > 0, (cluster, windows)


def test_a_rolling_restart_under_load_fails_no_request(seen):
    """Issue 46: each node in turn drained and stopped (SIGTERM) at once under load, with
    the requests sent to it still in flight or queued there, then started: no request of any
    service fails or is refused (the queued ones were refused 503 while the services closed
    their sessions at a stopping node's DRAINING)."""
    step = seen["steps"]["rolling"]
    for cluster, windows in step["windows"].items():
        bad = [(second, w) for second, w in enumerate(windows) if w["ok"] != w["sent"]]
        assert not bad and sum(w["sent"] for w in windows) > 0, (cluster, bad, step["events"])


def test_two_unequal_instances_of_one_service_serve_their_capacity(seen):
    """Issue 46: two instances (6 + 4) of one service, in two SDKs, under an 80/10/10 skew at
    0.8 of their capacity: each keeps within what it declared, and at least 95 % of the
    requests of the settled last 6 s are answered (90.3 % when the step ran with the third
    node out of the name, where the leave step left it: its 10 % were refused)."""
    step = seen["steps"]["mixed"]
    assert step["max"]["mix-py"] <= 6 and step["max"]["mix-go"] <= 4, step["max"]
    last = [w for w in step["windows"] if w["sent"]][-6:]
    ok, sent = sum(w["ok"] for w in last), sum(w["sent"] for w in last)
    assert sent > 0 and ok >= 0.95 * sent, (ok, sent, step["windows"], step["instances"][-4:])
