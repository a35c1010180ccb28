"""Every vector of protocol/vectors/session.json that an SDK runs (see protocol/README.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import sluice_sdk
import h11

from fakes import SWITCH_H2, FakeAcceptor, run, serve_once
from h2fakes import H2Client
from sluice_sdk import (
    Backoff,
    Identity,
    Options,
    OptionsError,
    ProtocolError,
    Refused,
    WsgiApp,
    address,
    control,
    dial,
)
from sluice_sdk.asgi import ASGIApp
from sluice_sdk.control import (
    Demand,
    Draining,
    Floor,
    InvalidLine,
    LineReader,
    LinkClosed,
    parse_node_line,
    parse_service_line,
)
from sluice_sdk.protocol import client_address, control_request, drain_request, registration
from sluice_sdk.split import NodeView, plan

VECTORS = Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "session.json"


def load() -> dict[str, Any]:
    # A missing file must fail the suite, not skip it: it is the contract all SDKs share.
    return json.loads(VECTORS.read_text(encoding="utf-8"))


def section(name: str) -> list[Any]:
    return [pytest.param(v, id=v["name"]) for v in load()[name]]


def latin1(s: str) -> bytes:
    return s.encode("latin-1")


def identity(v: dict[str, Any]) -> Identity:
    return Identity(v["service"], v["slice"], v["instance"], v["token"])


def options(acceptor: str, v: dict[str, Any], streams: int | None = None) -> Options:
    return Options(acceptor=acceptor, service=v["service"], slice=v["slice"], instance=v["instance"],
                   token=v["token"], backoff=Backoff(initial=0.01), handshake_timeout=5.0,
                   streams=streams)


def test_the_vectors_file_is_version_1() -> None:
    assert load()["version"] == 1


@pytest.mark.parametrize("vector", section("registrations"))
def test_registration_bytes(vector: dict[str, Any]) -> None:
    # `streams` absent or null: an HTTP/1.1 session; a number: Sluice-Protocol: h2 and
    # Sluice-Streams.
    got = registration(identity(vector["identity"]), vector["capacity"], vector.get("streams"))
    assert got == latin1(vector["bytes"])


def test_the_vectors_have_http2_registrations() -> None:
    """The HTTP/2 vectors are run, not skipped by a file without them."""
    assert [v["streams"] for v in load()["registrations"] if v.get("streams")] == [100, 1]
    assert len([v for v in load()["replies"] if v["request"] == "register-h2"]) >= 5


@pytest.mark.parametrize("vector", section("drains"))
def test_drain_bytes(vector: dict[str, Any]) -> None:
    assert drain_request(identity(vector["identity"])) == latin1(vector["bytes"])


@pytest.mark.parametrize(
    "vector", [p for p in section("registrations") if p.values[0]["capacity"] is not None]
)
def test_registration_is_what_the_sdk_writes(vector: dict[str, Any]) -> None:
    """The bytes written on a real socket by ``dial.register`` (the SDK always sends its
    current capacity, so vectors without ``Sluice-Capacity`` are covered by the codec test)."""
    seen: list[bytes] = []
    streams = vector.get("streams")
    switch = SWITCH_H2 if streams else b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: sluice-session/1\r\n\r\n"

    async def main() -> None:
        server, addr = await serve_once(switch, seen.append)
        async with server:
            _, writer, _ = await dial.register(options(addr, vector["identity"], streams),
                                               vector["capacity"])
            writer.close()

    run(main())
    assert seen == [latin1(vector["bytes"])]


@pytest.mark.parametrize("vector", section("replies"))
def test_reply(vector: dict[str, Any]) -> None:
    expect = vector["expect"]
    data = latin1(vector["bytes"])
    opts = options("127.0.0.1:1", {"service": "api", "slice": "default", "instance": "api-1", "token": "s3cret"})

    async def main() -> None:
        server, addr = await serve_once(data)
        # "register-h2": a registration with Sluice-Protocol: h2 (here of 8 streams).
        streams = 8 if vector["request"] == "register-h2" else None
        o = dataclasses.replace(opts, acceptor=addr, streams=streams)
        async with server:
            if vector["request"] == "drain":
                await dial.drain(o)
                return None
            reader, writer, rest = await dial.register(o, 1)
            # The server closes after `data`; what a later read finds must follow `rest`.
            rest += await reader.read()
            writer.close()
            return rest

    outcome = expect["outcome"]
    if outcome in ("session", "drained"):
        rest = run(main())
        if outcome == "session":
            assert rest == latin1(expect["rest"])
        return
    with pytest.raises(Refused if outcome == "refused" else ProtocolError) as err:
        run(main())
    assert err.value.retryable is expect["retryable"]
    if outcome == "refused":
        assert err.value.status == expect["status"]
        # The acceptor's reason is shown, not just its status.
        assert expect.get("reason", "") in str(err.value)
        assert err.value.reason == expect.get("reason", "")


@pytest.mark.parametrize("vector", section("options"))
def test_options(vector: dict[str, Any]) -> None:
    if vector["valid"]:
        assert options("127.0.0.1:7000", vector["identity"]).identity == identity(vector["identity"])
    else:
        with pytest.raises(OptionsError):
            options("127.0.0.1:7000", vector["identity"])


@pytest.mark.parametrize("vector", section("client_addresses"))
def test_client_address(vector: dict[str, Any]) -> None:
    peer = ("192.0.2.1", 7070)
    headers = [(b"sluice-client-addr", latin1(v)) for v in vector["values"]]
    host, port = client_address(headers, peer)  # type: ignore[misc]
    got = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    assert got == (vector["client"] or "192.0.2.1:7070")


def fields_the_app_sees(app: ASGIApp, request: bytes) -> None:
    """Writes ``request`` on a session once the SDK has it registered, as the proxy forwards a
    client's, to ``app`` served by the SDK as any application is; the app answers 200."""

    async def main() -> None:
        acc = FakeAcceptor()
        opts = Options(acceptor=await acc.start_tcp(), service="api", backoff=Backoff(initial=0.01))
        sessions = await sluice_sdk.serve(app, opts, lifespan="off")
        s = await acc.session()
        await sessions.wait_registered(1)
        s.writer.write(request)
        await s.writer.drain()
        head = await s.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        sessions.close()

    run(main())


