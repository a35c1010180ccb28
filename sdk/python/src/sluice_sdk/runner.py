"""The runner: ``python -m sluice_sdk MODULE:APP --acceptor HOST:PORT ...``, uvicorn-style.

It imports the application, runs its lifespan startup, keeps ``--capacity`` sessions
registered, and on SIGTERM or SIGINT drains (in-flight requests finish), runs the lifespan
shutdown and exits 0; a second signal closes at once. :func:`run` does the same from Python.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import os
import signal
import ssl
import sys
import traceback
from pathlib import Path
from typing import Any

from .errors import LifespanError, OptionsError, SluiceError
from .options import Options
from .server import ASGIApp
from .sessions import Sessions, serve
from .wsgi import WsgiApp

log = logging.getLogger("sluice_sdk")

#: Exit codes: a usage error (arguments, the application's path, options) and a failed
#: lifespan startup (as uvicorn's), besides 0 (drained) and 1 (anything else failed).
USAGE = 2
STARTUP_FAILED = 3


class UsageError(Exception):
    """The command line cannot work; the message says why."""


def run(app: Any, options: Options, *, lifespan: str = "auto",
        drain_timeout: float | None = None) -> int:
    """Serves the ASGI (or WSGI: wrap it in :class:`WsgiApp`) ``app`` through the acceptor
    until SIGTERM or SIGINT, then drains gracefully; returns the exit status: 0 once drained,
    1 if every session was refused for good (400/401/404), the drain failed with sessions
    open, or a second signal cut it short, 3 if the lifespan startup failed. Blocks the
    calling thread with an event loop of its own, like ``uvicorn.run``."""
    return asyncio.run(_serve(app, options, lifespan, drain_timeout))


async def _serve(app: ASGIApp, options: Options, lifespan: str, drain_timeout: float | None) -> int:
    signals = _Signals()
    startup = asyncio.ensure_future(serve(app, options, lifespan=lifespan))
    await asyncio.wait({startup, signals.first}, return_when=asyncio.FIRST_COMPLETED)
    if not startup.done():
        startup.cancel()
        await asyncio.gather(startup, return_exceptions=True)
        log.error("stopped by a signal during the application's lifespan startup")
        return 1
    try:
        sessions = startup.result()
    except LifespanError as e:
        log.error("%s", e)
        return STARTUP_FAILED
    instance = (f"instance {options.instance!r}" if options.instance
                else "no instance id: the acceptor uses this host's address")
    sessions_of = (f"HTTP/2 sessions of {options.streams} streams" if options.streams
                   else "HTTP/1.1 sessions")
    log.info("serving service %r (slice %r, %s) with capacity %d (%s) through the acceptor "
             "%s; SIGTERM or SIGINT drains", options.service, options.slice, instance,
             options.capacity, sessions_of, options.acceptor)
    refused = asyncio.ensure_future(sessions.wait_refused())
    await asyncio.wait({refused, signals.first}, return_when=asyncio.FIRST_COMPLETED)
    if refused.done():
        log.error("every session was refused for good; exiting: %s", refused.result())
        await sessions.aclose()
        return 1
    refused.cancel()
    return await _drain(sessions, signals, drain_timeout)


async def _drain(sessions: Sessions, signals: _Signals, timeout: float | None) -> int:
    """The graceful part: drain, wait, lifespan shutdown; a second signal closes at once."""
    log.info("received %s: draining (a second signal closes at once)", signals.name)
    registered = sessions.registered
    shutdown = asyncio.ensure_future(sessions.shutdown(timeout))
    await asyncio.wait({shutdown, signals.second}, return_when=asyncio.FIRST_COMPLETED)
    if not shutdown.done():
        shutdown.cancel()
        await asyncio.gather(shutdown, return_exceptions=True)
        sessions.close()
        log.warning("second signal: closed every session at once")
        return 1
    try:
        shutdown.result()
    except asyncio.TimeoutError as e:
        log.error("%s", e)
        return 1
    except SluiceError as e:
        # E.g. the proxy is down: without sessions nothing is lost, with some they are cut.
        await sessions.aclose()
        if not registered:
            log.warning("the drain request failed (%s); no session was registered", e)
            return 0
        log.error("the drain request failed (%s); closed %d sessions at once", e, registered)
        return 1
    return 0


class _Signals:
    """SIGTERM and SIGINT on the running loop: ``first`` and ``second`` complete in turn."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.first: asyncio.Future[None] = loop.create_future()
        self.second: asyncio.Future[None] = loop.create_future()
        self.name = ""
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: signal.Signals) -> None:
        if not self.first.done():
            self.name = sig.name
            self.first.set_result(None)
        elif not self.second.done():
            self.second.set_result(None)


