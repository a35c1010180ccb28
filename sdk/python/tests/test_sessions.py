"""Behaviour of sessions against a fake acceptor + proxy: serving, registering N, re-dialing,
resizing, refusals and shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sluice_sdk
from apps import Gate, hello
from fakes import FakeAcceptor, run
from sluice_sdk import Backoff, Options, Refused


def opts(acceptor: str, **kw: Any) -> Options:
    kw.setdefault("backoff", Backoff(initial=0.01, max=0.05))
    return Options(acceptor=acceptor, service="api", instance="api-1", token="s3cret", **kw)


def test_serves_an_asgi_app_and_reports_the_client_the_proxy_saw() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await hello(scope, receive, send)

    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(app, opts(await acc.start_tcp()), lifespan="off")
        s = await acc.session()
        await sessions.wait_registered(1)
        assert s.headers["sluice-service"] == "api" and s.headers["sluice-capacity"] == "1"
        # The client chose X-Forwarded-For; the proxy vouches for Sluice-Client-Addr alone.
        xff = [("X-Forwarded-For", "6.6.6.6, 10.0.0.1"), ("X-Forwarded-Proto", "https"),
               ("Sluice-Client-Addr", "203.0.113.7:4711")]
        r = await s.request("GET", "/a%20b?x=1", xff)
        assert (r.status, r.body) == (200, b"hello GET /a b?x=1\n")
        r = await s.request("POST", "/again", body=b"payload")
        assert (r.status, r.body, r.closes) == (200, b"hello POST /again?\n", False)
        peer = s.writer.get_extra_info("sockname")[:2]
        sessions.close()
        return peer

    acceptor = run(main())
    assert seen[0]["raw_path"] == b"/a%20b" and seen[0]["client"] == ("203.0.113.7", 4711)
    # Without the header, the client is the session's peer (the acceptor), never a guess.
    assert seen[1]["client"] == acceptor
    assert (seen[0]["scheme"], seen[1]["scheme"]) == ("https", "http")
    assert (b"x-forwarded-for", b"6.6.6.6, 10.0.0.1") in seen[0]["headers"]


def test_request_body_is_streamed_to_the_app() -> None:
    async def main() -> None:
        chunks: asyncio.Queue[bytes] = asyncio.Queue()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            total = b""
            while True:
                m = await receive()
                if m["body"]:
                    await chunks.put(m["body"])
                total += m["body"]
                if not m["more_body"]:
                    break
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": total, "more_body": True})
            await send({"type": "http.response.body", "body": b"!"})

        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(app, opts(await acc.start_tcp()))
        s = await acc.session()
        await s.send_head("POST", "/up", [("Transfer-Encoding", "chunked")])
        for part in (b"one", b"two", b"three"):
            await s.send_data(part)
            assert await chunks.get() == part  # the app saw it before the next was sent
        await s.end()
        r = await s.read_response()
        assert (r.status, r.body, r.headers.get("transfer-encoding")) == (200, b"onetwothree!", "chunked")
        sessions.close()

    run(main())


def test_capacity_n_registers_n_sessions() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=3))
        await sessions.wait_registered(3)
        assert sessions.registered == 3 and sessions.capacity == 3
        assert [r["sluice-capacity"] for r in acc.registrations] == ["3", "3", "3"]
        for _ in range(3):
            assert (await (await acc.session()).request()).status == 200
        sessions.close()

    run(main())


def test_a_session_closed_by_the_proxy_is_replaced() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp()))
        first = await acc.session()
        assert (await first.request()).status == 200
        first.close()  # after serving: re-dialed at once
        second = await acc.session()
        second.close()  # without serving: re-dialed after backoff.delay(0)
        third = await acc.session()
        assert (await third.request("GET", "/3")).body == b"hello GET /3?\n"
        assert acc.attempts == 3 and sessions.last_error is None
        sessions.close()

    run(main())


async def closed_by_the_service(live: list[Any], n: int) -> list[Any]:
    """Waits until the service has closed ``n`` of the ``live`` fake sessions; returns them."""
    waits = {asyncio.ensure_future(s.wait_closed()): s for s in live}
    done: set[asyncio.Future[None]] = set()
    while len(done) < n:
        finished, _ = await asyncio.wait(set(waits) - done, return_when=asyncio.FIRST_COMPLETED)
        done |= finished
    for task in set(waits) - done:
        task.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    return [waits[t] for t in done]


def test_grow_and_shrink() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=1))
        await sessions.wait_registered(1)
        sessions.set_capacity(3)
        await sessions.wait_registered(3)
        assert [r["sluice-capacity"] for r in acc.registrations] == ["1", "3", "3"]
        live = [await acc.session() for _ in range(3)]

        sessions.set_capacity(1)  # all three idle: two close at once, no request needed
        assert sessions.capacity == 1
        closed = await closed_by_the_service(live, 2)
        await sessions._shared.wait_until(lambda: sessions.registered == 1)
        [survivor] = [s for s in live if s not in closed]
        assert (await survivor.request()).closes is False  # the survivor keeps serving

        sessions.set_capacity(2)  # exactly one new dial: the retired slots did not re-dial
        grown = await acc.session()
        assert acc.attempts == 4 and grown.headers["sluice-capacity"] == "2"
        assert (await grown.request()).status == 200
        sessions.close()

    run(main())


def test_shrinking_closes_idle_sessions_at_once_and_retires_busy_ones_on_their_response() -> None:
    async def main() -> None:
        gate = Gate()
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(gate, opts(await acc.start_tcp(), capacity=3))
        live = [await acc.session() for _ in range(3)]
        await sessions.wait_registered(3)
        busy, idle = live[:2], live[2]
        for s in busy:
            await s.send_head("GET", "/busy")
            await s.end()
            await gate.started.get()

        sessions.set_capacity(1)
        # The idle session closes at once; the busy ones finish, and one of them retires.
        assert await closed_by_the_service([idle], 1) == [idle]
        gate.release.set()
        answers = [await s.read_response() for s in busy]
        assert [r.status for r in answers] == [200, 200]
        assert sorted(r.closes for r in answers) == [False, True]
        await sessions._shared.wait_until(lambda: sessions.registered == 1)
        sessions.close()

    run(main())


def test_shrinking_before_registration_dials_less() -> None:
    async def main() -> None:
        acc = FakeAcceptor(answers=[503, 503, 503])
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp(), capacity=3))
        sessions.set_capacity(1)  # slots backing off claim the retirements
        await sessions.wait_registered(1)
        assert sessions._shared.counts.slots == 1
        sessions.close()

    run(main())


def test_401_stops_for_good_with_the_error_visible() -> None:
    async def main() -> None:
        acc = FakeAcceptor(answers=[401])
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp()))
        with pytest.raises(Refused) as err:
            await sessions.wait_registered(1)
        assert err.value.status == 401 and not err.value.retryable
        assert isinstance(sessions.last_error, Refused) and sessions.last_error.status == 401
        assert acc.attempts == 1 and sessions.registered == 0
        sessions.close()

    run(main())


def test_503_is_retried() -> None:
    async def main() -> None:
        acc = FakeAcceptor(answers=[503, 429])
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp()))
        await sessions.wait_registered(1)
        assert acc.attempts == 3
        assert isinstance(sessions.last_error, Refused) and sessions.last_error.status == 429
        sessions.close()

    run(main())


def test_shutdown_drains_and_waits_for_the_in_flight_request() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        gate = Gate()
        sessions = await sluice_sdk.serve(gate, opts(await acc.start_tcp(), capacity=2))
        busy, idle = await acc.session(), await acc.session()
        await busy.send_head("GET", "/slow")
        await busy.end()
        assert await gate.started.get() == "/slow"

        shutdown = asyncio.ensure_future(sessions.shutdown())
        await acc.drained.wait()
        assert acc.drains[0]["sluice-instance"] == "api-1"
        assert acc.drains[0]["authorization"] == "Bearer s3cret"
        idle.close()  # the proxy closes idle sessions at once ...
        await sessions._shared.wait_until(lambda: sessions.registered == 1)
        assert not shutdown.done()  # the busy session is still open
        gate.release.set()
        response = await busy.read_response()  # ... and busy ones after their response
        assert (response.status, response.body) == (200, b"done\n")
        assert not shutdown.done()
        busy.close()
        await shutdown
        assert sessions.registered == 0 and acc.attempts == 2  # nothing re-dialed

    run(main())


def test_app_errors_and_upgrades() -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/raise":
            raise RuntimeError("boom")
        if scope["path"] == "/switch":
            await send({"type": "http.response.start", "status": 101, "headers": []})
        await hello(scope, receive, send)

    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(broken, opts(await acc.start_tcp()))
        s = await acc.session()
        assert (await s.request("GET", "/raise")).status == 500
        assert (await s.request("GET", "/switch")).status == 500
        h2c = [("Connection", "Upgrade"), ("Upgrade", "h2c")]
        assert (await s.request("GET", "/h2c", h2c)).status == 501  # only WebSocket upgrades
        assert (await s.request("GET", "/ok")).status == 200  # the same session, still good
        assert acc.attempts == 1
        sessions.close()

    run(main())


def test_disconnect_reaches_the_app() -> None:
    async def main() -> None:
        seen: asyncio.Queue[str] = asyncio.Queue()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            assert (await receive())["type"] == "http.request"
            await seen.put("waiting")
            await seen.put((await receive())["type"])

        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(app, opts(await acc.start_tcp()))
        s = await acc.session()
        await s.send_head("GET", "/")
        await s.end()
        assert await seen.get() == "waiting"
        s.close()
        assert await seen.get() == "http.disconnect"
        await acc.session()  # replaced
        sessions.close()

    run(main())


def test_unix_socket_acceptor(tmp_path: Any) -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_unix(str(tmp_path / "acc.sock"))))
        s = await acc.session()
        assert (await s.request("GET", "/unix")).body == b"hello GET /unix?\n"
        sessions.close()

    run(main())
