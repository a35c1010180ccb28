"""What an instance logs (protocol/README.md "What SDKs log"): per instance, never per session
slot or per attempt. An outage is one warning and, once a session registers again, one info
line with its length and failed dials; a refusal that stops the slots is one line; a drain
hold is one warning and its end (the instance was resumed) one info line; a capacity change
is one info line."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from .errors import ConnectError, SluiceError

log = logging.getLogger("sluice_sdk")


@dataclass
class _Outage:
    since: float
    failed: int = 1


class Report:
    """The log lines of one instance dialing ``acceptor``."""

    def __init__(self, acceptor: str) -> None:
        self.acceptor = acceptor
        #: Bumped whenever a registration ends an outage: a dial begun before that belongs to
        #: the outage that ended, and its failure starts no new one.
        self.epoch = 0
        self._outage: _Outage | None = None
        self._held_since: float | None = None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def dial_failed(self, error: SluiceError, epoch: int) -> None:
        """A retryable dial (begun at ``epoch``) failed: the first of an outage is a warning,
        the rest are counted."""
        if epoch != self.epoch:
            return
        if self._outage is not None:
            self._outage.failed += 1
            return
        self._outage = _Outage(self._now())
        reason = f"cannot connect: {error.__cause__}" if isinstance(error, ConnectError) else error
        log.warning("cannot register with the acceptor %s: %s; re-dialing with backoff "
                    "(one line per outage)", self.acceptor, reason)

    def registered(self) -> None:
        """A session registered: ends an outage (one info line) or a drain hold."""
        if self._held_since is not None:
            held = self._now() - self._held_since
            self._held_since = None
            log.info("the instance was resumed after %.1fs drained: registered again with %s",
                     held, self.acceptor)
        if self._outage is not None:
            outage, self._outage = self._outage, None
            self.epoch += 1
            log.info("registered with the acceptor %s again after %.1fs; %d dials failed",
                     self.acceptor, self._now() - outage.since, outage.failed)

    def refused(self, error: SluiceError) -> None:
        """A refusal stopped the slots (400, 401, 404)."""
        log.error("the acceptor %s refused this instance; its sessions stop until the capacity "
                  "is set again: %s", self.acceptor, error)

    def held(self, error: SluiceError, probe_every: float) -> None:
        """410: an operator drained the instance; the slots wait and one probe dials every
        ``probe_every`` seconds. Ends an outage without a line: the acceptor answered."""
        self._outage = None
        self.epoch += 1
        self._held_since = self._now()
        log.warning("this instance is drained (%s); its sessions stop and one registration "
                    "probes every %gs until `sluice ctl resume`", error, probe_every)

    def unheld(self) -> None:
        """The capacity was set again while held: the slots dial at once."""
        if self._held_since is not None:
            self._held_since = None
            log.info("capacity set while drained: dialing again at once")

    def capacity(self, old: int, new: int) -> None:
        """The capacity asked for changed."""
        if old != new:
            log.info("capacity %d -> %d", old, new)
