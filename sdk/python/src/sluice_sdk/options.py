"""``Options``: where the acceptor is, who this instance is, and how hard to try."""

from __future__ import annotations

import random
import ssl as _ssl
from dataclasses import dataclass, field

from .errors import OptionsError
from .protocol import Identity

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

    ``acceptor`` is ``"host:port"`` (``"[v6]:port"``) or ``"unix:/path"``; there is no default.
    ``instance=None`` lets the acceptor use the peer's IP address; ``token=None`` sends no
    ``Authorization``. ``ssl`` (default ``None``: plaintext) turns on TLS to the acceptor,
    verifying ``server_hostname`` (default: the acceptor's host). ``handshake_timeout`` (default
    5 s) bounds connecting plus the acceptor's answer, together. While an operator holds the
    instance drained (``410``), one registration probes every ``drained_probe`` seconds
    (default 30) so that ``sluice ctl resume`` brings it back. Invalid options raise
    :class:`OptionsError`.
    """

    acceptor: str
    service: str
    slice: str = DEFAULT_SLICE
    instance: str | None = None
    token: str | None = field(default=None, repr=False)
    capacity: int = 1
    ssl: _ssl.SSLContext | None = None
    server_hostname: str | None = None
    backoff: Backoff = field(default_factory=Backoff)
    handshake_timeout: float = 5.0
    drained_probe: float = 30.0

    def __post_init__(self) -> None:
        if not self.service:
            raise OptionsError("service is empty: set it to the name of a reverse cluster in the proxy's config")
        for name in ("service", "slice", "instance", "token"):
            value = getattr(self, name)
            if value is not None:
                header_value(name, value)
        kind, _ = parse_acceptor(self.acceptor)
        if self.ssl is not None and kind == "unix" and not self.server_hostname:
            raise OptionsError("TLS over a unix: acceptor needs server_hostname")
        if not isinstance(self.capacity, int) or self.capacity < 0:
            raise OptionsError("capacity must be a non-negative integer")
        self._validate_timing()

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
        raise OptionsError(f"acceptor must be host:port or unix:/path, not {acceptor!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return "tcp", (host, int(port))
