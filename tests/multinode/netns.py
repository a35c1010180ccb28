"""A network namespace for one run: its own loopback (so 127.0.0.2-4 and fixed ports are
private to the run) and its own `/etc/hosts` (`ip netns exec` bind-mounts
`/etc/netns/NAME/hosts` over it), where `nodes.test` names every node. Removed on exit, also
on failure. Needs root and iproute2."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from fleet import NAME, NODES


def hosts_text(nodes: list[str]) -> str:
    lines = ["127.0.0.1 localhost"] + [f"{ip} {NAME}" for ip in nodes]
    return "\n".join(lines) + "\n"


@contextmanager
def namespace():
    """Yields (name, hosts file): the namespace, and the file to rewrite (in place: the
    processes inside see it through a bind mount of this very file) to change what
    `nodes.test` names."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise RuntimeError("the many-node test needs root and iproute2 (ip netns)")
    name = f"slmn-{os.getpid()}-{secrets.token_hex(3)}"
    etc = Path("/etc/netns") / name
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        etc.mkdir(parents=True)
        hosts = etc / "hosts"
        hosts.write_text(hosts_text(NODES))
        yield name, hosts
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)
        shutil.rmtree(etc, ignore_errors=True)


def rewrite(hosts: Path, nodes: list[str]) -> None:
    """Changes what `nodes.test` names, in place (same inode: the bind mount follows it)."""
    with open(hosts, "r+") as f:
        f.seek(0)
        f.write(hosts_text(nodes))
        f.truncate()
