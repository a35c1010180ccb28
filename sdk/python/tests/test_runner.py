"""The runner, ``python -m sluice_sdk MODULE:APP ...``, as a subprocess against the fake
acceptor: it loads the app, runs the lifespan, registers, drains on SIGTERM and exits 0; the
command line's errors are clear; an unreachable acceptor is retried."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import sys
import textwrap
from pathlib import Path

import pytest

from fakenodes import FakeNode, Tally
from fakes import SWITCH_H2, FakeAcceptor, run, self_signed
from h2fakes import H2Client

APP = '''
import asyncio
import os


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            kind = (await receive())["type"]
            print(kind, flush=True)
            if kind == "lifespan.startup" and os.environ.get("SVC_FAIL"):
                await send({"type": "lifespan.startup.failed", "message": "no database"})
                return
            await send({"type": kind + ".complete"})
            if kind == "lifespan.shutdown":
                return
    if scope["path"] == "/hold":
        print("holding", flush=True)
        await asyncio.Event().wait()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ran " + scope["path"].encode()})


def wsgi(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"wsgi " + environ["PATH_INFO"].encode()]


not_an_app = 42
'''


class Runner:
    """``python -m sluice_sdk`` in a subprocess, its output collected line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._new = asyncio.Condition()
        self._readers = [asyncio.ensure_future(self._read(s)) for s in (proc.stdout, proc.stderr)]

    @classmethod
    async def start(cls, tmp: Path, *args: str, env: dict[str, str] | None = None) -> Runner:
        (tmp / "svc.py").write_text(APP)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sluice_sdk", *args, "--app-dir", str(tmp),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
                 **(env or {})})
        return cls(proc)

    async def _read(self, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None
        while line := await stream.readline():
            async with self._new:
                self.lines.append(line.decode().rstrip("\n"))
                self._new.notify_all()

    async def line(self, text: str) -> str:
        """The first line containing ``text``, waiting for it."""
        async with self._new:
            await self._new.wait_for(lambda: any(text in line for line in self.lines))
        return next(line for line in self.lines if text in line)

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    async def exit(self) -> int:
        code = await self.proc.wait()
        await asyncio.gather(*self._readers)
        return code


def test_serves_the_app_and_drains_on_sigterm(tmp_path: Path) -> None:
    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        addr = await acc.start_tcp()
        runner = await Runner.start(tmp_path, "svc:app", "--acceptor", addr, "--capacity", "2",
                                    "--instance", "svc-1", "--token", "env:SVC_TOKEN",
                                    env={"SVC_TOKEN": "s3cret"})
        sessions = [await acc.session(), await acc.session()]
        assert (await sessions[0].request("GET", "/x")).body == b"ran /x"
        # The lifespan startup ran before the sessions; the service is the module's name.
        assert runner.lines.index("lifespan.startup") < runner.lines.index(
            await runner.line("serving"))
        assert {(s.headers["sluice-service"], s.headers["sluice-instance"],
                 s.headers["authorization"], s.headers["sluice-capacity"]) for s in sessions} == {
            ("svc", "svc-1", "Bearer s3cret", "2")}
        runner.proc.send_signal(signal.SIGTERM)
        assert await runner.exit() == 0
        assert len(acc.drains) == 1 and acc.drains[0]["sluice-instance"] == "svc-1"
        assert runner.lines.index("lifespan.shutdown") > runner.lines.index(
            await runner.line("draining"))

    run(main(), limit=30)


def test_streams_serves_http2_sessions_and_sigterm_drains_them(tmp_path: Path) -> None:
    async def main() -> None:
        acc = FakeAcceptor(switch=SWITCH_H2)
        runner = await Runner.start(tmp_path, "svc:app", "--acceptor", await acc.start_tcp(),
                                    "--streams", "6")
        s = await acc.session()
        assert (s.headers["sluice-protocol"], s.headers["sluice-streams"]) == ("h2", "6")
        client = await H2Client(s.reader, s.writer).start()
        r = await client.request("GET", "/x")
        assert (r.status, r.body) == (200, b"ran /x")
        assert client.max_concurrent_streams == 6
        assert "HTTP/2 sessions of 6 streams" in await runner.line("serving")
        runner.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(client.goaway.wait(), 10)  # the drain's GOAWAY
        assert await runner.exit() == 0
        assert len(acc.drains) == 1

    run(main(), limit=30)


def test_a_second_signal_closes_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        runner = await Runner.start(tmp_path, "svc:app", "--acceptor", await acc.start_tcp())
        s = await acc.session()
        await s.send_head("GET", "/hold")
        await s.end()
        await runner.line("holding")
        runner.proc.send_signal(signal.SIGINT)
        await acc.drained.wait()  # the drain waits for the held request ...
        runner.proc.send_signal(signal.SIGINT)  # ... until a second signal
        assert await runner.exit() == 1
        await s.wait_closed()
        assert runner.count("second signal: closed every session at once") == 1

    run(main(), limit=30)


def test_mtls_to_the_acceptor(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(cert))
    server_ctx.load_cert_chain(cert, key)
    server_ctx.verify_mode = ssl.CERT_REQUIRED  # an mTLS acceptor: no certificate, no session

    async def main() -> None:
        acc = FakeAcceptor(close_on_drain=True)
        addr = await acc.start_tcp(server_ctx)
        runner = await Runner.start(tmp_path, "svc:app", "--acceptor", addr, "--tls-ca", str(cert),
                                    "--tls-cert", str(cert), "--tls-key", str(key))
        s = await acc.session()
        assert s.writer.get_extra_info("ssl_object").getpeercert() is not None
        assert (await s.request("GET", "/tls")).body == b"ran /tls"
        runner.proc.send_signal(signal.SIGTERM)
        assert await runner.exit() == 0 and len(acc.drains) == 1

    run(main(), limit=30)


def test_an_unreachable_acceptor_is_retried_not_fatal(tmp_path: Path) -> None:
    async def main() -> None:
        # Bound but not listening: every dial is refused until the acceptor starts.
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        host, port = sock.getsockname()[:2]
        runner = await Runner.start(tmp_path, "svc:wsgi", "--acceptor", f"{host}:{port}",
                                    "--service", "api")
        await runner.line("cannot register with the acceptor")
        acc = FakeAcceptor(close_on_drain=True)
        await acc.start_sock(sock)
        s = await acc.session()
        assert (await s.request("GET", "/w")).body == b"wsgi /w"  # a WSGI app, detected
        await runner.line("again after")
        assert runner.count("cannot register") == 1  # one warning for the outage
        runner.proc.send_signal(signal.SIGTERM)
        assert await runner.exit() == 0

    run(main(), limit=30)


@pytest.mark.parametrize("args,code,message", [
    (["svc"], 2, "must be given as MODULE:ATTRIBUTE, e.g. main:app, not 'svc'"),
    (["nosuch:app"], 2, "cannot import 'nosuch': no module named 'nosuch'"),
    (["svc:ap"], 2, "module 'svc' has no attribute 'ap'"),
    (["svc:not_an_app"], 2, "svc:not_an_app is a int, not an ASGI or WSGI application"),
    (["broken:app"], 1, "ModuleNotFoundError: No module named 'missing_dependency'"),
    (["svc:app", "--acceptor", "nowhere"], 2, "acceptor must be host:port or unix:/path"),
    (["svc:app", "--acceptor", "a:7070,,b:7070"], 2, "'a:7070,,b:7070': an empty entry"),
    (["svc:app", "--acceptor", "dns:nodes.test"], 2, "dns: needs NAME:PORT"),
    (["svc:app", "--token", "env:NO_SUCH_VARIABLE"], 2, "NO_SUCH_VARIABLE is not set"),
    (["svc:app", "--tls-cert", "c.pem"], 2, "--tls-cert and --tls-key go together"),
    (["svc:app", "--capacity", "many"], 2, "invalid int value: 'many'"),
    (["svc:app", "--streams", "0"], 2, "or a whole number from 1 to 1000 (HTTP/2 sessions)"),
    (["svc:app", "--streams", "1001"], 2, "or a whole number from 1 to 1000 (HTTP/2 sessions)"),
])
def test_command_line_errors_are_clear(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    (tmp_path / "broken.py").write_text("import missing_dependency\napp = None\n")

    async def main() -> None:
        acceptor = [] if "--acceptor" in args else ["--acceptor", "127.0.0.1:9"]
        runner = await Runner.start(tmp_path, *args, *acceptor)
        assert await runner.exit() == code
        assert runner.count(message) == 1, "\n".join(runner.lines)

    run(main(), limit=30)


def test_a_failed_startup_exits_3_and_dials_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        addr = await acc.start_tcp()
        runner = await Runner.start(tmp_path, "svc:app", "--acceptor", addr,
                                    env={"SVC_FAIL": "1"})
        assert await runner.exit() == 3
        assert runner.count("lifespan startup failed: no database") == 1
        assert acc.attempts == 0

    run(main(), limit=30)


def test_a_refusal_for_good_exits_1(tmp_path: Path) -> None:
    async def main() -> None:
        acc = FakeAcceptor(answers=[401, 401])
        runner = await Runner.start(tmp_path, "svc:app", "--acceptor", await acc.start_tcp(),
                                    "--capacity", "2")
        assert await runner.exit() == 1
        assert runner.count("every session was refused for good") == 1
        assert runner.count("lifespan.shutdown") == 1  # the app still shut down

    run(main(), limit=30)


def test_help_names_every_option() -> None:
    import subprocess

    out = subprocess.run([sys.executable, "-m", "sluice_sdk", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for option in ("--acceptor", "--capacity", "--streams", "--service", "--slice", "--instance", "--token",
                   "--tls", "--lifespan", "--drain-timeout", "dns:NAME:PORT", "--resolve-interval",
                   "--node-grace"):
        assert option in out
    assert textwrap.dedent(out).startswith("usage: python -m sluice_sdk")


def test_many_nodes_from_the_command_line_split_and_drain(tmp_path: Path) -> None:
    async def main() -> None:
        tally = Tally()
        a, b = FakeNode(tally), FakeNode(tally)
        acceptor = f"{await a.start()}, {await b.start()}"
        runner = await Runner.start(tmp_path, "svc:app", "--acceptor", acceptor, "--capacity", "4",
                                    "--instance", "svc-1", "--node-grace", "0.5")
        await tally.until(lambda: [len(a.open), len(b.open)] == [2, 2])
        assert (await a.request("/x")).body == b"ran /x"
        runner.proc.send_signal(signal.SIGTERM)
        assert await runner.exit() == 0
        assert [len(a.drains), len(b.drains)] == [1, 1]

    run(main(), limit=30)


def test_many_nodes_all_refusing_the_link_exit_1(tmp_path: Path) -> None:
    async def main() -> None:
        tally = Tally()
        a, b = FakeNode(tally), FakeNode(tally)
        a.link_status = b.link_status = 401
        runner = await Runner.start(tmp_path, "svc:app", "--acceptor",
                                    f"{await a.start()},{await b.start()}")
        assert await runner.exit() == 1
        assert runner.count("every session was refused for good") == 1
        assert a.registrations == b.registrations == 0

    run(main(), limit=30)
