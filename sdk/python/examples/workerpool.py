#!/usr/bin/env python3
"""Capacity that follows a real bounded resource: W worker threads do blocking work (a slow
hash), and the service keeps exactly W sessions registered, so the proxy never hands it more
concurrent requests than it has workers — no queue forms inside the service. SIGUSR1 adds a
worker, SIGUSR2 removes one; each resize calls ``set_capacity`` to match.

    python3 examples/workerpool.py --acceptor 127.0.0.1:7070 --service hash --workers 4
    kill -USR1 <pid>   # 5 workers, 5 sessions
"""

import argparse
import asyncio
import hashlib
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import sluice_sdk


class WorkerPool:
    """A thread pool whose size can change; in-flight jobs finish on the pool they started in."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.executor = ThreadPoolExecutor(size)

    def resize(self, size: int) -> None:
        old, self.executor, self.size = self.executor, ThreadPoolExecutor(size), size
        old.shutdown(wait=False)

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


def slow_hash(data: bytes) -> str:
    return hashlib.pbkdf2_hmac("sha256", data, b"sluice", 200_000).hex()


def make_app(pool: WorkerPool):
    async def app(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        digest = await pool.run(slow_hash, body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": f"{digest}\n".encode()})

    return app


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--acceptor", default="127.0.0.1:7070")
    p.add_argument("--service", default="hash")
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()
    pool = WorkerPool(args.workers)
    options = sluice_sdk.Options(acceptor=args.acceptor, service=args.service,
                                 capacity=pool.size, token=os.environ.get("SLUICE_TOKEN"))
    sessions = await sluice_sdk.serve(make_app(pool), options)

    def resize(delta: int) -> None:
        pool.resize(max(pool.size + delta, 1))
        sessions.set_capacity(pool.size)  # surplus sessions retire on their next response
        print(f"workers={pool.size} sessions target={sessions.capacity}", flush=True)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, resize, +1)
    loop.add_signal_handler(signal.SIGUSR2, resize, -1)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await sessions.shutdown()
    pool.executor.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
