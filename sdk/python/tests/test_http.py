"""ASGI and WSGI semantics on one session: HEAD, unread bodies, 100-continue, failures after the
response started, and the WSGI adapter's PEP 3333 corners."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import h11

import sluice_sdk
from apps import hello
from fakes import FakeAcceptor, FakeSession, run
from sluice_sdk import Backoff, Options, WsgiApp


def opts(acceptor: str) -> Options:
    return Options(acceptor=acceptor, service="api", backoff=Backoff(initial=0.01, max=0.05))


async def one_session(app: Any) -> tuple[FakeAcceptor, sluice_sdk.Sessions, FakeSession]:
    acc = FakeAcceptor()
    sessions = await sluice_sdk.serve(app, opts(await acc.start_tcp()))
    return acc, sessions, await acc.session()


def test_head_drops_the_body_and_keeps_the_session() -> None:
    async def main() -> None:
        acc, sessions, s = await one_session(hello)
        r = await s.request("HEAD", "/h")
        assert (r.status, r.body, r.headers["content-length"]) == (200, b"", "15")
        assert (await s.request("GET", "/h")).body == b"hello GET /h?\n"
        assert acc.attempts == 1
        sessions.close()

    run(main())


def test_an_unread_body_is_skipped_and_the_session_serves_on() -> None:
    async def ignores_body(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body"})

    async def main() -> None:
        acc, sessions, s = await one_session(ignores_body)
        assert (await s.request("POST", "/", body=b"x" * 200_000)).status == 204
        assert (await s.request("POST", "/", body=b"y")).status == 204
        assert acc.attempts == 1
        sessions.close()

    run(main())


def test_100_continue_is_sent_when_the_app_reads_the_body() -> None:
    async def main() -> None:
        acc, sessions, s = await one_session(hello)
        await s.send_head("POST", "/c", [("Expect", "100-continue"), ("Content-Length", "2")])
        assert isinstance(await s._event(), h11.InformationalResponse)
        await s.send_data(b"ok")
        await s.end()
        assert (await s.read_response()).body == b"hello POST /c?\n"
        sessions.close()

    run(main())


def test_a_failure_after_the_response_started_closes_the_session() -> None:
    async def half(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"12345", "more_body": True})
        raise RuntimeError("boom")

    async def main() -> None:
        acc, sessions, s = await one_session(half)
        await s.send_head("GET", "/")
        await s.end()
        head = await s._event()
        assert isinstance(head, h11.Response) and head.status_code == 200
        await s.wait_closed()  # a truncated response is never followed by another
        await acc.session()  # and the slot dials a replacement
        sessions.close()

    run(main())


def test_wsgi_write_close_and_headers() -> None:
    closed = threading.Event()
    seen: dict[str, Any] = {}

    class Body:
        def __iter__(self) -> Any:
            return iter([b"", b"b"])

        def close(self) -> None:
            closed.set()

    def wsgi(environ: dict[str, Any], start_response: Any) -> Body:
        seen.update(environ)
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"a")
        return Body()

    async def main() -> None:
        acc, sessions, s = await one_session(WsgiApp(wsgi))
        r = await s.request("GET", "/w", [("X-User", "real"), ("X_User", "spoofed")])
        assert (r.status, r.body) == (200, b"ab")
        assert seen["HTTP_X_USER"] == "real" and closed.is_set()
        sessions.close()

    run(main())


def test_wsgi_start_response_rules() -> None:
    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ["PATH_INFO"] == "/none":
            return [b"no start_response"]
        start_response("200 OK", [])
        try:
            raise ValueError("late failure")
        except ValueError:
            import sys

            start_response("503 Service Unavailable", [], sys.exc_info())  # replaces the head
        return [b"sorry"]

    async def main() -> None:
        acc, sessions, s = await one_session(WsgiApp(wsgi))
        assert ((r := await s.request("GET", "/x")).status, r.body) == (503, b"sorry")
        assert (await s.request("GET", "/none")).status == 500
        sessions.close()

    run(main())


def test_wsgi_stops_streaming_when_the_client_goes_away() -> None:
    closed = threading.Event()

    def endless(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [])
        try:
            while True:
                yield b"x" * 1024
        finally:
            closed.set()

    async def main() -> None:
        acc, sessions, s = await one_session(WsgiApp(endless, window=2))
        await s.send_head("GET", "/")
        await s.end()
        assert isinstance(await s._event(), h11.Response)
        s.close()
        await asyncio.get_running_loop().run_in_executor(None, closed.wait)
        sessions.close()

    run(main())


def test_shutdown_deadline_closes_the_sessions_and_says_so() -> None:
    async def main() -> None:
        acc = FakeAcceptor()
        sessions = await sluice_sdk.serve(hello, opts(await acc.start_tcp()))
        s = await acc.session()
        try:
            await sessions.shutdown(timeout=0.01)
        except asyncio.TimeoutError as e:
            assert "still open" in str(e)
        else:
            raise AssertionError("shutdown returned with a session open")
        assert sessions.registered == 0
        await s.wait_closed()

    run(main())


def test_responses_carry_the_standard_reason_phrase() -> None:
    async def status(scope: dict[str, Any], receive: Any, send: Any) -> None:
        code = int(scope["path"].strip("/"))
        await send({"type": "http.response.start", "status": code, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def main() -> None:
        acc, sessions, s = await one_session(status)
        heads = []
        for code in (200, 404, 503, 599):
            await s.send_head("GET", f"/{code}")
            await s.end()
            head = await s._event()
            assert isinstance(head, h11.Response)
            heads.append((head.status_code, bytes(head.reason)))
            while not isinstance(await s._event(), h11.EndOfMessage):
                pass
            s.conn.start_next_cycle()
        # h2load and other strict clients count an empty reason ("HTTP/1.1 200 ") as a failure.
        assert heads == [(200, b"OK"), (404, b"Not Found"), (503, b"Service Unavailable"),
                         (599, b"Unknown")]
        sessions.close()

    run(main())


def test_wsgi_content_length_only_for_requests_with_a_body() -> None:
    seen: list[dict[str, Any]] = []

    def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(dict(environ))
        start_response("200 OK", [])
        return [environ["wsgi.input"].read()]

    async def main() -> None:
        acc, sessions, s = await one_session(WsgiApp(wsgi))
        assert (await s.request("GET", "/")).status == 200
        assert (await s.request("POST", "/", body=b"data")).body == b"data"
        await s.send_head("PUT", "/", [("Transfer-Encoding", "chunked")])
        for part in (b"chunk", b"ed"):
            await s.send_data(part)
        await s.end()
        assert (await s.read_response()).body == b"chunked"
        sessions.close()

    run(main())
    # A body-less GET has no Content-Length (Flask's request.content_length is None, as under
    # gunicorn); a body read whole is announced with its length, chunked or not.
    assert [e.get("CONTENT_LENGTH") for e in seen] == [None, "4", "7"]
