"""Processes for the interop test: the real `sluice` binary and the three SDKs' interop
services, each run as its own process and watched through the lines it prints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
# Generous: a slow CI machine must not fail a correct run. Never a timing assertion.
WAIT = 60.0


class Proc:
    """A child process whose stdout (and stderr) lines are collected as they arrive."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None):
        self.name = name
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.popen = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_line(self, pred: Callable[[str], bool], what: str) -> str:
        """The first line (past or future) that satisfies `pred`; fails the test after WAIT."""
        deadline = time.monotonic() + WAIT
        with self._cond:
            while True:
                for line in self.lines:
                    if pred(line):
                        return line
                if self.popen.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"{self.name} exited ({self.popen.returncode}) before {what}:\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no {what} within {WAIT}s:\n{self.tail()}")
                self._cond.wait(min(left, 0.5))

    def started_ids(self) -> set[str]:
        """The request ids this service printed `start <id>` for."""
        with self._cond:
            return {l.split(" ", 1)[1] for l in self.lines if l.startswith("start ")}

    def tail(self, n: int = 30) -> str:
        with self._cond:
            return "\n".join(self.lines[-n:])

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait_exit(self) -> int:
        try:
            code = self.popen.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {WAIT}s:\n{self.tail()}")
        self._reader.join(timeout=WAIT)
        return code

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


@dataclass
class Binaries:
    sluice: Path
    rust: list[str]
    go: list[str]
    python: list[str]

    def service(self, lang: str) -> list[str]:
        return {"rust": self.rust, "go": self.go, "python": self.python}[lang]


