"""The `global-limit` scenario (issue 53): what a fleet-wide rate-limit check costs a request,
and how much of a load the local tier answers alone, with the real parts the tests use
(tests/globallimit/parts.py): Debian's `redis-server`, Envoy's reference service
`envoyproxy/ratelimit` keeping its counters in it, and one Sluice node. All direct responses:
what is measured is the check, not an upstream.

* **latency**: wrk with one connection (one request at a time) against `plain-a` and `plain-b`
  (no global limit: the A/A pair), `global-a` and `global-b` (a global limit counted in Redis
  that the load never reaches: a second A/A pair), each for a few seconds, in rotated order
  round after round. p50 and p99 per route, as ratios to `plain-a` and as the time added.
* **load**: wrk with 16 connections against `plain-a`, `plain-b`, `global-a` and `tiers` (a
  local bucket of 2000/s per tenant first, then the same global limit), one tenant, rotated
  the same way: requests per second as ratios to `plain-a`, CPU per request of the node and
  of the service with Redis, and the share of `tiers`' requests the local tier answered alone
  (wrk's count against the node's `sluice_global_rate_limit_calls_total` for the route).
"""

import os
import sys
import types

from . import load, targets
from .procs import sample_proc

sys.path.insert(0, os.path.join(targets.ROOT, "tests", "globallimit"))

# (rounds, seconds per latency run, seconds per load run) by profile.
SETTINGS = {"smoke": (1, 1, 1), "quick": (3, 3, 3), "full": (5, 5, 5)}
LATENCY_ROUTES = ("plain-a", "plain-b", "global-a", "global-b")
LOAD_ROUTES = ("plain-a", "plain-b", "global-a", "tiers")
LOAD_CONNECTIONS = 16
LOCAL_RATE = 2000  # per second, per tenant, on the `tiers` route
TENANT = "x-tenant: bench"


def node_config(grpc, domain):
    """One listener, one service (failing closed: a failed call shows as 503s, never as a fast
    pass), the routes above."""
    limit = 'global_rate_limit = { service = "rls", descriptors = [[{ key = "bench", value = "x" }]] }\n'
    local = (f'rate_limit = {{ rate = "{LOCAL_RATE}/s", burst = {LOCAL_RATE // 10}, '
             'key = "header:x-tenant" }\n')
    routes = ""
    for name, extra in (("plain-a", ""), ("plain-b", ""), ("global-a", limit),
                        ("global-b", limit), ("tiers", local + limit)):
        routes += (f'[[route]]\nname = "{name}"\npath_prefix = "/{name}/"\n'
                   f'direct_response = {{ status = 200, body = "ok\\n" }}\n{extra}')
    return (
        '[runtime]\nshutdown_grace = "1s"\n[admin]\nlisten = "127.0.0.1:0"\n'
        '[[listener]]\nname = "public"\nlisten = "127.0.0.1:0"\n'
        f'[rate_limit_service.rls]\naddress = "127.0.0.1:{grpc}"\ndomain = "{domain}"\n'
        'timeout = "1s"\nfailure_mode = "closed"\n' + routes
    )


def global_limit(b):
    from pathlib import Path

    from parts import DOMAIN, Node, RateLimitService, Redis, ratelimit_binary  # tests/globallimit

    rounds, lat_s, load_s = SETTINGS.get(b.p.name, SETTINGS["quick"])
    root = Path(b.work) / "global-limit"
    redis = Redis()
    service = node = None
    try:
        service = RateLimitService(ratelimit_binary(), root, redis)
        node = Node(Path(targets.binary("sluice")), root, "node", node_config(service.grpc, DOMAIN))
        out = {"rounds": rounds, "latency_seconds": lat_s, "load_seconds": load_s,
               "load_connections": LOAD_CONNECTIONS, "local_rate": LOCAL_RATE,
               "load_average": {"start": os.getloadavg()},
               "latency": {r: [] for r in LATENCY_ROUTES}, "load": {r: [] for r in LOAD_ROUTES}}
        pids = {"node": node.proc.popen.pid, "service": service.proc.popen.pid,
                "redis": redis.proc.popen.pid}
        if b.p.name != "smoke":  # warm-up: connections, the gRPC channel, Redis keys
            for r in (*LATENCY_ROUTES, "tiers"):
                _wrk(node, r, 1, 1)
        for i in range(rounds):
            for route in load.rotated(LATENCY_ROUTES, i):
                run = _wrk(node, route, 1, lat_s)
                out["latency"][route].append(run)
                b.say(f"global-limit latency round {i + 1}/{rounds} {route:8} p50 "
                      f"{run['latency_us']['p50']:6.0f} us  p99 {run['latency_us']['p99']:6.0f} us"
                      f"  non-2xx {run['non2xx']}")
            for route in load.rotated(LOAD_ROUTES, i):
                run = _measured(node, route, load_s, pids)
                out["load"][route].append(run)
                b.say(f"global-limit load round {i + 1}/{rounds} {route:8} {run['rps']:7.0f} rps"
                      f"  node {run['cpu_us_per_req']['node']:5.1f} us/req  service+redis "
                      f"{run['cpu_us_per_req']['service'] + run['cpu_us_per_req']['redis']:5.1f}"
                      f" us/req  local share {run['local_share']:.3f}")
    finally:
        for part in (node, service, redis):
            if part is not None:
                part.proc.stop()
    out["load_average"]["end"] = os.getloadavg()
    return out


def _wrk(node, route, connections, seconds):
    target = types.SimpleNamespace(name=route, scheme="http", port=node.port)
    run = load.wrk(target, connections, seconds=seconds, path=f"/{route}/", measure=False,
                   headers=(TENANT,))
    return {"target": route, "requests": run.requests, "rps": run.rps,
            "latency_us": run.latency_us, "non2xx": run.non2xx, "errors": run.errors}


def _measured(node, route, seconds, pids):
    """A load run with the parts' CPU per request and the calls the node made for it."""
    calls = _calls(node, route)
    before = {k: sample_proc(pid).cpu_s for k, pid in pids.items()}
    run = _wrk(node, route, LOAD_CONNECTIONS, seconds)
    n = max(run["requests"], 1)
    run["cpu_us_per_req"] = {k: (sample_proc(pid).cpu_s - before[k]) * 1e6 / n
                             for k, pid in pids.items()}
    run["calls"] = _calls(node, route) - calls
    # wrk stops with requests in flight the node may have counted a call for: at most one each.
    run["local_share"] = max(0.0, 1 - run["calls"] / n) if route == "tiers" else 0.0
    return run


def _calls(node, route):
    return sum(v for (r, _result), v in node.calls().items() if r == route)
