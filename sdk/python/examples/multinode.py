#!/usr/bin/env python3
"""One capacity across many Sluice nodes: the service dials every node behind a name (or a
list) and splits its --capacity sessions among them by demand. Its handler counts its own
concurrency, so a test can check that the nodes together never sent more than --capacity
requests at once:

    python3 examples/multinode.py --acceptor dns:nodes.test:7070 --service api --capacity 16

Every request waits --delay seconds (a fixed service time) and answers which request of how
many in flight it was. ``GET /.multinode/max`` answers ``{"max_in_flight": M, "in_flight": n,
"served": s, "capacity": N, "nodes": [...]}`` (the SDK's view of every node) without counting
itself; each new maximum is also printed as ``max_in_flight M``. SIGTERM or SIGINT drains and
prints the final ``max_in_flight M``. With ``--stats HOST:PORT`` it also serves ``GET /max``
and ``POST /capacity?n=K`` there, off the sessions. Every flag defaults to an environment variable:
SLUICE_ACCEPTOR, SLUICE_SERVICE, SLUICE_CAPACITY, SLUICE_INSTANCE, SLUICE_TOKEN, MULTINODE_DELAY.
"""

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal

import sluice_sdk

REPORT = "/.multinode/max"


class Counting:
    """The application: a fixed service time, and a count of requests in flight."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.in_flight = self.max = self.served = 0
        self.sessions: sluice_sdk.Sessions | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == REPORT:
            return await self.respond(send, json.dumps(self.report()).encode())
        self.in_flight += 1
        if self.in_flight > self.max:
            self.max = self.in_flight
            print(f"max_in_flight {self.max}", flush=True)
        try:
            await asyncio.sleep(self.delay)
            body = f"in flight {self.in_flight} of {self.max} at most\n".encode()
            await self.respond(send, body)
            self.served += 1
        finally:
            self.in_flight -= 1

    def report(self) -> dict:
        nodes = [dataclasses.asdict(n) for n in self.sessions.nodes] if self.sessions else []
        capacity = self.sessions.capacity if self.sessions else 0
        return {"max_in_flight": self.max, "in_flight": self.in_flight, "served": self.served,
                "capacity": capacity, "nodes": nodes}

    @staticmethod
    async def respond(send, body: bytes) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})


async def stats(app: Counting, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The --stats port, for a test on the same machine: ``GET /max`` answers the most requests
    ever in flight, ``POST /capacity?n=K`` sets the capacity at runtime (as the Go example's)."""
    try:
        line = (await reader.readline()).decode("latin-1").split()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        method, target = (line + ["", ""])[:2]
        status, body = "404 Not Found", "GET /max or POST /capacity?n=K\n"
        if method == "GET" and target == "/max":
            status, body = "200 OK", f"{app.max}\n"
        elif method == "POST" and target.startswith("/capacity?n="):
            n = target.removeprefix("/capacity?n=")
            if n.isdigit() and app.sessions:
                app.sessions.set_capacity(int(n))
                status, body = "200 OK", f"capacity {n}\n"
            else:
                status = "400 Bad Request"
        writer.write(f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n"
                     f"connection: close\r\n\r\n{body}".encode())
        await writer.drain()
    finally:
        writer.close()


async def main(args: argparse.Namespace) -> None:
    app = Counting(args.delay)
    options = sluice_sdk.Options(acceptor=args.acceptor, service=args.service,
                                 instance=args.instance, token=args.token, capacity=args.capacity)
    if args.stats:
        host, port = args.stats.rsplit(":", 1)
        await asyncio.start_server(lambda r, w: stats(app, r, w), host, int(port))
    app.sessions = await sluice_sdk.serve(app, options, lifespan="off")
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await app.sessions.shutdown()
    print(f"max_in_flight {app.max}", flush=True)


if __name__ == "__main__":
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--acceptor", default=env("SLUICE_ACCEPTOR"), required=not env("SLUICE_ACCEPTOR"),
                   help="dns:NAME:PORT, HOST:PORT,HOST:PORT,... or one HOST:PORT")
    p.add_argument("--service", default=env("SLUICE_SERVICE", "multinode"))
    p.add_argument("--capacity", type=int, default=int(env("SLUICE_CAPACITY", "4")))
    p.add_argument("--instance", default=env("SLUICE_INSTANCE"))
    p.add_argument("--token", default=env("SLUICE_TOKEN"))
    p.add_argument("--delay", type=float, default=float(env("MULTINODE_DELAY", "0.05")),
                   help="seconds each request takes (default 0.05)")
    p.add_argument("--stats", default=env("SLUICE_STATS"),
                   help="HOST:PORT to serve GET /max and POST /capacity?n=K locally (none by default)")
    arguments = p.parse_args()
    logging.basicConfig(level=env("SLUICE_LOG", "INFO"), format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(main(arguments))
