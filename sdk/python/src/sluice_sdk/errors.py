"""Errors: where a failure came from and whether dialing again may help (``retryable``)."""

from __future__ import annotations


class SluiceError(Exception):
    """Base of every SDK error. ``retryable`` tells whether dialing again may succeed."""

    retryable: bool = True


class OptionsError(SluiceError, ValueError):
    """The options can never work (local; never retried)."""

    retryable = False


class ConnectError(SluiceError):
    """The acceptor could not be reached, or TLS to it failed (network; retried)."""

    def __init__(self, acceptor: str, cause: BaseException) -> None:
        super().__init__(f"cannot connect to the acceptor {acceptor}: {cause}")
        self.acceptor = acceptor
        self.__cause__ = cause

    @property
    def refused(self) -> bool:
        """The connect was refused (``ECONNREFUSED``): nothing listens there."""
        return isinstance(self.__cause__, ConnectionRefusedError)


class HandshakeTimeout(SluiceError):
    """Connecting plus the acceptor's answer took longer than ``handshake_timeout`` (retried)."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"the acceptor did not answer within {limit:g}s")
        self.limit = limit


class Refused(SluiceError):
    """The acceptor answered a refusal. 400, 401 and 404 mean the configuration is wrong: they
    stop the slots for good. 410 means an operator drained the instance (until ``sluice ctl
    resume``): the slots stop and one slow probe registers again once it is resumed. 429, 503
    and any other status are retried."""

    def __init__(self, status: int, reason: str = "") -> None:
        shown = reason or "(no reason given)"
        super().__init__(f"the acceptor refused with status {status}: {shown}")
        self.status = status
        #: The acceptor's reason (the first line of its answer's body), e.g.
        #: ``unknown service "nosuch"``; ``""`` when it gave none.
        self.reason = reason
        self.retryable = status not in (400, 401, 404, 410)

    @property
    def drained(self) -> bool:
        """An operator drained this instance (``410 Gone``): its sessions stay out."""
        return self.status == 410


class ProtocolError(SluiceError):
    """The acceptor's answer is not the session protocol, or it closed early (upstream; retried)."""


class H2Unsupported(ProtocolError):
    """An HTTP/2 registration (``Options.streams``) was answered with a ``101`` that does not
    name ``Sluice-Protocol: h2``: the acceptor does not take HTTP/2 sessions. Not retried: the
    deployment must change (a newer Sluice, or ``streams=None`` for HTTP/1.1 sessions)."""

    retryable = False

    def __init__(self) -> None:
        super().__init__("the acceptor does not take HTTP/2 sessions (its 101 to a registration "
                         "with Sluice-Protocol: h2 does not name h2): upgrade Sluice or register "
                         "HTTP/1.1 sessions (streams=None)")


class LifespanError(SluiceError):
    """The application's ASGI lifespan startup failed (``lifespan.startup.failed``), or it does
    not support the protocol where it must (``lifespan="on"``): the service cannot start."""

    retryable = False
