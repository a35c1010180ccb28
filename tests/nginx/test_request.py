"""What a request carries over a session: only sluice_pass sends requests over sessions."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Callable

from conftest import Built, Nginx
from harness import WAIT, Proc, start_acceptor, start_service


def ask(addr: tuple[str, int], family: socket.AddressFamily, fields: bytes = b"",
        path: str = "/work") -> tuple[bytes, str]:
    """One GET with `fields` among its header fields; returns the response and this client's
    own address as the protocol writes it (`ip:port`, `[ip]:port`)."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(WAIT)
        s.connect(addr)
        host, port = s.getsockname()[:2]
        mine = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: app.example\r\nX-Echo-Client: 1\r\n"
                  + fields + b"Connection: close\r\n\r\n")
        response = b""
        while chunk := s.recv(65536):
            response += chunk
    return response, mine


def seen_by_service(response: bytes) -> str:
    """The client address the Go service reported (its r.RemoteAddr, which the SDK takes from
    Sluice-Client-Addr): the body is "<instance> <address>"."""
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), response
    instance, address = body.decode().split()
    assert instance == "go", body
    return address


def test_proxy_pass_to_a_sluice_upstream_is_refused(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    service = start_service(built.bins, "go", addr, "go", 1, 0)
    procs.append(service)
    nginx = nginx_factory(sock, workers=1, idle=1)
    nginx.wait_connected(1)
    # A request that did not come through sluice_pass would reach a session without waiting
    # for one: it never reaches one.
    response, _ = ask(nginx.addr, socket.AF_INET, b"Sluice-Client-Addr: 6.6.6.6:666\r\n",
                      path="/plain-proxy-pass")
    assert response.startswith(b"HTTP/1.1 500 "), response
    nginx.proc.wait_line(lambda line: 'takes requests from sluice_pass only' in line, "the reason")
    assert not service.started_ids()
    response, _ = ask(nginx.addr, socket.AF_INET)
    assert seen_by_service(response)