def load_app(spec: str, app_dir: str = ".") -> Any:
    """Imports ``MODULE:ATTRIBUTE`` (the attribute may be dotted) with ``app_dir`` first on
    ``sys.path``. Raises :class:`UsageError` for a malformed path, a missing module or
    attribute; an error raised while importing the module propagates, traceback and all."""
    module_name, sep, attrs = spec.partition(":")
    if not sep or not module_name or not attrs:
        raise UsageError(f"the application must be given as MODULE:ATTRIBUTE, e.g. main:app, "
                         f"not {spec!r}")
    sys.path.insert(0, str(Path(app_dir).resolve()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name == e.name or module_name.startswith(e.name + ".")):
            raise  # the module exists; something it imports does not
        raise UsageError(f"cannot import {module_name!r}: no module named {e.name!r} "
                         f"(searched {str(Path(app_dir).resolve())!r} and sys.path; "
                         f"see --app-dir)") from None
    app: Any = module
    for attr in attrs.split("."):
        if not hasattr(app, attr):
            raise UsageError(f"module {module_name!r} has no attribute {attrs!r}")
        app = getattr(app, attr)
    if not callable(app):
        raise UsageError(f"{spec} is a {type(app).__name__}, not an ASGI or WSGI application")
    return app


def as_asgi(app: Any, interface: str) -> ASGIApp:
    """``app`` as ASGI: ``"wsgi"`` wraps it in :class:`WsgiApp`; ``"auto"`` does so unless it
    (or its ``__call__``) is a coroutine function."""
    if interface == "asgi":
        return app  # type: ignore[no-any-return]
    if interface == "wsgi" or not _is_asgi(app):
        return WsgiApp(app)
    return app  # type: ignore[no-any-return]


def _is_asgi(app: Any) -> bool:
    """A coroutine function, or an object whose class's ``__call__`` is one (FastAPI)."""
    if inspect.iscoroutinefunction(app):
        return True
    return callable(app) and inspect.iscoroutinefunction(type(app).__call__)


def secret(value: str) -> str:
    """``env:NAME`` (the variable), ``file:PATH`` (the file, trimmed) or the value itself."""
    kind, _, rest = value.partition(":")
    if kind == "env":
        if rest not in os.environ:
            raise UsageError(f"--token env:{rest}: the environment variable {rest} is not set")
        return os.environ[rest]
    if kind == "file":
        try:
            return Path(rest).read_text().strip()
        except OSError as e:
            raise UsageError(f"--token file:{rest}: {e.strerror or e}") from None
    return value


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context the ``--tls*`` flags ask for; ``None`` for plaintext."""
    if not (args.tls or args.tls_ca or args.tls_server_name or args.tls_cert or args.tls_key):
        return None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together (the client certificate for mTLS)")
    try:
        ctx = ssl.create_default_context(cafile=args.tls_ca)
        if args.tls_cert:
            ctx.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"TLS: {e}") from None
    return ctx


def parser() -> argparse.ArgumentParser:
    """The command line; the identity options default to ``SLUICE_<OPTION>`` from the
    environment."""
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="python -m sluice_sdk",
        description="Serve an ASGI or WSGI application through Sluice by dialing in: keeps "
                    "CAPACITY sessions registered with the acceptor; SIGTERM or SIGINT drains.",
        epilog="Exit status: 0 drained, 1 failed or cut short, 2 usage, 3 lifespan startup "
               "failed. SLUICE_ACCEPTOR, SLUICE_CAPACITY, SLUICE_STREAMS, SLUICE_SERVICE, SLUICE_SLICE, "
               "SLUICE_INSTANCE and SLUICE_TOKEN set the defaults of their options.")
    p.add_argument("app", metavar="MODULE:APP", help="the application, e.g. main:app")
    p.add_argument("--acceptor", default=env("SLUICE_ACCEPTOR"),
                   help="HOST:PORT, [V6]:PORT or unix:PATH of the proxy's acceptor; for many "
                        "nodes dns:NAME:PORT (every A/AAAA record) or HOST:PORT,HOST:PORT,... "
                        "(required)")
    p.add_argument("--capacity", type=int, default=env("SLUICE_CAPACITY", "1"),
                   help="sessions to keep registered: requests served at once (default 1)")
    p.add_argument("--streams", type=int, default=env("SLUICE_STREAMS"), metavar="N",
                   help="register HTTP/2 sessions of N (1 to 1000) requests at once each "
                        "(default: HTTP/1.1 sessions, one request at a time)")
    p.add_argument("--service", default=env("SLUICE_SERVICE"),
                   help="the reverse cluster to join (default: the application's module name)")
    p.add_argument("--slice", default=env("SLUICE_SLICE", "default"), help="(default: default)")
    p.add_argument("--instance", default=env("SLUICE_INSTANCE"),
                   help="this instance's id (default: the acceptor uses this host's address)")
    p.add_argument("--token", default=None,
                   help="env:NAME, file:PATH or the token itself (default: $SLUICE_TOKEN)")
    p.add_argument("--tls", action="store_true", help="TLS to the acceptor, system CAs")
    p.add_argument("--tls-ca", metavar="FILE", help="CA bundle that signed the acceptor's certificate")
    p.add_argument("--tls-server-name", metavar="NAME", help="name the acceptor's certificate carries")
    p.add_argument("--tls-cert", metavar="FILE", help="client certificate (mTLS)")
    p.add_argument("--tls-key", metavar="FILE", help="its private key")
    p.add_argument("--lifespan", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--interface", choices=("auto", "asgi", "wsgi"), default="auto",
                   help="auto: ASGI if the application is a coroutine function, else WSGI")
    p.add_argument("--app-dir", default=".", metavar="DIR",
                   help="put DIR first on sys.path (default: .)")
    p.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                   help="close what is still open this long after the drain (default: wait)")
    p.add_argument("--drained-probe", type=float, default=30.0, metavar="SECONDS",
                   help="seconds between probes while an operator holds the instance drained")
    p.add_argument("--resolve-interval", type=float, default=10.0, metavar="SECONDS",
                   help="many nodes: seconds between resolutions of the acceptor's names")
    p.add_argument("--node-grace", type=float, default=5.0, metavar="SECONDS",
                   help="many nodes: seconds a node may lack its control link before its "
                        "share moves to the others")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"))
    return p


def options_from(args: argparse.Namespace) -> Options:
    """The :class:`Options` of the parsed command line."""
    if not args.acceptor:
        raise UsageError("--acceptor is required (or SLUICE_ACCEPTOR)")
    token = secret(args.token) if args.token is not None else os.environ.get("SLUICE_TOKEN")
    service = args.service or args.app.partition(":")[0].rpartition(".")[2]
    try:
        return Options(acceptor=args.acceptor, service=service, slice=args.slice,
                       instance=args.instance, token=token or None, capacity=args.capacity,
                       streams=_streams(args.streams),
                       ssl=tls_context(args), server_hostname=args.tls_server_name,
                       drained_probe=args.drained_probe, resolve_interval=args.resolve_interval,
                       node_grace=args.node_grace)
    except OptionsError as e:
        raise UsageError(str(e)) from None


def _streams(value: int | str | None) -> int | None:
    """``--streams`` (or ``$SLUICE_STREAMS``): ``None`` or empty for HTTP/1.1 sessions."""
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--streams must be a whole number from 1 to 1000, not {value!r}") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m sluice_sdk``: parses ``argv``, loads the application, runs it."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = options_from(args)
        app = as_asgi(load_app(args.app, args.app_dir), args.interface)
    except UsageError as e:
        print(f"python -m sluice_sdk: error: {e}", file=sys.stderr)
        return USAGE
    except Exception:
        print(f"python -m sluice_sdk: error: importing {args.app} failed:", file=sys.stderr)
        traceback.print_exc()
        return 1
    return run(app, options, lifespan=args.lifespan, drain_timeout=args.drain_timeout)
