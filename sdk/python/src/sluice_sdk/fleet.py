"""Many nodes, one capacity (protocol/README.md "Many nodes"): what an instance knows of each
node, the plan that splits its capacity among them, and the rule by which a session slot picks
a node before it dials. No I/O: the control links (``links``) and the resolver (``discovery``)
report here, and the slots ask here; everything runs on one event loop.

The sum guarantee comes from the slots: there are at most N, each holds at most one session,
and a slot dials only while the sessions held everywhere (registered, being dialed, or asked to
retire but not closed yet) number fewer than N.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import control, split
from .control import Demand
from .dial import Endpoint
from .errors import ConnectError, SluiceError
from .options import Backoff
from .report import Report
from .state import Shared

log = logging.getLogger("sluice_sdk")

#: At most one rebalance line a second.
REBALANCE_LOG_EVERY = 1.0
#: After a plan that moved a session for demand (step 5 of the split), plans move none for
#: demand this long: at most one such move a second, however often ``DEMAND`` comes.
MOVE_HOLD = 1.0


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where the fleet reads the time and sets its timers: the event loop, or a test's fake
    clock (``tests/test_fleet_vectors.py`` replays ``protocol/vectors/fleet.json`` on one)."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer: ...


class Session(Protocol):
    """A registered session as a node sees it: whether it retires, and how to close it idle."""

    retired: bool

    @property
    def idle(self) -> bool:
        """No request is under way on it."""

    def close_if_idle(self) -> bool:
        """Closes the session if no request is under way; ``True`` if it did."""


@dataclass(eq=False)
class Node:
    """One node (``ip:port``) and what this instance knows of it."""

    endpoint: Endpoint
    listed: bool = True
    """Still named by the acceptor address (a node that left is vacated, then forgotten)."""
    writer: asyncio.StreamWriter | None = None
    """The control link while it is up."""
    link_gen: int = 0
    """Links to it answered ``101`` so far."""
    heard: bool = False
    """A ``DEMAND`` came (kept while the link is briefly lost, for ``node_grace``)."""
    waited_until: float = 0.0
    """A node of the first resolution holds the first dials back until its first ``DEMAND``,
    a failed link dial, or this loop time (``Fleet.first_wait`` after it joined)."""
    legacy: bool = False
    """Its acceptor answered ``400`` to the link: live with demand 1, retired from here."""
    block: str | None = None
    """``"draining"`` or ``"held"`` (410): not live until a newer link reports ``DEMAND``."""
    block_gen: int = 0
    absent_since: float | None = None
    """Loop time since when it has had no link (``None`` while one is up)."""
    down: bool = False
    """No link for ``node_grace``, or its link's dial refused (nothing listens there): its share
    goes to the others."""
    grace: Timer | None = None
    """Fires ``node_grace`` after the link was lost, unless it is back by then."""
    why: str = ""
    """Why the last link ended or failed."""
    refused: bool = False
    """Its acceptor refused the link for good (400 aside: 401, 404): logged once."""
    demand: float | None = None
    """The smoothed demand (``None`` before the first ``DEMAND``)."""
    asking: bool = False
    """Its last ``DEMAND``'s sample was above 0 (the instance is quiet while no live node's
    is: step 5 then moves sessions only to a node owed its floor that holds none)."""
    floor: bool = True
    """The node asks this instance for its floor of one session: its link's last ``FLOOR``
    (a node that sends none, an older one, asks)."""
    sessions: int = 0
    """Sessions held here: registered or being dialed."""
    dialing: int = 0
    """Session dials under way here."""
    failures: int = 0
    """Session dials here that failed (or sessions that ended unused, unasked) since one last
    registered: the node backs off, not the slot (protocol/README.md, "Back-off")."""
    retry_at: float = 0.0
    """No slot dials here before this (clock time), while ``failures``."""
    asked: int = 0
    """Registered sessions the node was asked to retire (``RETIRE``) that have not ended."""
    local: int = 0
    """Sessions this SDK still has to close itself: idle ones now, busy ones after their
    response, new ones as they register."""
    unborn: int = 0
    """Sessions being dialed here that close as they register, unused (more were being
    dialed than the node should hold: ``RETIRE`` covers only registered sessions)."""
    closing: int = 0
    """Sessions this SDK marked to close (``NodeHooks.retired``) that have not ended."""
    target: int = 0
    open: set[Session] = field(default_factory=set)
    task: asyncio.Future[None] | None = None
    """The task keeping its control link."""
    report: Report = field(init=False)
    """The outages of session dials here (one line each)."""

    def __post_init__(self) -> None:
        self.report = Report(str(self.endpoint))

    def __str__(self) -> str:
        return str(self.endpoint)

    @property
    def live(self) -> bool:
        """Sessions may be dialed here: named, reachable, and neither draining nor held."""
        reachable = self.heard or self.legacy
        return self.listed and reachable and not self.down and self.block is None

    @property
    def retiring(self) -> int:
        """Sessions asked to close, by ``RETIRE`` or by this SDK, that have not ended."""
        return self.asked + self.local + self.unborn + self.closing

    @property
    def held(self) -> int:
        """``h`` of the split: sessions here less those asked to retire."""
        return self.sessions - self.retiring

    @property
    def unasked(self) -> int:
        """Registered sessions here that nobody asked to close yet."""
        return len(self.open) - self.asked - sum(1 for s in self.open if s.retired)

    @property
    def split_demand(self) -> float:
        if self.legacy:
            return 1.0
        return 0.0 if self.demand is None else self.demand

    @property
    def remote(self) -> bool:
        """``RETIRE`` reaches the node: its link is up and it is neither draining nor held."""
        return self.writer is not None and self.block is None

    @property
    def state(self) -> str:
        """One word for people: live, joining, draining, held, down, left or lost (a live node
        whose link is being re-dialed within ``node_grace``)."""
        if not self.listed:
            return "left"
        if self.block is not None:
            return self.block
        if self.down:
            return "down"
        if not (self.heard or self.legacy):
            return "joining"
        if self.writer is None and not self.legacy:
            return "lost"
        return "live"


@dataclass(frozen=True)
class NodeStatus:
    """One node as :attr:`Sessions.nodes` lists it."""

    address: str
    live: bool
    demand: float | None
    """The smoothed demand (in flight + queued + refused at the node); ``None`` before any."""
    held: int
    """Sessions held there: registered or being dialed, less those asked to retire."""
    target: int
    """What the split wants it to hold."""
    retiring: int
    state: str


class Fleet:
    """The nodes of one instance, the split of its capacity, and the slots' choice of node.

    ``start_link(node)`` starts the task keeping a node's control link (``links``); the fleet
    cancels it when the node is forgotten or at :meth:`close`."""

    def __init__(self, shared: Shared, node_grace: float,
                 start_link: Callable[[Node], asyncio.Future[None]],
                 clock: Clock | None = None, first_wait: float = 5.0,
                 backoff: Backoff | None = None) -> None:
        self.shared = shared
        self.node_grace = node_grace
        #: The delays a node backs off by after failed session dials.
        self.backoff = backoff if backoff is not None else Backoff()
        #: How long the first resolution's nodes may hold the first dials back (the handshake
        #: timeout: a link dial answers or fails by then).
        self.first_wait = first_wait
        self.nodes: list[Node] = []
        self.stopping = False
        self.clock: Clock = clock if clock is not None else asyncio.get_running_loop()
        self._start_link = start_link
        self._log = RebalanceLog(self.clock)
        #: Loop time of the last plan that moved a session for demand.
        self._moved_at = float("-inf")
        #: Every listed node refused its link for good: the error ``wait_registered`` raises.
        self.failed: SluiceError | None = None
        #: Called when a node is lost (its link ended, or it went down): the resolver
        #: (``links.Discovery``) looks at the name again soon.
        self.suspect: Callable[[], object] = lambda: None

    @property
    def capacity(self) -> int:
        return self.shared.counts.target

    @property
    def total(self) -> int:
        """Sessions held everywhere: registered, being dialed, or retiring."""
        return sum(n.sessions for n in self.nodes)

    def status(self) -> list[NodeStatus]:
        return [NodeStatus(str(n), n.live, n.demand, n.held, n.target, n.retiring, n.state)
                for n in self.nodes]

    # -- discovery ------------------------------------------------------------------------

    def update(self, endpoints: list[Endpoint]) -> None:
        """The nodes the acceptor address names now, in order: new ones join, missing ones
        leave (vacated, then forgotten once they hold nothing)."""
        named = {str(e): e for e in endpoints}
        for node in self.nodes:
            listed = str(node) in named
            if listed != node.listed:
                log.info("node %s %s", node, "is named again" if listed else
                         f"left the acceptor address: retiring its {node.sessions} sessions")
            node.listed = listed
        known = {str(n) for n in self.nodes}
        # Nodes found before any answered are the first resolution's: the first split waits
        # for them, or every session would go to the first node to answer and most would
        # move right after.
        first = not any(n.heard or n.legacy for n in self.nodes)
        joined = [self._join(e, first) for key, e in named.items() if key not in known]
        if first and joined:
            # Then the slots look again (a no-op once closed).
            self.clock.call_later(self.first_wait, self.plan)
        for node in [n for n in self.nodes if not n.listed and n.sessions == 0]:
            self._forget(node)
        self.plan()

    def _join(self, endpoint: Endpoint, first: bool) -> Node:
        node = Node(endpoint)
        if first:
            node.waited_until = self.clock.time() + self.first_wait
        self.nodes.append(node)
        log.info("node %s joined", node)
        self._absent(node, "no control link yet")
        node.task = self._start_link(node)
        return node

    def _forget(self, node: Node) -> None:
        self.nodes.remove(node)
        log.info("node %s is vacated and forgotten", node)
        _stop(node)

    # -- the control link -----------------------------------------------------------------

    def link_up(self, node: Node, writer: asyncio.StreamWriter) -> int:
        """A link answered ``101``: sends the capacity; returns the link's generation."""
        node.link_gen += 1
        node.writer = writer
        node.legacy = node.refused = False
        node.floor = True  # until this link says otherwise: an older node never does
        # RETIREs the previous link carried may be lost with it (a hot restart, a line never
        # read): the next plan asks again for what is still surplus. Asking twice only closes
        # more, which the slots make up for; never asking would hold capacity forever.
        node.asked = 0
        if self.failed is not None and self.shared.failed is self.failed:
            self.shared.failed = None
        self.failed = None
        writer.write(control.capacity(self.capacity))
        return node.link_gen

    def demand(self, node: Node, gen: int, demand: Demand) -> None:
        """A ``DEMAND`` on link ``gen``: smoothed, and the node is live unless it drains or
        holds the instance since this link or a later one."""
        node.demand = control.smooth(node.demand, demand.sample)
        node.asking = demand.sample > 0
        node.waited_until = 0.0
        if node.block is not None and gen > node.block_gen:
            log.info("node %s takes sessions again (it was %s)", node, node.block)
            node.block = None
        self._present(node)
        node.heard = True
        self.plan()

    def floor(self, node: Node, gen: int, on: bool) -> None:
        """``FLOOR`` on link ``gen``: whether the node counts on this instance for its floor.
        It plans nothing by itself: the node's next ``DEMAND`` does."""
        if node.link_gen == gen:
            node.floor = on

    def draining(self, node: Node, gen: int) -> None:
        """``DRAINING``: the node stops for good; its share moves elsewhere at once, each
        session as the node closes it (this SDK closes none there until the node is down)."""
        if node.block != "draining":
            log.info("node %s is draining: its %d sessions move to the others", node,
                     node.sessions)
        node.block, node.block_gen = "draining", gen
        self.plan()

    def link_down(self, node: Node, gen: int, why: str) -> None:
        """Link ``gen`` ended; it is dialed again at once. The node stays as it was for
        ``node_grace`` (a hot restart keeps the sessions)."""
        if node.link_gen == gen and node.writer is not None:
            node.writer = None
            self._absent(node, why)
            if not self.stopping:
                self.suspect()
            self.plan()

    def link_failed(self, node: Node, error: SluiceError) -> None:
        """A dial of the link failed (it is retried with backoff). Refused outright after the
        node was reachable, it is down at once: nothing listens there any more, while a hot
        restart passes the listening socket on and a hung node or a partition lets connects
        time out — those wait for ``node_grace``."""
        was_waited_for = node.waited_until > 0
        node.waited_until = 0.0
        self._absent(node, str(error))
        reachable = node.heard or node.legacy
        if isinstance(error, ConnectError) and error.refused and reachable and not node.down:
            self._down(node, f"its control link is refused ({error})")
        elif was_waited_for:
            self.plan()

    def refused(self, node: Node, error: SluiceError) -> None:
        """The node refused the link for good (401, 404: the configuration is wrong there):
        one error line; once every node does, :meth:`Sessions.wait_registered` raises it."""
        self._absent(node, str(error))
        self.shared.record(error)
        if not node.refused:
            log.error("node %s refused this instance's control link; retrying every few "
                      "seconds: %s", node, error)
        node.refused = True
        listed = [n for n in self.nodes if n.listed]
        if listed and all(n.refused for n in listed):
            self.failed = self.shared.failed = error
            self.shared.notify()

    def legacy_node(self, node: Node) -> None:
        """The acceptor does not know control links (``400``): live with demand 1."""
        if not node.legacy:
            log.info("node %s has no control links (an older sluice): counted live with "
                     "demand 1, sessions retired from here", node)
        node.legacy = True
        node.waited_until = 0.0
        self._present(node)
        self.plan()

    def held(self, node: Node, error: SluiceError) -> None:
        """``410``: an operator drained this instance at the node; it is not used until a new
        link is answered (the link probes every ``drained_probe``)."""
        if node.block != "held":
            log.warning("node %s holds this instance drained (%s); its sessions move to the "
                        "others until `sluice ctl resume` there", node, error)
        node.block, node.block_gen = "held", node.link_gen
        self.shared.record(error)
        if node.writer is not None:
            node.writer.close()  # a new link finds out when the instance is resumed
        self.plan()

    def _present(self, node: Node) -> None:
        if node.down:
            lost = self.clock.time() - (node.absent_since or 0.0)
            log.info("node %s is back after %.1fs", node, lost)
        node.down = False
        node.absent_since = None
        self._cancel_grace(node)

    def _absent(self, node: Node, why: str) -> None:
        node.why = why
        if node.absent_since is not None or self.stopping:
            return
        node.absent_since = self.clock.time()
        node.grace = self.clock.call_later(self.node_grace, self._grace_over, node)

    @staticmethod
    def _cancel_grace(node: Node) -> None:
        if node.grace is not None:
            node.grace.cancel()
            node.grace = None

    def _grace_over(self, node: Node) -> None:
        node.grace = None
        if node.down or node.absent_since is None or node not in self.nodes or self.stopping:
            return
        self._down(node, f"no control link for {self.node_grace:g}s ({node.why})")

    def _down(self, node: Node, why: str) -> None:
        """The node is down: its share moves to the others. A node that said ``DRAINING`` was
        expected to go (one info line); one held drained said so already."""
        self._cancel_grace(node)
        node.down = True
        self.suspect()
        if node.block is None:
            log.warning("node %s is down: %s; its share moves to the others (one line per "
                        "outage)", node, why)
        elif node.block == "draining":
            log.info("node %s, which said DRAINING, is gone: %s", node, why)
        self.plan()

    # -- the plan -------------------------------------------------------------------------

    def capacity_changed(self) -> None:
        """``N`` changed: every link hears ``CAPACITY``, and the split follows."""
        for node in self.nodes:
            if node.writer is not None:
                node.writer.write(control.capacity(self.capacity))
        self.plan()

    def plan(self) -> None:
        """Splits the capacity (protocol/README.md "The split"), asks each node holding more
        than its target to retire the surplus, and wakes the slots (which dial nothing while
        the first resolution's nodes are still to be heard from: :meth:`pick`)."""
        if self.stopping:
            return
        for node in self.nodes:
            if node.live and node.remote:
                node.local = 0  # RETIRE reaches it again: no closes from here
        views = [split.NodeView(n.live, n.split_demand, n.held, n.floor) for n in self.nodes]
        now = self.clock.time()
        quiet = not any(n.live and n.asking for n in self.nodes)
        decided = split.plan(self.capacity, views, hold=now - self._moved_at < MOVE_HOLD,
                             quiet=quiet)
        if decided.moved:
            self._moved_at = now
        for node, target in zip(self.nodes, decided.targets, strict=True):
            before = node.target
            node.target = target
            retired = self._retire(node, node.held - target)
            self._log.note(node, before, retired)
        if not self.waiting:
            self._log.flush_soon(self)
        self.shared.notify()

    def _retire(self, node: Node, surplus: int) -> int:
        """Retires ``surplus`` sessions of ``node``: by ``RETIRE`` while it hears it (registered
        sessions; those still being dialed close as they register), by closing them here when
        it is not live or has no links; a live node whose link is briefly lost keeps them
        (nothing changes for ``node_grace``). Returns how many were asked."""
        before = node.retiring
        if node.block == "draining" and not node.down:
            # The stopping node closes its sessions itself once the requests it queued are
            # answered; each one it closes frees a dial elsewhere (README "DRAINING").
            return 0
        if surplus <= 0:
            pass
        elif node.remote and (node.live or not node.listed):
            assert node.writer is not None
            now = min(surplus, max(node.unasked, 0))
            if now:
                # Asked once: the node closes them as their requests end, however long that
                # takes; a link that ends takes what it asked with it (``link_up``).
                node.writer.write(control.retire(now))
            node.asked += now
            node.unborn += surplus - now
        elif node.legacy or not node.live:
            node.local += surplus
        if not node.live and not (node.remote and not node.listed):
            # Vacated: everything closes from here, also what the node was asked and may not do.
            node.local += node.asked + node.unborn
            node.asked = node.unborn = 0
        self._close_idle(node)
        return node.retiring - before

    def _close_idle(self, node: Node) -> None:
        for session in list(node.open):
            if node.local <= 0:
                return
            if not session.retired and session.close_if_idle():
                session.retired = True
                node.local -= 1
                node.closing += 1

    # -- the slots ------------------------------------------------------------------------

    def take(self) -> Node | None:
        """The node a slot dials now (:meth:`pick`), counting the session there as being
        dialed; ``None``: none may be dialed until something changes."""
        node = self.pick()
        if node is not None:
            node.sessions += 1
            node.dialing += 1
        return node

    def dial_failed(self, node: Node) -> None:
        """A session dial to ``node`` failed (and is retried), or its session ended before
        serving anything, unasked: the node backs off for the next delay, unless it is backing
        off already (the other dials of one burst extend nothing), and the slots dial other
        nodes meanwhile. Then it takes one dial at a time until a session registers there."""
        now = self.clock.time()
        if node.failures and node.retry_at > now:
            return
        node.retry_at = now + self.backoff.delay(node.failures)
        node.failures += 1
        self.clock.call_later(node.retry_at - now, self.shared.notify)

    @property
    def waiting(self) -> bool:
        """A node of the first resolution has neither said ``DEMAND`` nor failed, within
        ``first_wait``: the split is not the first one yet."""
        now = self.clock.time()
        return any(n.listed and n.waited_until > now for n in self.nodes)

    def pick(self) -> Node | None:
        """The live node with the most room (``target - h``, ties: the first listed), while
        the sessions held everywhere are fewer than ``N`` and the first split is made;
        ``None``: wait for a change."""
        if self.total >= self.capacity or self.waiting:
            return None
        best: Node | None = None
        now = self.clock.time()
        for node in self.nodes:
            room = node.target - node.held
            if not node.live or room <= 0 or _backing_off(node, now):
                continue
            if best is None or room > best.target - best.held:
                best = node
        return best

    async def acquire(self) -> Node | None:
        """Waits until a node has room and counts a session there (being dialed); ``None`` if
        the calling slot should end instead (stopping, or a retirement is owed)."""
        while True:
            if self.shared.should_end():
                return None
            node = self.take()
            if node is not None:
                return node
            await self.shared.changed()

    def release(self, node: Node, session: Session | None) -> bool:
        """A session there ended (``None``: its dial failed). Returns whether it was one asked
        to retire: then the slot dials elsewhere at once."""
        node.sessions -= 1
        if session is None:
            node.dialing = max(node.dialing - 1, 0)
        retired = True
        if session is not None and session.retired:
            node.closing -= 1
        elif session is not None and node.asked > 0:
            node.asked -= 1  # the node closed it, as asked (which one is the node's choice)
        elif session is None and node.unborn > 0:
            node.unborn -= 1
        elif session is not None and node.block == "draining":
            pass  # the stopping node closed it: the slot dials elsewhere at once
        else:
            retired = False
        self._settle(node)
        if not node.listed and node.sessions == 0 and node in self.nodes:
            self._forget(node)
        self.shared.notify()
        return retired

    @staticmethod
    def _settle(node: Node) -> None:
        """No more can be retiring than are held: what a failed dial or an unexpected close
        left over is forgotten (first what was to close unborn, then from here, then asked)."""
        excess = node.retiring - node.sessions
        for name in ("unborn", "local", "asked"):
            take = min(excess, getattr(node, name))
            if take > 0:
                setattr(node, name, getattr(node, name) - take)
                excess -= take

    def opened(self, node: Node, session: Session) -> bool:
        """A session registered at ``node``; ``True`` if it must close at once (unused)."""
        node.open.add(session)
        node.dialing = max(node.dialing - 1, 0)
        node.failures = 0
        if node.unborn > 0:
            node.unborn -= 1
            node.closing += 1
            session.retired = True
            return True
        return self.claim_close(node, session)

    def closed(self, node: Node, session: Session) -> None:
        node.open.discard(session)

    def claim_close(self, node: Node, session: Session) -> bool:
        """Whether ``session`` closes after its response (or now, if it has none yet): one of
        the sessions this SDK retires at ``node`` itself."""
        if session.retired or node.local <= 0:
            return False
        node.local -= 1
        node.closing += 1
        session.retired = True
        return True

    # -- shutdown -------------------------------------------------------------------------

    def vacate(self, node: Node) -> None:
        """Closes every session at ``node`` from here: idle ones now, busy ones after their
        response (its drain request failed)."""
        node.local = node.sessions - node.closing
        node.asked = node.unborn = 0
        self._close_idle(node)

    def close(self) -> None:
        """Stops every link and timer."""
        self.stopping = True
        self._log.close()
        for node in self.nodes:
            _stop(node)


