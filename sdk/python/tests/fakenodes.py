"""Fake Sluice nodes for the many-node tests: each is an acceptor and a small proxy, as the real
node behaves (crates/sluice-reverse): registered sessions wait in an idle pool, a request leases
one or waits in a queue, a control link reports ``DEMAND`` every 100 ms while it changes (and
every second anyway), after a ``FLOOR`` when the link said ``Sluice-Split: service`` and the test
set one, ``RETIRE n`` closes idle sessions at once and busy ones when their response ends, and
``DRAINING`` is said when the node stops. A :class:`Tally` across nodes
records, at every registration and close, the sessions open everywhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import h11

from fakes import SWITCH, refusal

CONTROL_SWITCH = (b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                  b"Upgrade: sluice-control/1\r\n\r\n")
OLD_ACCEPTOR = (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 28\r\nConnection: close\r\n\r\n"
                b"not a session handshake: /x\n")


class Tally:
    """Sessions open at every node, checked at each change: the sum guarantee's witness."""

    def __init__(self) -> None:
        self.nodes: list[FakeNode] = []
        self.max_open = 0
        self.changed = asyncio.Event()

    def open(self) -> int:
        return sum(len(n.open) for n in self.nodes)

    def note(self) -> None:
        self.max_open = max(self.max_open, self.open())
        self.changed.set()
        self.changed = asyncio.Event()

    async def until(self, ready: Any) -> None:
        """Returns once ``ready()`` holds, re-checked at each change at any node."""
        while not ready():
            await self.changed.wait()


