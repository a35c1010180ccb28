"""Every vector of protocol/vectors/session.json that an SDK runs (see protocol/README.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fakes import run, serve_once
from sluice_sdk import Backoff, Identity, Options, OptionsError, ProtocolError, Refused, dial
from sluice_sdk.protocol import client_address, drain_request, registration

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


def options(acceptor: str, v: dict[str, Any]) -> Options:
    return Options(acceptor=acceptor, service=v["service"], slice=v["slice"], instance=v["instance"],
                   token=v["token"], backoff=Backoff(initial=0.01), handshake_timeout=5.0)


def test_the_vectors_file_is_version_1() -> None:
    assert load()["version"] == 1


@pytest.mark.parametrize("vector", section("registrations"))
def test_registration_bytes(vector: dict[str, Any]) -> None:
    assert registration(identity(vector["identity"]), vector["capacity"]) == latin1(vector["bytes"])


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

    async def main() -> None:
        server, addr = await serve_once(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: sluice-session/1\r\n\r\n", seen.append)
        async with server:
            _, writer, _ = await dial.register(options(addr, vector["identity"]), vector["capacity"])
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
        o = dataclasses.replace(opts, acceptor=addr)
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
