"""Fixtures for the NGINX module suite: the module built with nginx/build.sh, Debian's
`nginx`, `sluice acceptor` and the Go SDK's interop service. Processes come from
tests/interop/harness.py (shared, not copied)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))

from harness import REPO, Binaries, Proc  # noqa: E402


@dataclass
class Built:
    bins: Binaries
    module: Path


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """`sluice` (SLUICE_BIN, else a debug build), the Go interop service and the module
    (SLUICE_NGINX_MODULE, else nginx/build.sh). Fails, never skips, without nginx."""
    assert shutil.which("nginx"), "Debian's nginx is not installed (scripts/test installs it)"
    tmp = tmp_path_factory.mktemp("bin")
    sluice = os.environ.get("SLUICE_BIN")
    if not sluice:
        subprocess.run(["cargo", "build", "--locked", "--quiet", "-p", "sluice-cli", "--bin", "sluice"],
                       cwd=REPO, check=True)
        target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
        sluice = str(target / "debug/sluice")
    go_bin = tmp / "interopsvc"
    subprocess.run(["go", "build", "-o", str(go_bin), "./internal/interopsvc"], cwd=REPO / "sdk/go", check=True)
    module = os.environ.get("SLUICE_NGINX_MODULE")
    if not module:
        out = subprocess.run([str(REPO / "nginx/build.sh")], check=True, capture_output=True, text=True)
        module = out.stdout.strip().splitlines()[-1]
    return Built(Binaries(sluice=Path(sluice).resolve(), rust=[], go=[str(go_bin)], python=[]),
                 Path(module).resolve())


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Every process a test starts, stopped at its end (also when it fails)."""
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        p.stop()
    # Shown by pytest only when the test failed.
    for p in started:
        print(f"---- {p.name} (exit {p.popen.returncode})\n{p.tail(60)}")


NGINX_CONF = """
load_module {module};
daemon off;
master_process on;
worker_processes {workers};
{user}
pid {prefix}/nginx.pid;
error_log stderr info;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;

    upstream interop {{
        sluice_sessions unix:{socket} cluster=interop slice=default
                        idle={idle} queue={queue} queue_timeout={queue_timeout};
    }}

    server {{
        listen 127.0.0.1:{port};
        location / {{
            sluice_pass http://interop;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }}
        location /plain-proxy-pass {{ proxy_pass http://interop; }}
        {extra}
        location = /sluice {{ sluice_status; }}
    }}
}}
"""


class NginxProc(Proc):
    """NGINX's master; stopping it also ends its workers (they outlive a killed master)."""

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.popen.pid)], check=False, capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        workers = self.children()
        self.popen.send_signal(signal.SIGTERM)  # fast shutdown: the master ends its workers
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for pid in workers + self.children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        super().stop()


def free_port() -> int:
    # NGINX cannot listen on port 0 and say which port it got: take one the kernel picks.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Nginx:
    proc: NginxProc
    conf: Path
    prefix: Path
    addr: tuple[str, int]
    workers: int

    def connected(self) -> int:
        """How many times a worker completed the HELLO exchange with an acceptor."""
        return sum("sluice: connected to the acceptor" in line for line in list(self.proc.lines))

    def wait_connected(self, n: int) -> None:
        self.proc.wait_line(lambda _: self.connected() >= n, f"{n} worker connections to the acceptor")

    def reload(self) -> None:
        subprocess.run(["nginx", "-p", str(self.prefix), "-c", str(self.conf), "-s", "reload"], check=True,
                       capture_output=True)

    def worker_pids(self) -> list[int]:
        return self.proc.children()


def start_nginx(built: Built, tmp: Path, socket_path: Path, workers: int = 2, idle: int = 4,
                queue: int = 1024, queue_timeout: str = "20s", extra: str = "",
                user: str | None = None) -> Nginx:
    """NGINX_CONF with these values; `extra` goes into its server block, `user` is the
    workers' `user` directive (by default root's, when the test runs as root)."""
    prefix = tmp / "nginx"
    prefix.mkdir(exist_ok=True)
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(NGINX_CONF.format(
        module=built.module, workers=workers, prefix=prefix, socket=socket_path, idle=idle, queue=queue,
        queue_timeout=queue_timeout, port=port, extra=extra,
        # Workers of a root master run as nobody otherwise, and the handoff socket admits
        # only its own uid.
        user=user if user is not None else "user root;" if os.geteuid() == 0 else ""))
    proc = NginxProc("nginx", ["nginx", "-p", str(prefix), "-c", str(conf)])
    proc.wait_line(lambda line: "start worker process" in line, "its workers")
    return Nginx(proc, conf, prefix, ("127.0.0.1", port), workers)


@pytest.fixture
def nginx_factory(built: Built, tmp_path: Path, procs: list[Proc]) -> Callable[..., Nginx]:
    def make(socket_path: Path, **kw: object) -> Nginx:
        n = start_nginx(built, tmp_path, socket_path, **kw)  # type: ignore[arg-type]
        procs.append(n.proc)
        return n

    return make
