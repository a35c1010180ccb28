"""How an instance splits its declared capacity across the nodes it reaches, in proportion to
their demand (protocol/README.md "The split", normative: every SDK computes
the same targets from the same inputs, and the vectors' ``splits`` section holds them to it).
Python floats are IEEE doubles, so the arithmetic below falls exactly as the protocol's."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

#: Step 5 moves a session while the two ends are off their quotas by more than this between
#: them (``(t_j - q_j) + (q_i - t_i) > 1``): exactly when the move makes the sum of
#: ``|t - q|`` smaller, so the move back would need the opposite and none comes back while the
#: quotas hold still.
MOVE_ABOVE = 1.0


@dataclass(frozen=True)
class NodeView:
    """What an instance knows of one node when it plans."""

    live: bool
    """The link is up and the node has not said ``DRAINING`` (or it has no control links)."""
    demand: float
    """The smoothed demand."""
    held: int
    """Sessions held there (registered or being dialed) less those asked to retire."""
    floor: bool = True
    """The node asks this instance for its floor of one session (its last ``FLOOR`` was 1,
    or it sent none)."""


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` decided."""

    targets: list[int]
    """The sessions each node should hold."""
    moved: int
    """Sessions moved by demand (step 5): a plan that moved any holds step 5 for a while."""


def targets(capacity: int, nodes: Sequence[NodeView]) -> list[int]:
    """The sessions each node should hold: ``capacity`` in all, one on each live node that asks
    for its floor while ``capacity`` allows, the rest in proportion to demand, moving a session
    from the node most over its quota to the one most under it while the two are off by more
    than :data:`MOVE_ABOVE` between them (a move that brings the split closer to the quotas)."""
    return plan(capacity, nodes).targets


def plan(capacity: int, nodes: Sequence[NodeView], hold: bool = False,
         quiet: bool = False) -> Plan:
    """:func:`targets`, and how many sessions step 5 moved; ``hold`` skips step 5 (demand
    moves nothing; steps 1–4 still follow a node down or a change of ``capacity``). ``quiet``
    (no node's last sample was above 0) lets step 5 move a session only to a node owed its
    floor that holds none: nobody asks for anything, so the split stays."""
    q = quotas(capacity, nodes)
    t = [n.held if n.live else 0 for n in nodes]
    live = [i for i, n in enumerate(nodes) if n.live]
    floors = sum(1 for i in live if nodes[i].floor)
    owed = [i for i in live if nodes[i].floor and capacity >= floors]

    def over(i: int) -> float:
        return t[i] - q[i]

    def under(i: int) -> float:
        return q[i] - t[i]

    def holding() -> list[int]:
        return [i for i in range(len(t)) if t[i] > 0]

    while sum(t) > capacity:
        j = _first_max(holding(), over)
        if j is None:
            break
        t[j] -= 1
    def bare() -> list[int]:
        """While quiet, the nodes owed their floor that hold none: first in step 4, the only
        ones step 5 gives to."""
        return [i for i in owed if t[i] == 0] if quiet else []

    while sum(t) < capacity:
        i = _first_max(bare() or live, under)
        if i is None:
            break
        t[i] += 1
    moved = 0
    while not hold:
        i, j = _first_max(bare() if quiet else live, under), _first_max(holding(), over)
        if i is None or j is None or not over(j) + under(i) > MOVE_ABOVE:
            break
        t[i] += 1
        t[j] -= 1
        moved += 1
    return Plan(t, moved)


def quotas(capacity: int, nodes: Sequence[NodeView]) -> list[float]:
    """Each node's real share: a base of one per live node that asks for its floor, while
    ``capacity`` covers them all, the rest shared among the live nodes by demand (evenly
    without any); 0 for a node that is not live."""
    live = sum(1 for n in nodes if n.live)
    if live == 0:
        return [0.0] * len(nodes)
    floors = sum(1 for n in nodes if n.live and n.floor)
    base = 1 if capacity >= floors else 0
    rest = float(capacity - base * floors)
    total = 0.0
    for n in nodes:  # summed in list order, as the protocol writes it
        if n.live:
            total += max(n.demand, 0.0)
    out = []
    for n in nodes:
        if not n.live:
            out.append(0.0)
        elif total > 0.0:
            out.append((base if n.floor else 0) + (rest * max(n.demand, 0.0)) / total)
        else:
            out.append((base if n.floor else 0) + rest / live)
    return out


def _first_max(indices: Iterable[int], key: Callable[[int], float]) -> int | None:
    """The first index with the largest key."""
    best: int | None = None
    best_key = 0.0
    for i in indices:
        k = key(i)
        if best is None or k > best_key:
            best, best_key = i, k
    return best
