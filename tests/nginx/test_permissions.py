"""Workers of another user (Debian's NGINX runs its workers as www-data): the acceptor's
`[handoff] mode` and `group` let them open the socket and `allowed_uids` lets their uid in;
without either, the worker's log says what to set. Runs as root (it starts NGINX workers as
`nobody`), as scripts/test does."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Built, Nginx
from harness import TOKEN, WAIT, Proc, start_service

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts NGINX workers as another user")

ACCEPTOR = """
[acceptor]
listen = "127.0.0.1:0"
handshakes_per_second = 0

[handoff]
listen = "{socket}"
{handoff}

[cluster.interop]
kind = "reverse"
tokens = ["env:INTEROP_TOKEN"]
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may pass through (a test's own tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="sluice-handoff-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def nobody() -> tuple[int, str]:
    pw = pwd.getpwnam("nobody")
    return pw.pw_uid, grp.getgrgid(pw.pw_gid).gr_name


def start_acceptor(built: Built, tmp: Path, socket: Path, handoff: str) -> tuple[Proc, str]:
    config = tmp / "acceptor.toml"
    config.write_text(ACCEPTOR.format(socket=socket, handoff=handoff))
    proc = Proc("acceptor", [str(built.bins.sluice), "acceptor", "-c", str(config), "--log-format", "json"],
                env={"INTEROP_TOKEN": TOKEN, "RUST_LOG": "info"})
    line = proc.wait_line(lambda l: '"message":"acceptor running"' in l, "the acceptor running")
    proc.wait_line(lambda l: '"message":"handoff socket listening"' in l, "the handoff socket")
    return proc, json.loads(line)["fields"]["acceptor.addr"].removeprefix("Some(").removesuffix(")")


def test_workers_of_another_user_connect_with_mode_group_and_allowed_uids(
    built: Built, tmp_path: Path, open_dir: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    uid, group = nobody()
    sock = open_dir / "handoff.sock"
    acceptor, addr = start_acceptor(built, tmp_path, sock,
                                    f'mode = "0660"\ngroup = "{group}"\nallowed_uids = [{uid}]')
    procs.append(acceptor)
    assert (sock.stat().st_mode & 0o777, grp.getgrgid(sock.stat().st_gid).gr_name) == (0o660, group)
    procs.append(start_service(built.bins, "go", addr, "go", 2, 0))
    nginx = nginx_factory(sock, workers=1, idle=2, user=f"user nobody {group};")
    nginx.wait_connected(1)
    with urllib.request.urlopen(f"http://{nginx.addr[0]}:{nginx.addr[1]}/work", timeout=WAIT) as res:
        assert res.status == 200 and res.read() == b"go\n"


def test_a_worker_that_may_not_open_the_socket_says_what_to_set(
    built: Built, tmp_path: Path, open_dir: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    uid, group = nobody()
    sock = open_dir / "handoff.sock"
    acceptor, _ = start_acceptor(built, tmp_path, sock, "")  # 0600, the acceptor's own group
    procs.append(acceptor)
    nginx = nginx_factory(sock, workers=1, idle=1, user=f"user nobody {group};")
    line = nginx.proc.wait_line(lambda l: "may not open the acceptor's socket" in l, "the worker's warning")
    assert 'set mode = "0660" and group =' in line and f"list uid {uid} in allowed_uids" in line, line


def test_a_worker_whose_uid_is_not_allowed_says_to_allow_it(
    built: Built, tmp_path: Path, open_dir: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    uid, group = nobody()
    sock = open_dir / "handoff.sock"
    acceptor, _ = start_acceptor(built, tmp_path, sock, f'mode = "0660"\ngroup = "{group}"')
    procs.append(acceptor)
    nginx = nginx_factory(sock, workers=1, idle=1, user=f"user nobody {group};")
    line = nginx.proc.wait_line(lambda l: "closed the connection before its HELLO" in l, "the worker's warning")
    assert f"list uid {uid} in its [handoff] allowed_uids" in line, line
    line = acceptor.wait_line(lambda l: "handoff connection refused" in l, "the acceptor's warning")
    assert "add it to [handoff] allowed_uids" in line and f'"uid":{uid}' in line, line