@pytest.mark.parametrize("vector", section("app_fields"))
def test_asgi_app_sees_the_fields_as_sent(vector: dict[str, Any]) -> None:
    """``scope["headers"]`` holds every field line, its name lower-case (ASGI), its value as
    sent, in order."""
    seen: list[list[tuple[bytes, bytes]]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["headers"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    fields_the_app_sees(app, latin1(vector["request"]))
    [headers] = seen
    for name, values in vector["fields"].items():
        assert [v for k, v in headers if k == name.encode()] == [latin1(v) for v in values], name


@pytest.mark.parametrize("vector", section("app_fields"))
def test_wsgi_app_sees_the_fields_as_sent(vector: dict[str, Any]) -> None:
    """``environ["HTTP_<NAME>"]`` holds the value as sent; field lines of one name are joined
    with ``,`` as wsgiref and gunicorn join them (the values themselves unchanged, in order)."""
    seen: list[dict[str, Any]] = []

    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(dict(environ))
        start_response("200 OK", [("Content-Length", "0")])
        return []

    fields_the_app_sees(WsgiApp(wsgi), latin1(vector["request"]))
    [environ] = seen
    for name, values in vector["fields"].items():
        key = "HTTP_" + name.upper().replace("-", "_")
        assert environ.get(key) == (",".join(values) if values else None), name


def fields_the_app_sees_on_http2(app: ASGIApp, request: bytes) -> None:
    """The same request on an HTTP/2 session, as Sluice forwards it there: its field lines
    (names lower-case, as HTTP/2 has them; values as sent, in order) in a HEADERS frame."""

    async def main() -> None:
        parser = h11.Connection(h11.SERVER)
        parser.receive_data(request)
        head = parser.next_event()
        assert isinstance(head, h11.Request)
        host = dict(head.headers)[b"host"].decode()
        fields = [(k.decode(), v.decode("latin-1")) for k, v in head.headers if k != b"host"]
        acc = FakeAcceptor(switch=SWITCH_H2)
        opts = Options(acceptor=await acc.start_tcp(), service="api", streams=4,
                       backoff=Backoff(initial=0.01))
        sessions = await sluice_sdk.serve(app, opts, lifespan="off")
        s = await acc.session()
        client = await H2Client(s.reader, s.writer).start()
        r = await client.request(head.method.decode(), head.target.decode(), fields,
                                 authority=host)
        assert r.status == 200
        sessions.close()

    run(main())


@pytest.mark.parametrize("vector", section("app_fields"))
def test_asgi_app_sees_the_fields_as_sent_on_http2_sessions(vector: dict[str, Any]) -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    fields_the_app_sees_on_http2(app, latin1(vector["request"]))
    [scope] = seen
    assert scope["http_version"] == "2"
    for name, values in vector["fields"].items():
        got = [v for k, v in scope["headers"] if k == name.encode()]
        assert got == [latin1(v) for v in values], name


@pytest.mark.parametrize("vector", section("app_fields"))
def test_wsgi_app_sees_the_fields_as_sent_on_http2_sessions(vector: dict[str, Any]) -> None:
    seen: list[dict[str, Any]] = []

    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(dict(environ))
        start_response("200 OK", [("Content-Length", "0")])
        return []

    fields_the_app_sees_on_http2(WsgiApp(wsgi), latin1(vector["request"]))
    [environ] = seen
    for name, values in vector["fields"].items():
        key = "HTTP_" + name.upper().replace("-", "_")
        assert environ.get(key) == (",".join(values) if values else None), name


# -- many nodes: the control link, its lines, the split and the acceptor address ------------


@pytest.mark.parametrize("vector", section("controls"))
def test_control_request_bytes(vector: dict[str, Any]) -> None:
    request = control_request(identity(vector["identity"]), vector["capacity"], vector.get("split"))
    assert request == latin1(vector["bytes"])


def test_the_vectors_have_links_that_split_by_service() -> None:
    assert [v for v in load()["controls"] if v.get("split") == "service"]


# The SDK's links always say Sluice-Split: service; the vectors without it are an older SDK's.
@pytest.mark.parametrize("vector", [v for v in section("controls")
                                    if v.values[0].get("split") == "service"])
def test_control_request_is_what_the_sdk_writes(vector: dict[str, Any]) -> None:
    seen: list[bytes] = []
    switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: sluice-control/1\r\n\r\n"

    async def main() -> None:
        server, addr = await serve_once(switch, seen.append)
        host, port = addr.rsplit(":", 1)
        async with server:
            opened = await dial.control(options(addr, vector["identity"]), vector["capacity"],
                                        dial.Endpoint(host, int(port)))
            assert opened is not None
            opened[1].close()

    run(main())
    assert seen == [latin1(vector["bytes"])]


@pytest.mark.parametrize("vector", section("control_replies"))
def test_control_reply(vector: dict[str, Any]) -> None:
    expect = vector["expect"]
    opts = {"service": "api", "slice": "default", "instance": "api-1", "token": "s3cret"}

    async def main() -> bytes | None:
        server, addr = await serve_once(latin1(vector["bytes"]))
        host, port = addr.rsplit(":", 1)
        async with server:
            opened = await dial.control(options(addr, opts), 4, dial.Endpoint(host, int(port)))
            if opened is None:
                return None
            reader, writer, rest = opened
            rest += await reader.read()
            writer.close()
            return rest

    outcome = expect["outcome"]
    if outcome == "control":
        assert run(main()) == latin1(expect["rest"])
        return
    if outcome == "unsupported":
        assert run(main()) is None
        return
    with pytest.raises(Refused if outcome == "refused" else ProtocolError) as err:
        run(main())
    assert err.value.retryable is expect["retryable"]
    if outcome == "refused":
        assert err.value.status == expect["status"]


def control_line_id(v: dict[str, Any]) -> str:
    return f"{v['from']}: {v['line']!r}"


@pytest.mark.parametrize("vector", [pytest.param(v, id=control_line_id(v))
                                    for v in load()["control_lines"]])
def test_control_line(vector: dict[str, Any]) -> None:
    line, expect = vector["line"], vector["parse"]
    if vector["from"] == "service":
        # What the SDK writes is exactly the line, and the line reads back as it should.
        if expect == "invalid":
            with pytest.raises(InvalidLine):
                parse_service_line(line)
            return
        [(verb, n)] = expect.items()
        assert parse_service_line(line) == (verb, n)
        encode = control.retire if verb == "retire" else control.capacity
        assert encode(n) == latin1(line + "\n")
        return
    if expect == "invalid":
        with pytest.raises(InvalidLine):
            parse_node_line(line)
    elif "draining" in expect:
        assert parse_node_line(line) == Draining()
    elif "floor" in expect:
        assert parse_node_line(line) == Floor(expect["floor"])
    else:
        assert parse_node_line(line) == Demand(**expect["demand"])


def test_control_lines_are_read_whole_across_reads_and_bounded() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        lines = LineReader(reader, b"DEMAND 0 0 0 1\nDEM")
        reader.feed_data(b"AND 1 2 3 4\nDRAI")
        reader.feed_data(b"NING\n")
        reader.feed_eof()
        assert [await lines.next_line() for _ in range(3)] == [
            "DEMAND 0 0 0 1", "DEMAND 1 2 3 4", "DRAINING"]
        with pytest.raises(LinkClosed):
            await lines.next_line()
        long = asyncio.StreamReader()
        long.feed_data(b"x" * (control.MAX_LINE + 2))
        with pytest.raises(InvalidLine):
            await LineReader(long).next_line()

    run(main())


@pytest.mark.parametrize("vector", section("splits"))
def test_split(vector: dict[str, Any]) -> None:
    nodes = [NodeView(n["live"], float(n["demand"]), n["held"], n.get("floor", True))
             for n in vector["nodes"]]
    got = plan(vector["capacity"], nodes, quiet=vector.get("quiet", False)).targets
    assert got == vector["targets"]


def test_smoothing_goes_half_way() -> None:
    assert control.smooth(None, 8.0) == 8.0
    assert control.smooth(8.0, 0.0) == 4.0


@pytest.mark.parametrize("vector", section("addresses"))
def test_address(vector: dict[str, Any]) -> None:
    expect = vector["expect"]
    if expect == "invalid":
        with pytest.raises(OptionsError):
            Options(acceptor=vector["address"], service="api")
        return
    parsed = Options(acceptor=vector["address"], service="api").address
    if "single" in expect:
        assert parsed == address.Single(expect["single"])
    elif "dns" in expect:
        assert parsed == address.Dns(expect["dns"]["name"], expect["dns"]["port"])
    else:
        assert parsed == address.Many(tuple(expect["list"]))
        # The list form in code names the same nodes.
        assert Options(acceptor=expect["list"], service="api").address == parsed
