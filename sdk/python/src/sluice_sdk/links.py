"""The I/O of many nodes: one control link per node (dial, read ``DEMAND``, ``DRAINING`` and
``FLOOR``, re-dial) and the resolver that finds the nodes (``dns:`` records, list entries), each
reporting to the :class:`~sluice_sdk.fleet.Fleet`."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence

from . import address, aio, control, dial
from .control import Demand, Draining, LineReader
from .dial import Endpoint
from .errors import ProtocolError, Refused, SluiceError
from .fleet import Fleet, Node
from .options import Options, Resolver

log = logging.getLogger("sluice_sdk")

#: How long after a node is lost its name is resolved again (protocol/README.md, "The
#: acceptor address"): the first of the follow-ups that double up to ``resolve_interval``.
RESOLVE_SOON = 1.0


async def keep_link(fleet: Fleet, node: Node, options: Options) -> None:
    """Keeps ``node``'s control link until cancelled: a link that ends (or is silent for
    ``control.SILENCE``) is dialed again at once, then with backoff; a ``400`` (no control
    links) is retried at the backoff's maximum, a ``410`` every ``drained_probe``."""
    failures = 0
    while True:
        pause = 0.0
        try:
            opened = await dial.control(options, fleet.capacity, node.endpoint)
        except Refused as e:
            fleet.link_failed(node, e)
            if e.drained:
                fleet.held(node, e)
                pause = options.drained_probe
            elif not e.retryable:
                fleet.refused(node, e)
                pause = options.backoff.max
            else:
                pause, failures = options.backoff.delay(failures), failures + 1
        except SluiceError as e:
            fleet.link_failed(node, e)
            pause, failures = options.backoff.delay(failures), failures + 1
        else:
            if opened is None:
                fleet.legacy_node(node)
                pause, failures = options.backoff.max, 0
            else:
                failures = 0
                await _serve(fleet, node, *opened)
        await asyncio.sleep(pause)


async def _serve(fleet: Fleet, node: Node, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, rest: bytes) -> None:
    """Reads the node's lines until the link ends, is silent too long or breaks the protocol."""
    gen = fleet.link_up(node, writer)
    lines = LineReader(reader, rest)
    why = "the link ended"
    try:
        while True:
            line = await aio.wait_for(lines.next_line(), control.SILENCE)
            heard = control.parse_node_line(line)
            if isinstance(heard, Demand):
                fleet.demand(node, gen, heard)
            elif isinstance(heard, Draining):
                fleet.draining(node, gen)
            else:
                fleet.floor(node, gen, heard.on)
    except asyncio.TimeoutError:
        why = f"the link was silent for {control.SILENCE:g}s"
    except (ProtocolError, OSError) as e:
        why = str(e)
    finally:
        writer.close()
        fleet.link_down(node, gen, why)
    log.debug("control link to %s ended: %s", node, why)


async def system_resolver(host: str, port: int) -> list[tuple[str, int]]:
    """Every A and AAAA record of ``host`` (the system resolver, in its order), on ``port``."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[tuple[str, int]] = []
    for family, _, _, _, sockaddr in infos:
        pair = (str(sockaddr[0]), int(sockaddr[1]))
        if family in (socket.AF_INET, socket.AF_INET6) and pair not in found:
            found.append(pair)
    return found


class Discovery:
    """Finds the nodes an acceptor address names: every record of a ``dns:`` name, each list
    entry (a name once per address it resolves to), again every ``resolve_interval``. A name
    that fails to resolve keeps the nodes it named last."""

    def __init__(self, where: address.Dns | address.Many, options: Options) -> None:
        self.options = options
        self.resolver: Resolver = options.resolver or system_resolver
        if isinstance(where, address.Dns):
            self.sources = [(where.name, where.port)]
        else:
            self.sources = [address.split_entry(e) for e in where.entries]
        self._last: dict[int, list[Endpoint]] = {}
        self._failing: str | None = None

    async def resolve(self) -> list[Endpoint]:
        """The nodes now, in order, each once; says once per failure streak when a name
        cannot be resolved (logged, and its last nodes kept)."""
        found = await asyncio.gather(*(self._source(i) for i in range(len(self.sources))))
        errors = [e for _, e in found if e]
        self._report(errors)
        nodes: dict[str, Endpoint] = {}
        for endpoints, _ in found:
            for e in endpoints:
                nodes.setdefault(str(e), e)
        return list(nodes.values())

    async def _source(self, i: int) -> tuple[list[Endpoint], str]:
        host, port = self.sources[i]
        if address.is_ip(host):
            return [Endpoint(host, port, host)], ""
        try:
            pairs = await aio.wait_for(self.resolver(host, port), self.options.handshake_timeout)
        except (OSError, asyncio.TimeoutError, UnicodeError) as e:
            return self._last.get(i, []), f"cannot resolve {host}: {e or 'timed out'}"
        self._last[i] = _endpoints(pairs, host)
        return self._last[i], ""

    def _report(self, errors: Sequence[str]) -> None:
        if errors and self._failing is None:
            log.warning("%s; keeping the nodes it named before (one line until it resolves)",
                        errors[0])
        elif not errors and self._failing is not None:
            log.info("the acceptor address resolves again")
        self._failing = errors[0] if errors else None

    async def run(self, fleet: Fleet) -> None:
        """Resolves now and every ``resolve_interval`` (sooner, with backoff, while a name
        fails and no node is known), updating ``fleet``; until cancelled. A node lost (its
        link ended, or it went down) is a change suspected: the name is resolved again
        ``RESOLVE_SOON`` later, then after twice as long each time until the pause reaches
        ``resolve_interval``, so a node back under a new address is found within seconds."""
        soon = asyncio.Event()
        fleet.suspect = soon.set
        failures, follow = 0, 0.0
        interval = self.options.resolve_interval
        while True:
            fleet.update(await self.resolve())
            pause = interval
            if self._failing is not None and not fleet.nodes:
                pause = min(pause, self.options.backoff.delay(failures))
                failures += 1
            else:
                failures = 0
            if follow:
                pause, follow = min(pause, follow), (2 * follow if 2 * follow < interval else 0.0)
            try:
                await asyncio.wait_for(soon.wait(), pause)
            except asyncio.TimeoutError:
                continue
            soon.clear()
            follow = 2 * RESOLVE_SOON
            await asyncio.sleep(min(RESOLVE_SOON, interval))


def _endpoints(pairs: Sequence[tuple[str, int]], name: str) -> list[Endpoint]:
    return [Endpoint(str(ip), int(port), name) for ip, port in pairs]
