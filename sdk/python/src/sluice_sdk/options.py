"""``Options``: where the acceptor is, who this instance is, and how hard to try."""

from __future__ import annotations

import random
import ssl as _ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from . import address
from .errors import OptionsError
from .protocol import MAX_STREAMS, Identity

#: Resolves a name and port to the nodes' ``(ip, port)`` pairs, in order (every A and AAAA
#: record). The default asks the system resolver (``loop.getaddrinfo``).
Resolver = Callable[[str, int], Awaitable[Sequence[tuple[str, int]]]]

DEFAULT_SLICE = "default"


@dataclass(frozen=True)
class Backoff:
    """Jittered exponential backoff between failed dials.

    Default: 0.1 s doubling up to 5 s, each delay shortened by up to half at random, so that
    many instances do not re-dial a restarted proxy in lockstep.
    """

    initial: float = 0.1
    max: float = 5.0
    jitter: float = 0.5

    def delay(self, attempt: int) -> float:
        """Seconds before retry number ``attempt`` (0-based): ``initial * 2**attempt``, capped
        at ``max``, less a random share of up to ``jitter``."""
        base = min(self.initial * (2 ** min(max(attempt, 0), 31)), self.max)
        return base - base * self.jitter * random.random()


@dataclass(frozen=True)
class Options:
    """Everything :func:`sluice_sdk.serve` needs besides the application.

    ``acceptor`` is ``"host:port"`` (``"[v6]:port"``) or ``"unix:/path"``: one node, as ever.
    Several nodes split the capacity by demand (protocol/README.md "Many nodes"):
    ``"dns:NAME:PORT"`` (every A/AAAA record of NAME, re-resolved every ``resolve_interval``
    seconds, default 10) or a list, ``"a:7070,b:7070"`` or ``["a:7070", "b:7070"]`` (a list is
    kept as the equivalent comma-separated string). A node without a control link for
    ``node_grace`` seconds (default 5) is down and its share moves to the others. ``resolver``
    (default: the system's, ``loop.getaddrinfo``) resolves names to nodes. There is no default
    acceptor.
    ``instance=None`` lets the acceptor use the peer's IP address; ``token=None`` sends no
    ``Authorization``. ``ssl`` (default ``None``: plaintext) turns on TLS to the acceptor,
    verifying ``server_hostname`` (default: the acceptor's host, the ``dns:`` name or each list
    entry's host). ``handshake_timeout`` (default
    5 s) bounds connecting plus the acceptor's answer, together. While an operator holds the
    instance drained (``410``), one registration probes every ``drained_probe`` seconds
    (default 30) so that ``sluice ctl resume`` brings it back. Invalid options raise
    :class:`OptionsError`.
    """

    acceptor: str | Sequence[str]
    service: str
    slice: str = DEFAULT_SLICE
    instance: str | None = None
    token: str | None = field(default=None, repr=False)
    capacity: int = 1
    streams: int | None = None
    ssl: _ssl.SSLContext | None = None
    server_hostname: str | None = None
    backoff: Backoff = field(default_factory=Backoff)
    handshake_timeout: float = 5.0
    drained_probe: float = 30.0
    resolve_interval: float = 10.0
    node_grace: float = 5.0
    resolver: Resolver | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.service:
            raise OptionsError("service is empty: set it to the name of a reverse cluster in the proxy's config")
        for name in ("service", "slice", "instance", "token"):
            value = getattr(self, name)
            if value is not None:
                header_value(name, value)
        self._set_acceptor()
        if isinstance(self.address, address.Single):
            kind, _ = parse_acceptor(self.address.address)
            if self.ssl is not None and kind == "unix" and not self.server_hostname:
                raise OptionsError("TLS over a unix: acceptor needs server_hostname")
        if not isinstance(self.capacity, int) or self.capacity < 0:
            raise OptionsError("capacity must be a non-negative integer")
        if self.streams is not None and (
                isinstance(self.streams, bool) or not isinstance(self.streams, int)
                or not 1 <= self.streams <= MAX_STREAMS):
            raise OptionsError(f"streams must be None (HTTP/1.1 sessions) or a whole number from "
                               f"1 to {MAX_STREAMS} (HTTP/2 sessions), not {self.streams!r}")
        self._validate_timing()

    def _set_acceptor(self) -> None:
        """A list becomes the comma-separated string it stands for (one entry: that entry)."""
        if isinstance(self.acceptor, str):
            return
        entries = list(self.acceptor)
        address.parse(entries)  # says what is wrong with the list itself
        object.__setattr__(self, "acceptor", ",".join(entries))

    @property
    def address(self) -> address.Address:
        """What ``acceptor`` names: one node, a DNS name's records, or a list."""
        assert isinstance(self.acceptor, str)
        return address.parse(self.acceptor)

    @property
    def many(self) -> bool:
        """Whether the acceptor names several nodes (then each gets a control link)."""
        return not isinstance(self.address, address.Single)

    def _validate_timing(self) -> None:
        b = self.backoff
        if not 0 < b.initial <= b.max:
            raise OptionsError("backoff.initial must be positive and at most backoff.max")
        if not 0.0 <= b.jitter <= 1.0:
            raise OptionsError("backoff.jitter must be within 0.0..1.0")
        if not self.handshake_timeout > 0:
            raise OptionsError("handshake_timeout must be positive")
        if not self.drained_probe > 0:
            raise OptionsError("drained_probe must be positive (seconds between probes)")
        if not self.resolve_interval > 0:
            raise OptionsError("resolve_interval must be positive (seconds between resolutions)")
        if not self.node_grace > 0:
            raise OptionsError("node_grace must be positive (seconds a node may lack its link)")

    @property
    def identity(self) -> Identity:
        """The identity sent in every registration and drain request."""
        return Identity(self.service, self.slice, self.instance, self.token)

    @property
    def tls_hostname(self) -> str | None:
        """The name the acceptor's certificate must carry (only with ``ssl``)."""
        if self.ssl is None:
            return None
        if self.server_hostname is not None:
            return self.server_hostname
        assert isinstance(self.acceptor, str)
        kind, where = parse_acceptor(self.acceptor)
        return where[0] if kind == "tcp" else None  # type: ignore[index]


def header_value(name: str, value: str) -> None:
    """Each identity field becomes a header value: visible ASCII only (inner spaces allowed),
    no leading or trailing space, so none can inject a line."""
    ok = all(0x21 <= ord(c) <= 0x7E or c == " " for c in value) and value.strip(" ") == value
    if not ok:
        raise OptionsError(
            f"{name} must be visible ASCII without leading or trailing spaces: {value!r}"
        )


def parse_acceptor(acceptor: str) -> tuple[str, tuple[str, int] | str]:
    """``("unix", path)`` or ``("tcp", (host, port))``; raises :class:`OptionsError`."""
    if acceptor.startswith("unix:"):
        path = acceptor[len("unix:"):]
        if not path:
            raise OptionsError("acceptor unix: path is empty")
        return "unix", path
    host, sep, port = acceptor.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionsError(f"acceptor must be host:port or unix:/path (or, for many nodes, "
                           f"dns:NAME:PORT or host:port,host:port), not {acceptor!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return "tcp", (host, int(port))
