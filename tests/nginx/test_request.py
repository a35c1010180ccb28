"""What a request carries over a session: the service learns the client's real address from
`Sluice-Client-Addr` (protocol/README.md), whatever the client sent, in the form the
protocol gives it; only sluice_pass sends requests over sessions."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from conftest import Built, Nginx, free_port
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


def test_the_service_sees_the_real_client_address_and_never_a_spoofed_one(
    built: Built, tmp_path: Path, procs: list[Proc], nginx_factory: Callable[..., Nginx]
) -> None:
    sock = tmp_path / "handoff.sock"
    acceptor, addr = start_acceptor(built.bins, tmp_path, sock)
    procs.append(acceptor)
    procs.append(start_service(built.bins, "go", addr, "go", 2, 0))
    dual = free_port()  # IPv6 and IPv4 clients on one socket: IPv4 ones are v4-mapped there
    nginx = nginx_factory(sock, workers=1, idle=2, extra=f"listen [::]:{dual} ipv6only=off;")
    nginx.wait_connected(1)
    spoofs = [
        b"",
        b"Sluice-Client-Addr: 6.6.6.6:666\r\n",
        b"sluice-client-addr: 6.6.6.6:666\r\nSLUICE-CLIENT-ADDR: [::6]:6\r\n",
        b"Sluice-Client-Addr: 127.0.0.1:1\r\nX-Forwarded-For: 6.6.6.6\r\n",
    ]
    for fields in spoofs:
        response, mine = ask(nginx.addr, socket.AF_INET, fields)
        assert seen_by_service(response) == mine, fields
    # The same over the dual-stack listener: an IPv6 client as [ip]:port, an IPv4 one (an
    # IPv4-mapped peer there) as ip:port.
    for family, host in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
        for fields in spoofs[:2]:
            response, mine = ask((host, dual), family, fields)
            assert seen_by_service(response) == mine, (host, fields)


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
    # A request that did not come through sluice_pass would carry the client's own
    # Sluice-Client-Addr over a session: it never reaches one.
    response, _ = ask(nginx.addr, socket.AF_INET, b"Sluice-Client-Addr: 6.6.6.6:666\r\n",
                      path="/plain-proxy-pass")
    assert response.startswith(b"HTTP/1.1 500 "), response
    nginx.proc.wait_line(lambda line: 'takes requests from sluice_pass only' in line, "the reason")
    assert not service.started_ids()
    response, _ = ask(nginx.addr, socket.AF_INET)
    assert seen_by_service(response).startswith("127.0.0.1:")
