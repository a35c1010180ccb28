#!/usr/bin/env python3
"""Answers "hello" through Sluice: dials the acceptor, keeps --capacity sessions registered,
and on SIGTERM/SIGINT drains and waits for the proxy to close every session.

    SLUICE_TOKEN=s3cret python3 examples/hello.py --acceptor 127.0.0.1:7070 --service hello
"""

import argparse
import asyncio
import os
import signal

import sluice_sdk


async def app(scope, receive, send):
    """The whole application: ``hello\\n`` to every request."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello\n"})


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--acceptor", default="127.0.0.1:7070")
    p.add_argument("--service", default="hello")
    p.add_argument("--capacity", type=int, default=4)
    args = p.parse_args()
    options = sluice_sdk.Options(acceptor=args.acceptor, service=args.service,
                                 capacity=args.capacity, token=os.environ.get("SLUICE_TOKEN"))
    sessions = await sluice_sdk.serve(app, options)

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await sessions.shutdown()  # drain; in-flight requests finish first


if __name__ == "__main__":
    asyncio.run(main())