def _backing_off(node: Node, now: float) -> bool:
    """No slot dials ``node`` now: its last dial failed less than its delay ago, or it has
    failed and a dial is under way (one at a time until a session registers)."""
    return node.failures > 0 and (node.retry_at > now or node.dialing > 0)


def _stop(node: Node) -> None:
    """Ends the node's link task, its link and its grace timer."""
    Fleet._cancel_grace(node)
    if node.task is not None:
        node.task.cancel()
    if node.writer is not None:
        node.writer.close()


class RebalanceLog:
    """One info line per rebalance — what moved where, with the demands — at most one a
    second; changes in between are gathered into the next line."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last = float("-inf")
        self._moves: dict[str, tuple[Node, int, int]] = {}
        self._timer: Timer | None = None

    def note(self, node: Node, before: int, retired: int) -> None:
        key = str(node)
        if key in self._moves:
            _, first, asked = self._moves[key]
            self._moves[key] = (node, first, asked + retired)
        elif before != node.target or retired:
            self._moves[key] = (node, before, retired)

    def flush_soon(self, fleet: Fleet) -> None:
        if not self._moves or self._timer is not None:
            return
        wait = self._last + REBALANCE_LOG_EVERY - self._clock.time()
        if wait <= 0:
            self._flush(fleet)
        else:
            self._timer = self._clock.call_later(wait, self._flush, fleet)

    def _flush(self, fleet: Fleet) -> None:
        self._timer = None
        moves = [m for m in self._moves.values() if m[1] != m[0].target or m[2]]
        self._moves.clear()
        if not moves:
            return
        self._last = self._clock.time()
        log.info("rebalance of capacity %d: %s", fleet.capacity, "; ".join(
            _move(node, before, retired) for node, before, retired in moves))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _move(node: Node, before: int, retired: int) -> str:
    demand = "none" if node.demand is None else f"{node.demand:.1f}"
    text = f"{node} {before}->{node.target} ({node.state}, demand {demand}, holds {node.held}"
    return text + (f", retiring {retired})" if retired else ")")
