"""HTTP/2 sessions (protocol/README.md "HTTP/2 sessions") against a fake acceptor whose sessions
are driven by an h2 client, as Sluice drives them: the option, the refusal of an acceptor that
does not take them, and the ASGI server on the session — streams at once, bodies under flow
control, trailers, resets, retirement and the drain's GOAWAY."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from fakes import SWITCH, SWITCH_H2, FakeAcceptor, run
from h2fakes import H2Client
from hyperframe.frame import GoAwayFrame

import sluice_sdk
from sluice_sdk import Backoff, Options, OptionsError, WsgiApp
from sluice_sdk.errors import H2Unsupported
from sluice_sdk.h2server import STREAM_WINDOW


def opts(acceptor: str, streams: int | None = 4, capacity: int = 1) -> Options:
    return Options(acceptor=acceptor, service="api", instance="api-1", capacity=capacity,
                   streams=streams, backoff=Backoff(initial=0.01, max=0.05))


async def start(app: Any, streams: int = 4, capacity: int = 1, window: int | None = None,
                auto_ack: bool = True) -> tuple[FakeAcceptor, sluice_sdk.Sessions, H2Client]:
    acc = FakeAcceptor(switch=SWITCH_H2)
    sessions = await sluice_sdk.serve(app, opts(await acc.start_tcp(), streams, capacity),
                                      lifespan="off")
    s = await acc.session()
    client = await H2Client(s.reader, s.writer, window=window, auto_ack=auto_ack).start()
    await sessions.wait_registered(1)
    return acc, sessions, client


async def ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


# -- the option ------------------------------------------------------------------------------


@pytest.mark.parametrize("streams", [0, 1001, -1, True, 2.0, "8"])
def test_streams_outside_1_to_1000_is_refused_before_any_dial(streams: Any) -> None:
    with pytest.raises(OptionsError, match="streams"):
        Options(acceptor="127.0.0.1:7070", service="api", streams=streams)


@pytest.mark.parametrize("streams", [None, 1, 1000])
def test_streams_none_or_1_to_1000_is_taken(streams: int | None) -> None:
    assert Options(acceptor="127.0.0.1:7070", service="api", streams=streams).streams == streams


def test_an_acceptor_without_http2_sessions_stops_the_slots_with_an_error_that_says_so() -> None:
    async def main() -> None:
        acc = FakeAcceptor(switch=SWITCH)  # a 101 that does not name Sluice-Protocol: h2
        sessions = await sluice_sdk.serve(ok, opts(await acc.start_tcp(), 8, 2), lifespan="off")
        with pytest.raises(H2Unsupported) as err:
            await sessions.wait_registered(timeout=5)
        assert "does not take HTTP/2 sessions" in str(err.value)
        assert err.value.retryable is False
        assert await sessions.wait_refused() is sessions.last_error
        await asyncio.sleep(0.2)
        assert acc.attempts == 2  # one per slot, never again
        assert acc.registrations[0]["sluice-protocol"] == "h2"
        assert acc.registrations[0]["sluice-streams"] == "8"
        sessions.close()

    run(main())


# -- serving ---------------------------------------------------------------------------------


def test_a_request_reaches_the_app_as_http2_with_the_client_address_and_fields() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await ok(scope, receive, send)

    async def main() -> None:
        _, sessions, client = await start(app, streams=5)
        await client.settings.wait()
        assert client.max_concurrent_streams == 5
        r = await client.request("GET", "/a%20b?x=1", headers=[
            ("sluice-client-addr", "203.0.113.7:4711"), ("x-forwarded-proto", "https"),
            ("tracestate", "a=1"), ("tracestate", "b=2"), ("cookie", "c=1"), ("cookie", "d=2"),
            ("te", "trailers")])
        assert (r.status, r.body) == (200, b"ok")
        sessions.close()

    run(main())
    [scope] = seen
    assert scope["http_version"] == "2"
    assert scope["client"] == ("203.0.113.7", 4711)
    assert scope["scheme"] == "https"
    assert (scope["method"], scope["path"], scope["raw_path"], scope["query_string"]) == (
        "GET", "/a b", b"/a%20b", b"x=1")
    assert scope["headers"][0] == (b"host", b"app.example")
    assert [v for k, v in scope["headers"] if k == b"tracestate"] == [b"a=1", b"b=2"]
    assert [v for k, v in scope["headers"] if k == b"cookie"] == [b"c=1; d=2"]
    assert (b"te", b"trailers") in scope["headers"]
    assert not any(k.startswith(b":") for k, _ in scope["headers"])


def test_without_a_client_address_the_session_peer_is_reported() -> None:
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["client"])
        await ok(scope, receive, send)

    async def main() -> None:
        _, sessions, client = await start(app)
        await client.request("GET", "/", headers=[("sluice-client-addr", "evil")])
        sessions.close()

    run(main())
    assert seen[0][0] == "127.0.0.1" and seen[0][1] > 0


def test_streams_run_at_once_up_to_the_declared_number() -> None:
    inside = 0
    peak = 0
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        await release.wait()
        inside -= 1
        await ok(scope, receive, send)

    async def main() -> None:
        _, sessions, client = await start(app, streams=3)
        rs = [await client.open() for _ in range(3)]
        while inside < 3:
            await asyncio.sleep(0.01)
        release.set()
        for r in rs:
            await r.ended.wait()
            assert r.status == 200
        sessions.close()

    run(main())
    assert peak == 3  # all three at once on one session: not one at a time


def test_bodies_stream_both_ways_intact() -> None:
    payload = bytes(range(256)) * 4096 * 2  # 2 MiB

    async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while True:
            m = await receive()
            await send({"type": "http.response.body", "body": m.get("body", b""),
                        "more_body": m.get("more_body", False)})
            if not m.get("more_body", False):
                return

    async def main() -> None:
        _, sessions, client = await start(echo)
        r = await client.request("POST", "/echo", body=payload)
        assert r.status == 200
        assert len(r.body) == len(payload) and r.body == payload
        sessions.close()

    run(main())


def test_a_request_body_is_taken_only_as_the_app_reads_it() -> None:
    """The SDK reopens the stream's window as the app consumes: an app that does not read
    holds the client at one window."""
    go = asyncio.Event()
    got: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await go.wait()
        n = 0
        while True:
            m = await receive()
            n += len(m["body"])
            if not m["more_body"]:
                break
        got.append(n)
        await ok(scope, receive, send)

    async def main() -> None:
        _, sessions, client = await start(app)
        r = await client.open("POST", "/", end=False)
        sending = asyncio.ensure_future(client.send(r.stream_id, b"x" * (STREAM_WINDOW * 4),
                                                    end=True))
        await asyncio.sleep(0.3)
        assert not sending.done()  # blocked: the window is not reopened while the app waits
        assert client.conn.local_flow_control_window(r.stream_id) == 0
        go.set()
        await sending
        await r.ended.wait()
        assert r.status == 200
        sessions.close()

    run(main())
    assert got == [STREAM_WINDOW * 4]


def test_a_response_body_waits_for_the_clients_window() -> None:
    big = b"y" * 200_000
    sent = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": big})
        sent.set()

    async def main() -> None:
        _, sessions, client = await start(app, window=1000, auto_ack=False)
        r = await client.open()
        await r.head.wait()
        await asyncio.sleep(0.2)
        assert len(r.body) == 1000  # exactly one window, no more
        assert not sent.is_set()
        while not r.ended.is_set():
            await client.ack(r.stream_id)
            r.more.clear()
            await asyncio.wait_for(r.more.wait(), 5)
        assert r.body == big
        await sent.wait()
        sessions.close()

    run(main())


def test_trailers_the_app_sends_reach_the_client() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert "http.response.trailers" in scope["extensions"]
        await send({"type": "http.response.start", "status": 200, "trailers": True,
                    "headers": [(b"content-type", b"application/grpc")]})
        await send({"type": "http.response.body", "body": b"\x00\x00\x00\x00\x00"})
        await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")],
                    "more_trailers": True})
        await send({"type": "http.response.trailers", "headers": [(b"grpc-message", b"ok")]})

    async def main() -> None:
        _, sessions, client = await start(app)
        r = await client.request("POST", "/svc/Method", headers=[("te", "trailers")])
        assert r.status == 200 and r.body == b"\x00" * 5
        assert r.trailers == [(b"grpc-status", b"0"), (b"grpc-message", b"ok")]
        sessions.close()

    run(main())


def test_a_reset_stream_cancels_the_apps_task_and_others_go_on() -> None:
    cancelled = asyncio.Event()
    started = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        await ok(scope, receive, send)

    async def main() -> None:
        _, sessions, client = await start(app)
        slow = await client.open("GET", "/slow")
        await started.wait()
        await client.reset(slow.stream_id)
        await asyncio.wait_for(cancelled.wait(), 5)
        r = await client.request("GET", "/fast")
        assert r.status == 200 and r.body == b"ok"
        sessions.close()

    run(main())


def test_a_reset_while_the_app_reads_cancels_it_and_receive_then_says_disconnect() -> None:
    messages: list[dict[str, Any]] = []
    reading = asyncio.Event()
    done = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        messages.append(await receive())
        reading.set()
        try:
            messages.append(await receive())
        except asyncio.CancelledError:
            messages.append(await receive())  # after the reset: disconnect, at once
            done.set()
            raise

    async def main() -> None:
        _, sessions, client = await start(app)
        r = await client.open("POST", "/", end=False)
        await client.send(r.stream_id, b"part")
        await reading.wait()
        await client.reset(r.stream_id)
        await asyncio.wait_for(done.wait(), 5)
        sessions.close()

    run(main())
    assert messages == [{"type": "http.request", "body": b"part", "more_body": True},
                        {"type": "http.disconnect"}]


def test_an_app_error_before_the_response_is_a_500_and_the_session_goes_on() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/boom":
            raise ValueError("boom")
        await ok(scope, receive, send)

    async def main() -> None:
        _, sessions, client = await start(app)
        r = await client.request("GET", "/boom")
        assert r.status == 500
        r = await client.request("GET", "/")
        assert r.status == 200
        sessions.close()

    run(main())


def test_head_gets_the_headers_without_the_body() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"5"), (b"connection", b"keep-alive")]})
        await send({"type": "http.response.body", "body": b"hello"})

    async def main() -> None:
        _, sessions, client = await start(app)
        r = await client.request("HEAD", "/")
        assert (r.status, r.body, r.header(b"content-length")) == (200, b"", b"5")
        assert r.header(b"connection") is None  # connection-specific: not HTTP/2
        sessions.close()

    run(main())


def test_a_wsgi_app_is_served_on_http2_sessions() -> None:
    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [environ["SERVER_PROTOCOL"].encode(), b" ", environ["REMOTE_ADDR"].encode(),
                b" ", body]

    async def main() -> None:
        _, sessions, client = await start(WsgiApp(wsgi))
        r = await client.request("POST", "/", headers=[("sluice-client-addr", "198.51.100.2:9")],
                                 body=b"data")
        assert (r.status, r.body) == (200, b"HTTP/2 198.51.100.2 data")
        sessions.close()

    run(main())


# -- ending ----------------------------------------------------------------------------------


def test_the_drain_sends_goaway_and_in_flight_streams_finish() -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.set()
        await release.wait()
        await ok(scope, receive, send)

    async def main() -> None:
        acc, sessions, client = await start(app)
        r = await client.open()
        await started.wait()
        shutdown = asyncio.ensure_future(sessions.shutdown())
        await asyncio.wait_for(acc.drained.wait(), 5)
        await asyncio.wait_for(client.goaway.wait(), 5)
        assert client.goaways[0].error_code == 0
        assert not r.ended.is_set()
        release.set()
        await r.ended.wait()
        assert r.status == 200 and r.body == b"ok"  # finished after the GOAWAY
        await asyncio.wait_for(shutdown, 5)  # the SDK closed the session once it was done
        await asyncio.wait_for(client.closed.wait(), 5)
        # The final GOAWAY names the last stream taken.
        assert client.goaways[-1].last_stream_id == r.stream_id

    run(main())


def test_a_retired_idle_session_says_goaway_and_closes() -> None:
    async def main() -> None:
        _, sessions, client = await start(ok, capacity=1)
        assert (await client.request()).status == 200
        sessions.set_capacity(0)
        await asyncio.wait_for(client.goaway.wait(), 5)
        await asyncio.wait_for(client.closed.wait(), 5)
        await asyncio.sleep(0.05)
        assert sessions.registered == 0
        sessions.close()

    run(main())


def test_a_busy_retired_session_finishes_its_streams_then_closes() -> None:
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await release.wait()
        await ok(scope, receive, send)

    async def main() -> None:
        _, sessions, client = await start(app, capacity=1)
        rs = [await client.open() for _ in range(2)]
        await asyncio.sleep(0.05)
        sessions.set_capacity(0)  # busy: it retires on its next response
        release.set()
        for r in rs:
            await r.ended.wait()
            assert r.status == 200
        await asyncio.wait_for(client.goaway.wait(), 5)
        await asyncio.wait_for(client.closed.wait(), 5)
        sessions.close()

    run(main())


def test_a_session_retired_as_it_registers_closes_with_goaway_even_after_the_preface() -> None:
    """The preface may come with the 101 (as the vectors allow): those bytes are no request,
    so a session a shrink made surplus while it registered still closes at once."""

    async def main() -> None:
        client = H2Client(None, None)  # type: ignore[arg-type]
        acc = FakeAcceptor(switch=SWITCH_H2 + client.preface())
        acc.hold_answers = True
        sessions = await sluice_sdk.serve(ok, opts(await acc.start_tcp(), 4, 1), lifespan="off")
        await acc.wait_attempts(1)
        sessions.set_capacity(0)
        acc.waiting_answers[0].set()
        s = await acc.session()
        client.reader, client.writer = s.reader, s.writer
        await client.start(initiate=False)
        await asyncio.wait_for(client.goaway.wait(), 5)
        await asyncio.wait_for(client.closed.wait(), 5)
        await asyncio.sleep(0.05)
        assert sessions.registered == 0 and acc.attempts == 1
        sessions.close()

    run(main())


def test_the_clients_goaway_lets_streams_in_flight_finish() -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.set()
        await release.wait()
        await ok(scope, receive, send)

    async def main() -> None:
        _, sessions, client = await start(app)
        r = await client.open()
        await started.wait()
        # The client's GOAWAY, as Sluice's on a node drain; h2 would then refuse to send.
        client.writer.write(GoAwayFrame(0, last_stream_id=0).serialize())
        await client.writer.drain()
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.wait_for(r.ended.wait(), 5)
        assert r.status == 200 and r.body == b"ok"
        await asyncio.wait_for(client.closed.wait(), 5)  # the service closed it, all done
        sessions.close()

    run(main())


def test_options_replace_keeps_streams() -> None:
    o = opts("127.0.0.1:1", 7)
    assert dataclasses.replace(o, capacity=3).streams == 7
