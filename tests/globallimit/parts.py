"""The real parts of the global rate-limit tests: Debian's `redis-server`, Envoy's reference
rate-limit service (`envoyproxy/ratelimit`, built from the Go module proxy on first use and
kept under the cargo target directory), and debug `sluice` nodes, each started with a
configuration of its own on ports the OS gave. Nothing stands in for any of them."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "multinode"))

from fleet import wait_for
from harness import prebuilt_or_build

REPO = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
# The reference service, pinned: the newest commit on its main branch when this was written
# (it tags no releases since v1.4.0, of 2019).
RATELIMIT_MODULE = "github.com/envoyproxy/ratelimit"
RATELIMIT_VERSION = "v1.4.1-0.20260122083618-3fb702589d36"
DOMAIN = "sluice-e2e"
# The fleet's limit: per tenant (a request field's value), per minute, across every node.
LIMIT = 50
# Generous: a slow machine must not fail a correct run. Never a timing assertion.
WAIT = 60.0


def free_port() -> int:
    """A port the OS has just handed out (and taken back) for a service that cannot be told
    to bind port 0 and say which it got."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Proc:
    """A child process whose output lines are collected as they arrive."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None):
        self.name = name
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, text=True,
                                      env={**os.environ, **(env or {})}, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_line(self, pattern: str) -> re.Match:
        """The first line (past or future) that matches `pattern`; fails after WAIT."""
        deadline = time.monotonic() + WAIT
        with self._cond:
            while True:
                for line in self.lines:
                    if m := re.search(pattern, line):
                        return m
                if self.popen.poll() is not None:
                    raise AssertionError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no line like {pattern!r} in {WAIT}s:\n{self.tail()}")
                self._cond.wait(min(left, 0.5))

    def tail(self, n: int = 30) -> str:
        with self._cond:
            return "\n".join(self.lines[-n:])

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to anyone."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=WAIT)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def sluice_binary() -> Path:
    """`SLUICE_BIN` (the test command's debug build), else the debug build, built here."""
    return prebuilt_or_build("sluice-cli", "--bin", "sluice")


def ratelimit_binary() -> Path:
    """The reference service at the pinned version, built once per target directory."""
    out = TARGET / "ratelimit" / RATELIMIT_VERSION
    binary = out / "service_cmd"
    if not binary.exists():
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(["go", "install", f"{RATELIMIT_MODULE}/src/service_cmd@{RATELIMIT_VERSION}"],
                       env={**os.environ, "GOBIN": str(out), "GOFLAGS": "-mod=mod"}, check=True)
    return binary


def redis_binary() -> str:
    found = shutil.which("redis-server")
    assert found, "redis-server is missing: apt-get install redis-server (scripts/test does)"
    return found


class Redis:
    """A `redis-server` of its own, in memory only, on a port kept across restarts."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc = Proc("redis", [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no", "--protected-mode", "no"])
        wait_for(f"redis on {self.port}", lambda: accepts(self.port))


RATELIMIT_CONFIG = f"""\
domain: {DOMAIN}
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: {LIMIT}
  # bench/run --only global-limit's: counted in Redis like any limit, never reached.
  - key: bench
    rate_limit:
      unit: hour
      requests_per_unit: 1000000000
"""


class RateLimitService:
    """`envoyproxy/ratelimit` with its counters in `redis`, its configuration in `root`."""

    def __init__(self, binary: Path, root: Path, redis: Redis, grpc: int | None = None):
        config = root / "runtime" / "ratelimit" / "config"
        config.mkdir(parents=True, exist_ok=True)
        (config / "config.yaml").write_text(RATELIMIT_CONFIG)
        self.grpc = grpc or free_port()
        env = {
            "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(self.grpc),
            "HOST": "127.0.0.1", "PORT": str(free_port()),
            "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(free_port()),
            "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": f"127.0.0.1:{redis.port}",
            "USE_STATSD": "false", "LOG_LEVEL": "info",
            "RUNTIME_ROOT": str(root / "runtime"), "RUNTIME_SUBDIRECTORY": "ratelimit",
            "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
            "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
        }
        self.proc = Proc("ratelimit", [str(binary)], env=env)
        wait_for(f"the rate-limit service on {self.grpc}", lambda: accepts(self.grpc))


def node_config(grpc: int, timeout: str = "2s") -> str:
    """One node: a route behind both tiers (a local bucket per tenant, 40 at once and then
    40 an hour, then the fleet's limit), and one route per failure mode behind the global tier
    alone. Direct responses: the tiers are what is tested, not an upstream."""
    services = "".join(
        f'[rate_limit_service.{mode}]\naddress = "127.0.0.1:{grpc}"\ndomain = "{DOMAIN}"\n'
        f'timeout = "{timeout}"\nfailure_mode = "{mode}"\n'
        for mode in ("open", "closed")
    )
    tenant = '[[{ key = "tenant", from = "header:x-tenant" }]]'
    routes = "".join(
        f'[[route]]\nname = "{name}"\npath_prefix = "/{name}/"\n'
        f'direct_response = {{ status = 200, body = "ok\\n" }}\n{local}'
        f'global_rate_limit = {{ service = "{service}", descriptors = {tenant} }}\n'
        for name, service, local in (
            ("tiers", "open", 'rate_limit = { rate = "40/h", burst = 40, key = "header:x-tenant" }\n'),
            ("open", "open", ""),
            ("closed", "closed", ""),
        )
    )
    return (
        '[runtime]\nshutdown_grace = "1s"\n[admin]\nlisten = "127.0.0.1:0"\n'
        '[[listener]]\nname = "public"\nlisten = "127.0.0.1:0"\n'
        f"{services}{routes}"
    )


@dataclass
class Answer:
    status: int
    headers: dict[str, str]


class Node:
    """A `sluice run` of its own: its listener's and admin API's addresses from its log."""

    def __init__(self, binary: Path, dir: Path, name: str, config: str):
        dir.mkdir(parents=True, exist_ok=True)
        path = dir / f"{name}.toml"
        path.write_text(config)
        self.proc = Proc(name, [str(binary), "run", "-c", str(path), "--log-format", "json"],
                         env={"RUST_LOG": "info"})
        self.port = int(self.proc.wait_line(r'"message":"listening".*?"addr":"127\.0\.0\.1:(\d+)"').group(1))
        self.admin = int(self.proc.wait_line(r'"admin\.addr":"127\.0\.0\.1:(\d+)"').group(1))

    def get(self, path: str, tenant: str, conn: http.client.HTTPConnection | None = None) -> Answer:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            conn.request("GET", path, headers={"x-tenant": tenant})
            res = conn.getresponse()
            res.read()
            return Answer(res.status, {k.lower(): v for k, v in res.getheaders()})
        finally:
            if own:
                conn.close()

    def burst(self, path: str, tenant: str, count: int) -> list[Answer]:
        """`count` requests one after another on one connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            return [self.get(path, tenant, conn) for _ in range(count)]
        finally:
            conn.close()

    def calls(self) -> dict[tuple[str, str], float]:
        """`sluice_global_rate_limit_calls_total` by (route, result), from `/metrics`."""
        conn = http.client.HTTPConnection("127.0.0.1", self.admin, timeout=WAIT)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        out = {}
        for m in re.finditer(r'^sluice_global_rate_limit_calls_total\{([^}]*)\} (\S+)$', text, re.MULTILINE):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels["route"], labels["result"])] = float(m.group(2))
        return out


def dump(*procs: Proc) -> str:
    return "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)

