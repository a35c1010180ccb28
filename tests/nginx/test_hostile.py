"""A hostile acceptor: the test plays it on the handoff socket, lends the worker one session
(a socket pair whose other end the test answers HTTP on), then sends bad messages. For each
one the worker must close the connection and every fd that came with the message, keep
serving with the session it holds, and reconnect."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from pathlib import Path
from typing import Callable

from conftest import Nginx
from harness import WAIT, Proc

# (the message, how many fds ride with it)
HOSTILE = [
    (b"\x00\xffgarbage\x01", 0),  # not text
    (b"RECALL interop default -1", 0),  # a negative count
    (b"RECALL interop default 1", 1),  # an fd with a message that carries none
    (b"DRAIN i-1", 2),  # two fds where none belongs
    (b"SESSION 7 interop default evil", 0),  # a session without its fd
    (b"SESSION 8 interop default evil", 1),  # beyond the credit the worker gave
    (b"SESSION 9 other default evil", 1),  # a cluster the worker never asked for
    (b"HELLO 1 acceptor", 0),  # a second HELLO
    (b"CREDIT interop default 1", 0),  # the consumer's message, backwards
    (b"RECALL interop default 99999999999999999999999", 0),  # a count past any integer
    (b"DRAIN " + b"x" * 129, 0),  # a name longer than 128 bytes
    (b"DRAIN  i-1", 0),  # a double space
    (b"SLICE other default empty", 0),  # a cluster the worker never asked for
    (b"SLICE interop default full", 0),  # a state that does not exist
    (b"SLICE interop default empty", 1),  # an fd with a message that carries none
    (b"X" * 600, 0),  # longer than a message may be
]


def serve_http(sock: socket.socket) -> None:
    """The service behind the lent session: answers every request with 200 "held"."""
    buf = b""
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        buf += data
        while b"\r\n\r\n" in buf:
            head, buf = buf.split(b"\r\n\r\n", 1)  # GETs only: no body follows
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nheld\n")


def get(n: Nginx, path: str = "/work") -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{n.addr[0]}:{n.addr[1]}{path}", timeout=WAIT) as res:
            return res.status, res.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def handshake(listener: socket.socket) -> socket.socket:
    conn, _ = listener.accept()
    conn.settimeout(WAIT)
    assert conn.recv(600) == b"HELLO 1 consumer"
    conn.send(b"HELLO 1 acceptor")
    return conn


def assert_closed(conn: socket.socket, what: bytes) -> None:
    """The worker closed the connection: EOF, with nothing else sent before it except credit."""
    while True:
        data = conn.recv(600)
        if data == b"":
            return
        assert data.startswith(b"CREDIT ") or data.startswith(b"GONE "), f"after {what!r}: {data!r}"


def test_a_hostile_acceptor_is_cut_off_and_the_worker_keeps_serving(
    tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    path = tmp_path / "handoff.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(8)
    listener.settimeout(WAIT)
    nginx = nginx_factory(path, workers=1, idle=1, queue=8, queue_timeout="20s")
    conn = handshake(listener)
    assert conn.recv(600) == b"CREDIT interop default 1"
    # Lend one session: the worker's end of a socket pair; this process answers the other.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    socket.send_fds(conn, [b"SESSION 1 interop default held"], [theirs.fileno()])
    theirs.close()
    threading.Thread(target=serve_http, args=(ours,), daemon=True).start()
    assert get(nginx) == (200, b"held\n")

    for message, nfds in HOSTILE:
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(nfds)]
        if nfds:
            socket.send_fds(conn, [message], [b.fileno() for _, b in pairs])
        else:
            conn.send(message)
        for _, b in pairs:
            b.close()
        assert_closed(conn, message)
        conn.close()
        for a, _ in pairs:  # every fd that came with the message was closed by the worker
            a.settimeout(WAIT)
            assert a.recv(1) == b"", f"an fd sent with {message!r} is still open in the worker"
            a.close()
        # The worker keeps serving with the session it holds, and comes back (with backoff);
        # it holds its one idle session, so it asks no credit now.
        assert get(nginx) == (200, b"held\n"), f"after {message!r}"
        conn = handshake(listener)

    assert get(nginx) == (200, b"held\n")
    st = json.loads(get(nginx, "/sluice")[1])["upstreams"][0]
    assert st["protocol_errors"] == len(HOSTILE)
    assert st["connects"] == len(HOSTILE) + 1
    assert st["received"] == 1 and st["connected"] is True
    assert "exited on signal" not in "\n".join(nginx.proc.lines)
    conn.close()
    listener.close()
