"""The session protocol of docs/design.md §3, sans I/O: the registration, drain and control-link
requests, and the classification of the acceptor's answer. h11 encodes the requests and parses the answer
(as the client of a one-request connection), bounded to 8 KiB of head."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal, Union

import h11

from .errors import H2Unsupported, ProtocolError, Refused

SESSION_PATH = "/.sluice/v1/session"
DRAIN_PATH = "/.sluice/v1/drain"
CONTROL_PATH = "/.sluice/v1/control"
UPGRADE_TOKEN = "sluice-session/1"
CONTROL_TOKEN = "sluice-control/1"
#: ``Sluice-Protocol`` of an HTTP/2 session (protocol/README.md "HTTP/2 sessions").
PROTOCOL_H2 = "h2"
PROTOCOL_HTTP1 = "http/1.1"
#: ``Sluice-Split`` of a control link: this SDK keeps its floor of one session only where a
#: node asks for it (``FLOOR``), as protocol/README.md "The split" says.
SPLIT_BY_SERVICE = "service"
#: The most streams an HTTP/2 session may declare (``Sluice-Streams``).
MAX_STREAMS = 1000
MAX_REPLY_HEAD = 8192
#: The longest reason read from a refusal's body.
MAX_REASON = 512
#: The request header with the client's address as the proxy saw it (its TCP peer).
CLIENT_ADDR_HEADER = b"sluice-client-addr"

Kind = Literal["register", "drain", "control"]


@dataclass(frozen=True)
class Identity:
    """Who is speaking: the cluster, slice and instance, and the credential (``None``: absent)."""

    service: str
    slice: str = "default"
    instance: str | None = None
    token: str | None = None

    def headers(self) -> list[tuple[str, str]]:
        """The identity headers, in the protocol's order."""
        out = [("Sluice-Service", self.service), ("Sluice-Slice", self.slice)]
        if self.instance is not None:
            out.append(("Sluice-Instance", self.instance))
        if self.token is not None:
            out.append(("Authorization", f"Bearer {self.token}"))
        return out


@dataclass(frozen=True)
class Switched:
    """``101``: the connection is a session; ``rest`` was read past the head. ``h2``: the
    session speaks HTTP/2 (the ``101`` named ``Sluice-Protocol: h2``)."""

    rest: bytes
    h2: bool = False


@dataclass(frozen=True)
class Drained:
    """``200`` to a drain request."""


@dataclass(frozen=True)
class Unsupported:
    """``400`` to a control link's request: an acceptor too old to know control links."""


Reply = Union[Switched, Drained, Unsupported]


class Handshake:
    """One registration, drain or control-link exchange: ``request`` holds the bytes to write, and
    :meth:`feed` classifies the answer as it arrives (raising :class:`Refused` or
    :class:`ProtocolError`). A control link says ``Sluice-Split: split`` (``None``: nothing)."""

    def __init__(self, kind: Kind, identity: Identity, capacity: int | None = None,
                 streams: int | None = None, split: str | None = SPLIT_BY_SERVICE) -> None:
        self.kind = kind
        #: ``None``: an HTTP/1.1 session; ``n``: an HTTP/2 session of ``n`` streams.
        self.streams = streams if kind == "register" else None
        split = split if kind == "control" else None
        self._conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_REPLY_HEAD)
        self.request = self._conn.send(_request(kind, identity, capacity, self.streams, split))
        self.request += self._conn.send(h11.EndOfMessage())
        self._received = 0
        self._raw = b""

    def feed(self, data: bytes) -> Reply | None:
        """Takes bytes read from the acceptor (``b""`` at EOF); returns the answer once its head
        is complete, ``None`` while more is needed."""
        self._conn.receive_data(data)
        self._received += len(data)
        if len(self._raw) < MAX_REPLY_HEAD + MAX_REASON:
            self._raw += data
        try:
            event = self._conn.next_event()
        except h11.RemoteProtocolError as e:
            raise ProtocolError(f"malformed acceptor reply: {e}") from None
        if event is h11.NEED_DATA:
            return None
        # h11 bounds only an incomplete head; a whole one read at once must fit as well.
        if self._received - len(self._conn.trailing_data[0]) > MAX_REPLY_HEAD:
            raise ProtocolError(f"acceptor reply head over {MAX_REPLY_HEAD} bytes")
        if isinstance(event, h11.InformationalResponse):
            return self._informational(event)
        if isinstance(event, h11.Response):
            if self.kind == "control" and event.status_code == 400:
                return Unsupported()
            if event.status_code != 200:
                raise Refused(event.status_code, self.reason())
            if self.kind == "drain":
                return Drained()
            raise ProtocolError("200 to a registration")
        raise ProtocolError("the acceptor closed the connection before answering")

    def reason(self, more: bytes = b"") -> str:
        """A refusal's reason: the first line of its body, read so far (plus ``more``), as
        printable text; ``""`` while that line is not complete."""
        self._raw += more
        _, sep, body = self._raw.partition(b"\r\n\r\n")
        if not sep:
            _, _, body = self._raw.partition(b"\n\n")
        line, newline, _ = body[:MAX_REASON].partition(b"\n")
        if not newline and len(body) < MAX_REASON:
            return ""
        text = line.decode("utf-8", "replace").strip()
        return "".join(c for c in text if c.isprintable())

    def _informational(self, event: h11.InformationalResponse) -> Reply:
        if event.status_code != 101:
            raise Refused(event.status_code, self.reason())
        upgrade = [v for k, v in event.headers if k == b"upgrade"]
        token = CONTROL_TOKEN if self.kind == "control" else UPGRADE_TOKEN
        if self.kind == "drain" or [v.lower() for v in upgrade] != [token.encode()]:
            raise ProtocolError(f"101 without Upgrade: {token}")
        rest, _closed = self._conn.trailing_data
        if self.kind == "control":
            return Switched(bytes(rest))
        h2 = _session_protocol(event.headers)
        if self.streams is not None and not h2:
            raise H2Unsupported()
        if self.streams is None and h2:
            raise ProtocolError("an HTTP/2 session's 101 to an HTTP/1.1 registration")
        return Switched(bytes(rest), h2)


