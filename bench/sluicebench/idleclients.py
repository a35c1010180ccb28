"""Idle keep-alive clients for the idle scenario: opens CONNECTIONS connections to a proxy
(plain HTTP/1.1, HTTP/1.1 over TLS, or HTTP/2 over TLS by ALPN), sends one request on each and
reads its whole answer, at most CONCURRENCY connections being opened at a time, then holds them
all open and idle. It prints one JSON line when they are all open ({"open", "failed",
"seconds"}), waits for a line on stdin, closes them all, prints {"closed"} and exits.

Standard library only (asyncio, ssl): a connection costs the client a few KiB, so one process
on the load CPU holds 10 000 of them. The HTTP/2 client is as small as the exchange needs:
preface, SETTINGS (acknowledged both ways), one HEADERS frame encoded with HPACK's static
table, and frames read until the stream ends.

  idleclients.py --port PORT --connections N [--mode plain|tls|h2] [--ca CA.pem]
"""

import argparse
import asyncio
import json
import ssl
import struct
import sys
import time

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# :method GET, :scheme https, :path / (static table 2, 7, 4), then :authority localhost as a
# literal without indexing whose name is static entry 1.
H2_REQUEST_BLOCK = b"\x82\x87\x84\x01\x09localhost"
DATA, HEADERS, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


async def http1(reader, writer):
    writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    if status != 200:
        raise RuntimeError(f"status {status}")


async def http2(reader, writer):
    writer.write(H2_PREFACE + frame(SETTINGS, 0, 0)
                 + frame(HEADERS, END_STREAM | END_HEADERS, 1, H2_REQUEST_BLOCK))
    while True:
        header = await reader.readexactly(9)
        length = int.from_bytes(header[:3], "big")
        kind, flags = header[3], header[4]
        stream = int.from_bytes(header[5:9], "big") & 0x7FFF_FFFF
        payload = await reader.readexactly(length)
        if kind == SETTINGS and not flags & ACK:
            writer.write(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            writer.write(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            raise RuntimeError("GOAWAY")
        elif kind in (HEADERS, DATA) and stream == 1 and flags & END_STREAM:
            return


async def open_one(args, context, held):
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", args.port, ssl=context, server_hostname="localhost" if context else None)
    await (http2 if args.mode == "h2" else http1)(reader, writer)
    held.append(writer)


async def main(args):
    context = None
    if args.mode != "plain":
        context = ssl.create_default_context(cafile=args.ca)
        context.set_alpn_protocols(["h2"] if args.mode == "h2" else ["http/1.1"])
    held, failures = [], []
    gate = asyncio.Semaphore(args.concurrency)

    async def one():
        async with gate:
            try:
                await asyncio.wait_for(open_one(args, context, held), 30)
            except Exception as e:  # noqa: BLE001 - counted and reported, one line
                failures.append(repr(e))

    began = time.monotonic()
    await asyncio.gather(*(one() for _ in range(args.connections)))
    print(json.dumps({"open": len(held), "failed": len(failures), "seconds":
                      time.monotonic() - began, "first_failure": failures[:1]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for writer in held:
        writer.transport.abort()  # RST rather than FIN: nothing to wait for on either side
    print(json.dumps({"closed": len(held)}), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--connections", type=int, required=True)
    ap.add_argument("--mode", choices=("plain", "tls", "h2"), default="plain")
    ap.add_argument("--ca", help="the CA that signed the proxy's certificate (tls, h2)")
    ap.add_argument("--concurrency", type=int, default=64)
    asyncio.run(main(ap.parse_args()))
