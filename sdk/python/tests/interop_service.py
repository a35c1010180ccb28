#!/usr/bin/env python3
"""Interop and benchmark service for the Sluice test suite.

    interop_service.py --acceptor HOST:PORT --service NAME --instance ID --capacity N
                       [--delay-ms D] [--listen HOST:PORT]        (token: env SLUICE_TOKEN)

Session mode dials in and prints ``registered N`` once N sessions are registered; SIGTERM
drains, waits until the proxy closed every session, prints ``drained`` and exits 0. A
permanent refusal (400/401/404) exits 1 with a message on stderr. Listen mode serves the same
app on a listening socket and prints ``listening HOST:PORT``. Each request with
``x-request-id`` prints ``start <id>``, sleeps D ms, reads the body and answers ``<instance>\\n``
(``<instance> <client address>\\n`` for a request with ``x-echo-client``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

import sluice_sdk
from sluice_sdk import Options


def make_app(instance: str, delay_ms: int) -> Any:
    """The interop application."""
    body = f"{instance}\n".encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        echo = False
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                print(f"start {value.decode('latin-1')}", flush=True)
            echo = echo or name == b"x-echo-client"
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        while (await receive()).get("more_body"):
            pass
        if echo:
            host, port = scope["client"] or ("none", 0)
            client = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            echoed = f"{instance} {client}\n".encode()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": echoed})
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def stop_event() -> asyncio.Event:
    """Set on SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def sessions_mode(args: argparse.Namespace, app: Any) -> int:
    options = Options(acceptor=args.acceptor, service=args.service, instance=args.instance,
                      token=os.environ.get("SLUICE_TOKEN") or None, capacity=args.capacity)
    stop = stop_event()
    sessions = await sluice_sdk.serve(app, options)
    registered = asyncio.ensure_future(sessions.wait_registered(args.capacity))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({registered, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if registered.done() and registered.exception() is not None:
        print(f"interop_service: refused for good: {registered.exception()}", file=sys.stderr)
        sessions.close()
        return 1
    if registered.done():
        print(f"registered {args.capacity}", flush=True)
    registered.cancel()
    await stopped
    try:
        await sessions.shutdown()
    except sluice_sdk.SluiceError as e:
        print(f"interop_service: drain failed: {e}", file=sys.stderr)
        sessions.close()
        return 1
    print("drained", flush=True)
    return 0


async def listen_mode(args: argparse.Namespace, app: Any) -> int:
    host, _, port = args.listen.rpartition(":")
    stop = stop_event()
    server = await sluice_sdk.serve_tcp(app, host.strip("[]"), int(port))
    bound_host, bound_port = server.address
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"listening {shown}:{bound_port}", flush=True)
    await stop.wait()
    server.close()
    await server.wait_closed()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--acceptor", required=True)
    p.add_argument("--service", required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--capacity", type=int, required=True)
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--listen", default=None)
    args = p.parse_args()
    app = make_app(args.instance, args.delay_ms)
    try:
        return asyncio.run(listen_mode(args, app) if args.listen else sessions_mode(args, app))
    except sluice_sdk.OptionsError as e:
        print(f"interop_service: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