def _session_protocol(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a session's ``101`` names ``Sluice-Protocol: h2`` (any case); absent, empty or
    ``http/1.1``: HTTP/1.1. Anything else is not the protocol."""
    named = [v.strip().lower() for k, v in headers if k == b"sluice-protocol"]
    if not named or named[0] in (b"", PROTOCOL_HTTP1.encode()):
        return False
    if named[0] == PROTOCOL_H2.encode():
        return True
    raise ProtocolError(f"101 naming an unknown Sluice-Protocol: {named[0]!r}")


def _request(kind: Kind, identity: Identity, capacity: int | None,
             streams: int | None = None, split: str | None = None) -> h11.Request:
    if kind == "drain":
        head = [("Host", "sluice"), ("Content-Length", "0")]
        return h11.Request(method="POST", target=DRAIN_PATH, headers=head + identity.headers())
    control = kind == "control"
    token, path = (CONTROL_TOKEN, CONTROL_PATH) if control else (UPGRADE_TOKEN, SESSION_PATH)
    head = [("Host", "sluice"), ("Connection", "Upgrade"), ("Upgrade", token)]
    tail = [] if capacity is None else [("Sluice-Capacity", str(capacity))]
    if streams is not None:
        tail += [("Sluice-Protocol", PROTOCOL_H2), ("Sluice-Streams", str(streams))]
    if split is not None:
        tail.append(("Sluice-Split", split))
    return h11.Request(method="GET", target=path, headers=head + identity.headers() + tail)


def registration(identity: Identity, capacity: int | None, streams: int | None = None) -> bytes:
    """The registration request bytes (``capacity=None``: no ``Sluice-Capacity``; ``streams``:
    an HTTP/2 session of that many streams, ``Sluice-Protocol: h2`` and ``Sluice-Streams``)."""
    return Handshake("register", identity, capacity, streams).request


def control_request(identity: Identity, capacity: int,
                    split: str | None = SPLIT_BY_SERVICE) -> bytes:
    """The control link's request bytes (many nodes): the identity, ``Sluice-Capacity`` and
    ``Sluice-Split`` (``None``: without it, as an SDK that knows no ``FLOOR`` writes it)."""
    return Handshake("control", identity, capacity, split=split).request


def drain_request(identity: Identity) -> bytes:
    """The drain request bytes."""
    return Handshake("drain", identity).request


def parse_client_addr(value: bytes) -> tuple[str, int] | None:
    """A ``Sluice-Client-Addr`` value as ``(host, port)``: ``ip:port`` or ``[ipv6]:port``,
    nothing around it, no zone, a decimal port up to 65535. ``None`` for anything else: a value
    is trusted whole or not at all."""
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        return None
    host, colon, port = text.rpartition(":")
    if not colon or not 1 <= len(port) <= 5 or not port.isdigit() or int(port) > 65535:
        return None
    try:
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if "%" in host:  # ipaddress takes a zone; the proxy never sends one
                return None
            ipaddress.IPv6Address(host)
        else:
            ipaddress.IPv4Address(host)
    except ValueError:
        return None
    return (host, int(port))


def client_address(
    headers: list[tuple[bytes, bytes]], peer: tuple[str, int] | None
) -> tuple[str, int] | None:
    """The client a request names in exactly one valid ``Sluice-Client-Addr`` field, else
    ``peer`` (the session's own peer)."""
    values = [v for k, v in headers if k.lower() == CLIENT_ADDR_HEADER]
    claimed = parse_client_addr(values[0]) if len(values) == 1 else None
    return claimed if claimed is not None else peer
