"""The `cache` scenario (issue 52): a response cache's CPU per request, Sluice's route `cache`
against NGINX `proxy_cache`, one worker each in front of the same kind of backend, keep-alive
clients (wrk -t1), rounds interleaved.

* **hit**: every request is a hit of one memory-resident object (13 bytes, `Cache-Control:
  public, max-age=3600` from the backend), stored by one request before the runs. The
  backend must see no request during a run (checked). NGINX's cache files live in a tmpfs
  (/dev/shm) when there is one, so its hits read memory too, as Sluice's do.
* **mix**: a hit-rate mix through a wrk script: of every ten requests eight ask for one of
  `HOT_KEYS` cacheable keys (`max-age=3600`) and two for an answer the backend marks
  `no-store` (a fresh key each, as a personalised page). What the proxy's CPU per request is
  and what share of the requests reaches the backend (the upstream's load).

`sluice-cache-b` is a second, identical Sluice: its ratio to `sluice-cache` is the session's
noise floor (A/A). The ratio that counts is Sluice's CPU per request over NGINX's in the same
round.
"""

import dataclasses
import os
import subprocess
import tempfile
import time
import urllib.request

from . import load
from .procs import PROXY_CPU, Group, free_port, wait_port
from .targets import KEEPALIVE, SERVICE, Backend, Target, _backend, _nginx_conf, _sluice, _sluice_conf

TARGETS = ("sluice-cache", "sluice-cache-b", "nginx-cache")
HIT_PATH = "/?max_age=3600"
HOT_KEYS = 100
CONNECTIONS = 16
MEMORY = "256MiB"

# Eight of every ten requests are one of HOT_KEYS cacheable keys, two a fresh no-store one.
_MIX = f"""-- The cache scenario's hit-rate mix.
local n = 0
request = function()
  n = n + 1
  local path
  if n % 10 < 8 then
    path = "/?k=" .. (n % {HOT_KEYS}) .. "&max_age=3600"
  else
    path = "/?u=" .. n .. "&no_store=1"
  end
  return wrk.format("GET", path)
end
"""


def _sluice_cache(group, tmp, name, port, upstream):
    conf = _sluice_conf(tmp, name, port, free_port(), f"""[cluster.{SERVICE}]
kind = "static"
endpoints = ["127.0.0.1:{upstream}"]
pool = {{ max_idle_per_endpoint = {KEEPALIVE} }}
""", route=f'cache = {{ memory = "{MEMORY}" }}')
    return group.start(name, [_sluice(name), "run", "-c", conf], PROXY_CPU).pid


def _nginx_cache(group, tmp, name, port, upstream):
    # NGINX's cache as its users set it up for this: the default key, a lock (Sluice
    # coalesces misses too), keep-alive to the backend; files in memory where a tmpfs is.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tmp
    files = tempfile.mkdtemp(prefix=f"{name}-", dir=shm)
    conf = _nginx_conf(
        tmp, name, port, "",
        f"server 127.0.0.1:{upstream}; keepalive {KEEPALIVE}; keepalive_requests 1000000;",
        'proxy_http_version 1.1; proxy_set_header Connection ""; proxy_cache bench; '
        "proxy_cache_lock on; add_header X-Cache-Status $upstream_cache_status;")
    # proxy_cache_path belongs in `http`: add it before the upstream block.
    with open(conf) as f:
        text = f.read()
    text = text.replace("    upstream backend", f"    proxy_cache_path {files} levels=1:2 "
                        f"keys_zone=bench:16m max_size={MEMORY.replace('MiB', 'm')} "
                        "inactive=1h use_temp_path=off;\n    upstream backend", 1)
    with open(conf, "w") as f:
        f.write(text)
    master = group.start(name, ["nginx", "-c", conf, "-p", tmp], PROXY_CPU)
    return _worker(master.pid), files