@dataclass(eq=False)
class NodeSession:
    """The node's side of one registered session."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    headers: dict[str, str]
    conn: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    watcher: asyncio.Task[None] | None = None
    closed_by_service: bool = False


@dataclass
class Answer:
    status: int
    body: bytes
    closes: bool


class FakeNode:
    """One node; :meth:`start` listens on 127.0.0.1:0 (or ``port``)."""

    def __init__(self, tally: Tally, *, auto_demand: bool = True) -> None:
        self.tally = tally
        tally.nodes.append(self)
        self.auto_demand = auto_demand
        self.addr = ""
        self.server: asyncio.Server | None = None
        self.open: set[NodeSession] = set()
        self.idle: list[NodeSession] = []
        self.busy: set[NodeSession] = set()
        self.waiters: deque[asyncio.Future[NodeSession]] = deque()
        self.owed = 0
        self.refused_count = 0
        #: Statuses for the next control links (then ``link_status``), and for registrations.
        self.link_answers: list[int] = []
        self.link_status = 101
        self.register_status = 101
        self.links: list[FakeLink] = []
        self.link_attempts = 0
        self.registrations = 0
        self.retires: list[int] = []
        #: RETIREs to ignore (as if lost, or spent on a session that ended for another reason).
        self.ignore_retires = 0
        self.capacities: list[int] = []
        #: ``FLOOR`` said first on each link of an SDK that splits by service (``None``: none,
        #: as an older node).
        self.floor: int | None = None
        self.closed_by_service = 0
        self.stopping = False
        #: Hung (a wedged process, a partition, a hot restart's new process not up yet):
        #: connections are taken but never answered.
        self.stall = False
        self.stalled: list[asyncio.StreamWriter] = []
        self.drains: list[dict[str, str]] = []
        self._conns: set[asyncio.StreamWriter] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, port: int = 0, ssl: Any = None) -> str:
        self.stopping = False
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port, ssl=ssl)
        host, port = self.server.sockets[0].getsockname()[:2]
        self.addr = f"{host}:{port}"
        return self.addr

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def kill(self) -> None:
        """Dies: stops listening and drops every connection (sessions and links)."""
        assert self.server is not None
        self.server.close()
        for s in list(self.open):
            s.writer.transport.abort()
            self._gone(s)
        self.idle.clear()
        for link in self.links:
            link.writer.transport.abort()

    def drop_links(self) -> None:
        """Its control links end (the process went away or the network dropped them); the
        listener and the sessions stay."""
        for link in self.links:
            link.writer.transport.abort()

    def say_draining(self) -> None:
        """Only says ``DRAINING`` (and then nothing), keeping its sessions: what the service
        does about them is its own doing."""
        for link in self.live_links():
            link.quiet = True
            link.send(b"DRAINING\n")

    def close_idle(self, n: int) -> None:
        """Closes ``n`` idle sessions, as a stopping node closes those no queued request
        needs."""
        for s in list(self.idle)[:n]:
            self._close(s)

    def stop(self) -> None:
        """Stops for good as the real node does: ``DRAINING`` on every link, no new sessions,
        idle ones closed now and busy ones after their response (the real node hands them to
        its queued requests first, and keeps one idle per slice until it exits; this one
        has no queue)."""
        self.stopping = True
        for link in self.live_links():
            link.send(b"DRAINING\n")
        for s in list(self.idle):
            self._close(s)

    def live_links(self) -> list[FakeLink]:
        return [link for link in self.links if not link.closed.is_set()]

    async def wait_link(self, n: int = 1) -> FakeLink:
        """The ``n``-th link (1-based) once it is up."""
        while len(self.links) < n:
            await self._changed()
        return self.links[n - 1]

    async def _changed(self) -> None:
        await self.tally.changed.wait()

    # -- connections ----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.stall:
            self.stalled.append(writer)
            self.tally.note()
            return  # open and unanswered until the dialer gives up
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        line, *lines = head.decode().split("\r\n")
        headers = {k.lower(): v for k, _, v in (h.partition(": ") for h in lines if h)}
        if line.startswith("GET /.sluice/v1/control "):
            await self._control(reader, writer, headers)
        elif line.startswith("POST /.sluice/v1/drain "):
            self.drains.append(headers)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\ndraining\n")
            writer.close()
            for s in list(self.idle):
                self._close(s)
            self.owed += len(self.busy)
        else:
            self._register(reader, writer, headers)

    def _register(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  headers: dict[str, str]) -> None:
        status = 503 if self.stopping else self.register_status
        if status != 101:
            writer.write(refusal(status))
            writer.close()
            return
        self.registrations += 1
        writer.write(SWITCH)
        session = NodeSession(reader, writer, headers)
        self._conns.add(writer)
        self.open.add(session)
        self.tally.note()
        self._checkin(session, closes=False)

    async def _control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       headers: dict[str, str]) -> None:
        self.link_attempts += 1
        status = self.link_answers.pop(0) if self.link_answers else self.link_status
        if status == 400:
            writer.write(OLD_ACCEPTOR)
            writer.close()
            self.tally.note()
            return
        if status != 101:
            writer.write(refusal(status))
            writer.close()
            self.tally.note()
            return
        writer.write(CONTROL_SWITCH)
        if self.floor is not None and headers.get("sluice-split") == "service":
            writer.write(f"FLOOR {self.floor}\n".encode())
        link = FakeLink(self, reader, writer, headers)
        self.links.append(link)
        self.tally.note()
        await link.run()

    # -- the pool -------------------------------------------------------------------------

    def _checkin(self, s: NodeSession, closes: bool) -> None:
        if s not in self.open:
            return
        if closes or self.stopping:
            return self._close(s)
        if self.owed > 0:
            self.owed -= 1
            return self._close(s)
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(s)
                return
        self.idle.append(s)
        s.watcher = asyncio.ensure_future(self._watch(s))
        self.tally.note()

    async def _watch(self, s: NodeSession) -> None:
        """An idle session: EOF means the service closed it."""
        with contextlib.suppress(ConnectionError):
            while await s.reader.read(65536):
                pass
        if s in self.idle:
            self.idle.remove(s)
            self.closed_by_service += 1
            s.closed_by_service = True
            self._gone(s)

    def _close(self, s: NodeSession) -> None:
        if s in self.idle:
            self.idle.remove(s)
        if s.watcher is not None:
            s.watcher.cancel()
        s.writer.close()
        self._gone(s)

    def _gone(self, s: NodeSession) -> None:
        self.busy.discard(s)
        self._conns.discard(s.writer)
        if s in self.open:
            self.open.discard(s)
            self.tally.note()

    def retire(self, n: int) -> None:
        """``RETIRE n``: idle sessions close now, busy ones when their response ends."""
        self.retires.append(n)
        if self.ignore_retires > 0:
            self.ignore_retires -= 1
            return
        closed = 0
        while closed < n and self.idle:
            self._close(self.idle[0])
            closed += 1
        self.owed += n - closed

    async def _lease(self) -> NodeSession:
        while self.idle:
            s = self.idle.pop(0)
            if s.watcher is not None:
                s.watcher.cancel()
                await asyncio.gather(s.watcher, return_exceptions=True)
            if s in self.open:
                return s
        waiter: asyncio.Future[NodeSession] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self.tally.note()
        try:
            return await waiter
        finally:
            self.tally.note()

    async def request(self, path: str = "/") -> Answer:
        """What a client of this node gets: a session's answer (waiting in the queue as long
        as it takes), or a 502 if the session ended under the request."""
        s = await self._lease()
        self.busy.add(s)
        self.tally.note()
        try:
            answer = await _exchange(s, path)
        except (ConnectionError, h11.ProtocolError, AssertionError):
            self._gone(s)
            s.writer.close()
            return Answer(502, b"", True)
        self.busy.discard(s)
        if not answer.closes:
            s.conn.start_next_cycle()
        self._checkin(s, answer.closes)
        return answer

    def demand(self) -> tuple[int, int, int, int]:
        queued = sum(1 for w in self.waiters if not w.done())
        return (len(self.busy), queued, self.refused_count, len(self.open))


async def _exchange(s: NodeSession, path: str) -> Answer:
    data = s.conn.send(h11.Request(method="GET", target=path, headers=[("Host", "app")]))
    data += s.conn.send(h11.EndOfMessage())
    s.writer.write(data)
    await s.writer.drain()
    head: Any = None
    body = b""
    while True:
        event = s.conn.next_event()
        if event is h11.NEED_DATA:
            chunk = await s.reader.read(65536)
            if not chunk:
                raise ConnectionError("the session closed under the request")
            s.conn.receive_data(chunk)
        elif isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            closes = any(k == b"connection" and b"close" in v.lower() for k, v in head.headers)
            return Answer(head.status_code, body, closes)
        else:
            raise ConnectionError(f"unexpected {event!r}")


class FakeLink:
    """The node's side of one control link."""

    def __init__(self, node: FakeNode, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, headers: dict[str, str]) -> None:
        self.node = node
        self.reader = reader
        self.writer = writer
        self.headers = headers
        self.lines: list[str] = []
        self.closed = asyncio.Event()
        #: Says nothing more (after DRAINING, or to test silence).
        self.quiet = False

    def send(self, line: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(line)

    def demand(self, in_flight: int, queued: int, refused: int = 0, sessions: int = 0) -> None:
        self.send(f"DEMAND {in_flight} {queued} {refused} {sessions}\n".encode())

    async def run(self) -> None:
        reporter = None
        if self.node.auto_demand:
            reporter = asyncio.ensure_future(self._report())
        try:
            while line := await self.reader.readline():
                text = line.decode().rstrip("\n")
                self.lines.append(text)
                verb, _, n = text.partition(" ")
                if verb == "RETIRE":
                    self.node.retire(int(n))
                elif verb == "CAPACITY":
                    self.node.capacities.append(int(n))
                self.node.tally.note()
        except ConnectionError:
            pass
        finally:
            if reporter is not None:
                reporter.cancel()
            self.writer.close()
            self.closed.set()
            self.node.tally.note()

    async def _report(self) -> None:
        """As the real node: at once, every 100 ms while it changes, every second anyway."""
        last = None
        sent_at = 0.0
        loop = asyncio.get_running_loop()
        while not self.node.stopping:
            if self.quiet:
                return
            now = self.node.demand()
            if now != last or loop.time() - sent_at >= 1.0:
                self.demand(*now)
                self.node.refused_count = 0
                last, sent_at = now, loop.time()
            await asyncio.sleep(0.1)
