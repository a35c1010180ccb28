"""The lines of a control link (protocol/README.md "The control link"), sans I/O but for
:class:`LineReader`: what a node reports (``DEMAND``, ``DRAINING``, ``FLOOR``) and what a
service asks (``RETIRE``, ``CAPACITY``). ASCII, one ``\\n`` at the end, at most
:data:`MAX_LINE` bytes, words separated by one space, numbers decimal without sign or leading
zeros."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .errors import ProtocolError

#: The longest line either side may send, without its ``\n``.
MAX_LINE = 128
#: A link silent this long is lost (three missed one-second heartbeats).
SILENCE = 3.0
#: The largest count a line may carry (an unsigned 64-bit integer, as every SDK reads it).
MAX_COUNT = 2**64 - 1
READ_SIZE = 4096


@dataclass(frozen=True)
class Demand:
    """One slice's demand at one node, all instances together."""

    in_flight: int
    queued: int
    refused: int
    sessions: int

    @property
    def sample(self) -> float:
        """What a service smooths: in flight, queued and refused together."""
        return float(self.in_flight + self.queued + self.refused)


@dataclass(frozen=True)
class Draining:
    """``DRAINING``: the node takes no new sessions and ends those it has."""


@dataclass(frozen=True)
class Floor:
    """``FLOOR <0|1>``: whether the node counts on this instance for its floor of one session
    (sent only to links that said ``Sluice-Split: service``)."""

    on: bool


NodeLine = Demand | Draining | Floor


class InvalidLine(ProtocolError):
    """A line that is not one of the protocol's: the link closes and is dialed again."""

    def __init__(self, line: str) -> None:
        super().__init__(f"invalid control line {line[:MAX_LINE]!r}")
        self.line = line


class LinkClosed(ProtocolError):
    """The node closed the control link."""


def parse_node_line(line: str) -> NodeLine:
    """Reads one line from a node (without its ``\\n``)."""
    words = _words(line)
    if words == ["DRAINING"]:
        return Draining()
    if len(words) == 5 and words[0] == "DEMAND":
        counts = [_number(w, line) for w in words[1:]]
        return Demand(*counts)
    if len(words) == 2 and words[0] == "FLOOR" and words[1] in ("0", "1"):
        return Floor(words[1] == "1")
    raise InvalidLine(line)


def parse_service_line(line: str) -> tuple[str, int]:
    """Reads one line from a service: ``("retire", n)`` (n ≥ 1) or ``("capacity", n)``."""
    words = _words(line)
    if len(words) == 2 and words[0] == "RETIRE":
        n = _number(words[1], line)
        if n == 0:
            raise InvalidLine(line)
        return "retire", n
    if len(words) == 2 and words[0] == "CAPACITY":
        return "capacity", _number(words[1], line)
    raise InvalidLine(line)


def retire(n: int) -> bytes:
    """``RETIRE <n>\\n``: close ``n`` (≥ 1) of this instance's sessions at the node."""
    assert n >= 1
    return f"RETIRE {n}\n".encode()


def capacity(n: int) -> bytes:
    """``CAPACITY <n>\\n``: the instance's declared capacity now."""
    return f"CAPACITY {n}\n".encode()


def smooth(last: float | None, sample: float) -> float:
    """Half way from the last smoothed demand to ``sample`` (the first sample as it is)."""
    return sample if last is None else last + (sample - last) / 2.0


def _words(line: str) -> list[str]:
    ok = 0 < len(line) <= MAX_LINE and all(0x20 <= ord(c) <= 0x7E for c in line)
    words = line.split(" ")
    if not ok or "" in words:
        raise InvalidLine(line)
    return words


def _number(word: str, line: str) -> int:
    digits = word.isascii() and word.isdigit()
    if not digits or (len(word) > 1 and word[0] == "0") or int(word) > MAX_COUNT:
        raise InvalidLine(line)
    return int(word)


class LineReader:
    """Reads a link's lines from ``reader``, after the bytes in ``rest`` (read past the
    ``101``)."""

    def __init__(self, reader: asyncio.StreamReader, rest: bytes = b"") -> None:
        self._reader = reader
        self._buf = bytearray(rest)

    async def next_line(self) -> str:
        """The next line without its ``\\n``; raises :class:`LinkClosed` at EOF and
        :class:`InvalidLine` for more than :data:`MAX_LINE` bytes without one, or non-ASCII."""
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                raw = bytes(self._buf[:end])
                del self._buf[: end + 1]
                if not raw.isascii():
                    raise InvalidLine(raw.decode("latin-1"))
                return raw.decode("ascii")
            if len(self._buf) > MAX_LINE:
                raise InvalidLine(self._buf.decode("latin-1"))
            data = await self._reader.read(READ_SIZE)
            if not data:
                raise LinkClosed("the node closed the control link")
            self._buf += data