def _worker(master, timeout=10.0):
    """NGINX's worker under its master: with a cache, the master also runs a cache manager and
    a cache loader (their CPU is not counted: the loader exits, the manager wakes rarely)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True,
                             check=False).stdout
        for pid in out.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"worker process" in f.read():
                        return int(pid)
            except OSError:
                continue
        time.sleep(0.05)
    raise RuntimeError(f"nginx {master} has no worker process")


def _start(group, tmp, name):
    stats, upstream, port = free_port(), free_port(), free_port()
    served = _backend(group, f"{name}-backend", Backend(), stats,
                      ["--listen", f"127.0.0.1:{upstream}"], "listening")
    if name.startswith("nginx"):
        pid, _files = _nginx_cache(group, tmp, name, port, upstream)
    else:
        pid = _sluice_cache(group, tmp, name, port, upstream)
    wait_port(port)
    return Target(name, port, pid, upstream, stats, backend_pid=served)


def _prime(t):
    """Stores the hit object: asks until an answer says it came from the cache."""
    for _ in range(20):
        with urllib.request.urlopen(f"http://127.0.0.1:{t.port}{HIT_PATH}", timeout=5) as r:
            r.read()
            said = r.headers.get("Cache-Status") or r.headers.get("X-Cache-Status") or ""
            if "hit" in said.lower():
                return
    raise RuntimeError(f"cache: {t.name} never answered {HIT_PATH} from its cache")


def cache(b):
    rounds = {"smoke": 1}.get(b.p.name, b.p.headline_rounds)
    seconds = b.p.seconds
    out = {"connections": CONNECTIONS, "rounds": rounds, "seconds": seconds,
           "hot_keys": HOT_KEYS, "hit": {}, "mix": {}}
    group = Group(b.work)
    script = os.path.join(b.work, "cache-mix.lua")
    with open(script, "w") as f:
        f.write(_MIX)
    try:
        ts = {name: _start(group, b.work, name) for name in TARGETS}
        for t in ts.values():
            _prime(t)
            if b.p.warmup:
                load.wrk(t, CONNECTIONS, seconds=b.p.warmup, path=HIT_PATH, measure=False)
        for kind in ("hit", "mix"):
            runs = out[kind] = {name: [] for name in ts}
            for r in range(rounds):
                for name in load.rotated(ts, r):
                    group.check_alive()
                    if kind == "hit":
                        run = load.wrk(ts[name], CONNECTIONS, seconds=seconds, path=HIT_PATH)
                    else:
                        run = load.wrk(ts[name], CONNECTIONS, seconds=seconds, script=script)
                    runs[name].append(dataclasses.asdict(run))
                    up = run.extra["backend_requests"] / max(run.requests, 1)
                    b.say(f"cache {kind} round {r + 1}/{rounds} {name:15} {run.rps:8.0f} rps  "
                          f"{run.cpu_us_per_req:5.1f} us CPU/req  upstream {up:5.3f}/req  "
                          f"non-2xx+errors {run.non2xx + run.errors}"
                          f"{'  LOAD CPU BUSY' if run.load_saturated else ''}")
    finally:
        group.close()
    return out


def problems(s):
    """What makes a cache run meaningless: errors, no requests, or a hit run that reached the
    backend (the object was not served from the cache)."""
    out = []
    for kind in ("hit", "mix"):
        for name, rs in s.get(kind, {}).items():
            for r in rs:
                if r["requests"] == 0 or r["non2xx"] or r["errors"]:
                    out.append(f"cache {kind}: {name} answered {r['requests']} requests, "
                               f"{r['non2xx']} non-2xx, {r['errors']} socket errors")
                if kind == "hit" and r["extra"]["backend_requests"]:
                    out.append(f"cache hit: {name}'s backend served "
                               f"{r['extra']['backend_requests']} requests")
    return out


def report(s, median_range, ratios, cpu, rps):
    lines = ["## Response cache", "",
             f"Sluice's route `cache` (memory tier, {MEMORY}) against NGINX `proxy_cache` "
             "(files in /dev/shm, `proxy_cache_lock on`, upstream keep-alive), one worker each "
             f"on CPU 1, `wrk -t1 -c{s['connections']}` on CPU 0 with each target's own backend, "
             f"{s['rounds']} round(s) of {s['seconds']} s, targets rotated. **hit**: one stored "
             "13-byte object, every request a hit. **mix**: 8 of 10 requests one of "
             f"{s['hot_keys']} cacheable keys, 2 of 10 a fresh `no-store` key (upstream). "
             "A ratio is the median of per-round ratios (min-max) to the same round's "
             "`nginx-cache`; `sluice-cache-b` is an identical second Sluice (A/A). Upstream/req: "
             "the backend's requests over the client's.", ""]
    for kind in ("hit", "mix"):
        runs = s[kind]
        lines += [f"### {kind}", "", "| target | rps | proxy CPU us/req | CPU vs nginx-cache | "
                  "upstream/req | errors | load CPU busy |", "|---|---|---|---|---|---|---|"]
        for name, rs in runs.items():
            vs = median_range(ratios(rs, runs["nginx-cache"], cpu), 2) if "nginx-cache" in runs else "-"
            up = [r["extra"]["backend_requests"] / max(r["requests"], 1) for r in rs]
            busy = sum(r["load_cpu_busy"] >= 0.95 for r in rs)
            lines.append(f"| {name} | {median_range([rps(r) for r in rs])} | "
                         f"{median_range([cpu(r) for r in rs], 2)} | {vs} | "
                         f"{median_range(up, 3)} | {sum(r['errors'] + r['non2xx'] for r in rs)} "
                         f"| {busy}/{len(rs)} flagged |")
        if {"sluice-cache", "sluice-cache-b"} <= set(runs):
            a, b_ = runs["sluice-cache-b"], runs["sluice-cache"]
            lines += ["", f"A/A, sluice-cache-b / sluice-cache: CPU/req "
                      f"{median_range(ratios(a, b_, cpu), 2)}, rps {median_range(ratios(a, b_, rps), 2)}."]
        lines.append("")
    return lines
