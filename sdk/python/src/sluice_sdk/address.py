"""What an acceptor address names (protocol/README.md "The acceptor address"): one node
(``host:port`` or ``unix:/path``, as before), every record of a DNS name (``dns:NAME:PORT``), or a
list (``a:7070,b:7070``, or a list of strings in code)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import OptionsError


class InvalidAddress(OptionsError):
    """An acceptor address that names no node; the message says what is wrong."""

    def __init__(self, address: str, why: str) -> None:
        super().__init__(f"invalid acceptor address {address!r}: {why}")
        self.address = address
        self.why = why


@dataclass(frozen=True)
class Single:
    """One node, resolved again on each dial; no control link (the behaviour of one acceptor)."""

    address: str


@dataclass(frozen=True)
class Dns:
    """Every A and AAAA record of ``name``, each a node on ``port``; re-resolved periodically."""

    name: str
    port: int

    def __str__(self) -> str:
        return f"dns:{self.name}:{self.port}"


@dataclass(frozen=True)
class Many:
    """Each ``host:port`` entry, and each address an entry's name resolves to."""

    entries: tuple[str, ...]

    def __str__(self) -> str:
        return ",".join(self.entries)


Address = Single | Dns | Many


def parse(acceptor: str | Sequence[str]) -> Address:
    """Reads an acceptor address, a string or a sequence of ``host:port`` strings; raises
    :class:`InvalidAddress`. A single entry (``"a:7070"`` or ``["a:7070"]``) is one node."""
    if isinstance(acceptor, str):
        if acceptor.startswith("dns:"):
            return _dns(acceptor)
        if "," not in acceptor:
            return Single(acceptor)  # checked as before, by options.parse_acceptor
        entries = [e.strip() for e in acceptor.split(",")]
        text = acceptor
    else:
        entries = list(acceptor)
        text = ",".join(entries)
        if not all(isinstance(e, str) for e in entries):
            raise InvalidAddress(text, "each entry must be a host:port string")
        if len(entries) == 1 and entries[0].startswith("dns:"):
            return _dns(entries[0])
    if len(entries) == 1:
        return Single(entries[0])  # checked as before, by options.parse_acceptor
    for entry in entries:
        _check_entry(text, entry)
    return Many(tuple(entries))


def _dns(text: str) -> Dns:
    name, sep, port = text[len("dns:"):].rpartition(":")
    if not sep:
        raise InvalidAddress(text, "dns: needs NAME:PORT")
    if not name or "," in name or " " in name:
        raise InvalidAddress(text, "dns: needs a name")
    return Dns(name, _port(text, port))


def _check_entry(text: str, entry: str) -> None:
    """One list entry: a non-empty host (a bracketed IPv6 address, or a name or IPv4 address
    without spaces) and a port of 1 to 65535."""
    if not entry:
        raise InvalidAddress(text, "an empty entry")
    if entry.startswith("dns:"):
        raise InvalidAddress(text, "dns: is a whole address, not a list entry")
    host, sep, port = entry.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if not sep or not host or " " in host or "/" in host or (":" in host and not bracketed):
        raise InvalidAddress(text, "each entry needs host:port")
    _port(text, port)


def _port(text: str, port: str) -> int:
    if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidAddress(text, "the port must be 1 to 65535")
    return int(port)


def split_entry(entry: str) -> tuple[str, int]:
    """``(host, port)`` of a checked ``host:port`` entry, the brackets of IPv6 removed."""
    host, _, port = entry.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def is_ip(host: str) -> bool:
    """Whether ``host`` is an IP address literal (needs no resolving)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def node_key(host: str, port: int) -> str:
    """A node's name: ``ip:port``, or ``[ip]:port`` for IPv6."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