def prebuilt_or_build(package: str, kind: str, name: str) -> Path:
    """A debug binary (`--bin`) or example (`--example`) of this tree: ``$SLUICE_BIN`` for the
    proxy and ``$SLUICE_EXAMPLES/<name>`` for an example when the caller built them already
    (scripts/test does, once, with the features `cargo test --workspace` resolved: building
    one package alone resolves others and compiles the workspace's crates again), else built
    here with cargo (or found up to date)."""
    prebuilt = {"--bin": os.environ.get("SLUICE_BIN") if name == "sluice" else None,
                "--example": os.environ.get("SLUICE_EXAMPLES")}[kind]
    if prebuilt:
        path = Path(prebuilt) / name if kind == "--example" else Path(prebuilt)
        assert path.is_file(), f"{path} is missing: build it, or unset the variable"
        return path
    subprocess.run(["cargo", "build", "--locked", "--quiet", "-p", package, kind, name], cwd=REPO, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug"
    return target / "examples" / name if kind == "--example" else target / name


def build(tmp: Path) -> Binaries:
    """Builds the proxy and the Rust and Go interop services; the Python one runs from source."""
    sluice = prebuilt_or_build("sluice-cli", "--bin", "sluice")
    rust = prebuilt_or_build("sluice-sdk", "--example", "interop_service")
    go_bin = tmp / "interopsvc"
    subprocess.run(["go", "build", "-o", str(go_bin), "./internal/interopsvc"], cwd=REPO / "sdk/go", check=True)
    return Binaries(
        sluice=sluice,
        rust=[str(rust)],
        go=[str(go_bin)],
        python=[sys.executable, str(REPO / "sdk/python/tests/interop_service.py")],
    )


@dataclass
class Sluice:
    proc: Proc
    http: tuple[str, int]
    acceptor: str


CONFIG = """
[acceptor]
listen = "127.0.0.1:0"
handshakes_per_second = 0

[[listener]]
name = "public"
listen = "127.0.0.1:0"

[[route]]
cluster = "interop"

[cluster.interop]
kind = "reverse"
tokens = ["env:INTEROP_TOKEN"]
queue_max = 4096
queue_timeout = "20s"
"""
TOKEN = "interop-s3cret"


def start_sluice(bins: Binaries, tmp: Path, config_text: str = CONFIG, upgrade: bool = False, name: str = "sluice") -> Sluice:
    config = tmp / "sluice.toml"
    config.write_text(config_text)
    argv = [str(bins.sluice), "run", "-c", str(config), "--log-format", "json"]
    proc = Proc(
        name,
        argv + (["--upgrade"] if upgrade else []),
        # Debug for the acceptor: it logs every registration, which is how re-dials are counted.
        env={"INTEROP_TOKEN": TOKEN, "RUST_LOG": "info,sluice_reverse::acceptor=debug"},
    )

    def field_of(message: str, key: str) -> str:
        line = proc.wait_line(lambda l: f'"message":"{message}"' in l, f"the {message!r} log line")
        return json.loads(line)["fields"][key]

    host, port = field_of("listening", "addr").rsplit(":", 1)
    acceptor = field_of("acceptor running", "acceptor.addr").removeprefix("Some(").removesuffix(")")
    return Sluice(proc, (host, int(port)), acceptor)


ACCEPTOR_CONFIG = """
[acceptor]
listen = "{listen}"
handshakes_per_second = 0

[handoff]
listen = "{socket}"

[cluster.interop]
kind = "reverse"
tokens = ["env:INTEROP_TOKEN"]
"""

CONSUMER_CONFIG = """
[[listener]]
name = "public"
listen = "127.0.0.1:0"

[[route]]
cluster = "interop"

[cluster.interop]
kind = "reverse"
handoff = "{socket}"
handoff_idle = 2
queue_max = 4096
queue_timeout = "20s"
"""


def start_acceptor(bins: Binaries, tmp: Path, socket: Path, listen: str = "127.0.0.1:0") -> tuple[Proc, str]:
    """`sluice acceptor`; returns it and its service-facing address."""
    config = tmp / f"acceptor-{listen.replace(':', '_')}.toml"
    config.write_text(ACCEPTOR_CONFIG.format(listen=listen, socket=socket))
    proc = Proc(
        "acceptor",
        [str(bins.sluice), "acceptor", "-c", str(config), "--log-format", "json"],
        env={"INTEROP_TOKEN": TOKEN, "RUST_LOG": "info,sluice_reverse::acceptor=debug"},
    )
    line = proc.wait_line(lambda l: '"message":"acceptor running"' in l, "the acceptor running")
    addr = json.loads(line)["fields"]["acceptor.addr"].removeprefix("Some(").removesuffix(")")
    proc.wait_line(lambda l: '"message":"handoff socket listening"' in l, "the handoff socket")
    return proc, addr


def start_consumer(bins: Binaries, tmp: Path, socket: Path, name: str) -> tuple[Proc, tuple[str, int]]:
    """`sluice run` with a reverse cluster fed by the acceptor at `socket`."""
    config = tmp / f"{name}.toml"
    config.write_text(CONSUMER_CONFIG.format(socket=socket))
    proc = Proc(name, [str(bins.sluice), "run", "-c", str(config), "--log-format", "json"],
                env={"RUST_LOG": "info"})
    line = proc.wait_line(lambda l: '"message":"listening"' in l, "listening")
    host, port = json.loads(line)["fields"]["addr"].rsplit(":", 1)
    return proc, (host, int(port))


def registrations(procs: list[Proc]) -> int:
    """Registrations the acceptors among `procs` logged (each is a service dialing in)."""
    return sum(1 for p in procs for line in p.lines if '"message":"session registered"' in line)


def start_service(bins: Binaries, lang: str, sluice: "Sluice | str", instance: str, capacity: int, delay_ms: int) -> Proc:
    acceptor = sluice if isinstance(sluice, str) else sluice.acceptor
    argv = bins.service(lang) + [
        "--acceptor", acceptor, "--service", "interop", "--instance", instance,
        "--capacity", str(capacity), "--delay-ms", str(delay_ms),
    ]
    env = {"SLUICE_TOKEN": TOKEN, "PYTHONPATH": str(REPO / "sdk/python/src")}
    proc = Proc(instance, argv, env=env)
    proc.wait_line(lambda l: l == f"registered {capacity}", f"'registered {capacity}'")
    return proc


@dataclass
class Result:
    id: str
    status: int  # 0: the connection failed
    body: str
    in_flight: int = 0  # the service's x-in-flight, where it sends one
    retry_after: str | None = None  # the proxy's Retry-After, where it sends one


@dataclass
class Load:
    """Closed-loop load: `clients` threads, each POSTing with a unique X-Request-Id over one
    keep-alive connection until stopped."""

    addr: tuple[str, int]
    clients: int
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> "Load":
        for n in range(self.clients):
            t = threading.Thread(target=self._client, args=(n,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    method: str = "POST"
    # Stale keep-alive connections closed by a server between two requests: retried once on
    # a new connection, as HTTP clients do for idempotent requests (RFC 9112 §9.3.1).
    stale_retries: int = 0

    def _client(self, n: int) -> None:
        import http.client

        conn = http.client.HTTPConnection(*self.addr, timeout=WAIT)
        seq = 0
        while not self._stop.is_set():
            rid = f"c{n}-{seq}"
            seq += 1
            result = self._one(conn, rid)
            if result is None:  # the reused connection had been closed: once more, afresh
                with self._lock:
                    self.stale_retries += 1
                conn.close()
                result = self._one(conn, rid) or Result(rid, 0, "closed before answering")
            with self._lock:
                self.results.append(result)

    def _one(self, conn: "http.client.HTTPConnection", rid: str) -> "Result | None":
        import http.client

        reused = conn.sock is not None
        body = b"payload" if self.method == "POST" else None
        try:
            conn.request(self.method, "/work", body=body, headers={"X-Request-Id": rid})
            res = conn.getresponse()
            result = Result(rid, res.status, res.read().decode(errors="replace").strip(),
                            int(res.getheader("x-in-flight", "0")), res.getheader("retry-after"))
            if res.getheader("connection", "").lower() == "close":
                conn.close()
            return result
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
            conn.close()
            if reused and self.method == "GET":
                return None
            return Result(rid, 0, repr(e))
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            return Result(rid, 0, repr(e))

    def count(self) -> int:
        with self._lock:
            return len(self.results)

    def wait_for(self, more: int) -> None:
        """Waits until `more` further requests have completed (proof the load is flowing)."""
        goal = self.count() + more
        deadline = time.monotonic() + WAIT
        while self.count() < goal:
            if time.monotonic() > deadline:
                raise AssertionError(f"load stalled at {self.count()} requests (wanted {goal})")
            time.sleep(0.01)

    def stop(self) -> list[Result]:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=WAIT)
        with self._lock:
            return list(self.results)


def terminate(proc: Proc) -> int:
    proc.signal(signal.SIGTERM)
    return proc.wait_exit()
