"""HTTP/3 to clients, checked with two independent HTTP/3 stacks: aioquic (Python) and
quic-go's http3 client (Go, tests/http3/h3client). One real debug `sluice` serves a TLS
listener with `http3 = true`; GET and POST with bodies go over QUIC to a static cluster (a
plain HTTP/1.1 server here) and to a dial-in session (a service on the Python SDK), through
the same routes and features as HTTP/1.1 and HTTP/2. The TCP answers offer HTTP/3 with
`Alt-Svc`."""

from __future__ import annotations

import datetime
import http.client
import http.server
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import aioquic_client
from harness import REPO, Proc, prebuilt_or_build

TOKEN = "http3-s3cret"
HERE = Path(__file__).resolve().parent


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a leaf for localhost and 127.0.0.1 it signed: (ca.pem, cert.pem, key.pem)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sluice http3 test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                       x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(san, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class _Echo(http.server.BaseHTTPRequestHandler):
    """The static cluster's endpoint: `static <METHOD> <path> <length>` and the body echoed."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if self.headers.get("transfer-encoding"):
            self.send_error(400, "the proxy sent a chunked body")
            return
        body = self.rfile.read(length)
        out = f"static {self.command} {self.path} {len(body)}\n".encode() + body
        self.send_response(200)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Setup:
    tcp: int
    udp: int
    ca: str
    go_client: Path
    sluice: Proc


CONFIG = """
[acceptor]
listen = "127.0.0.1:0"
handshakes_per_second = 0

[access_log]
format = "json"

[[listener]]
name = "public"
listen = "127.0.0.1:0"
tls = {{ cert = "{cert}", key = "{key}" }}
http3 = true

[[route]]
name = "static"
path_prefix = "/static/"
cluster = "plain"

[[route]]
name = "dialin"
cluster = "echo"

[cluster.plain]
kind = "static"
endpoints = ["127.0.0.1:{upstream}"]

[cluster.echo]
kind = "reverse"
tokens = ["env:SLUICE_TOKEN"]
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("http3")
    ca, cert, key = _certificates(tmp)
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    go_client = tmp / "h3client"
    subprocess.run(["go", "build", "-o", str(go_client), "."], cwd=HERE / "h3client", check=True)
    config = tmp / "sluice.toml"
    config.write_text(CONFIG.format(cert=cert, key=key, upstream=upstream.server_address[1]))
    sluice_bin = prebuilt_or_build("sluice-cli", "--bin", "sluice")
    sluice = Proc("sluice", [str(sluice_bin), "run", "-c", str(config), "--log-format", "json"],
                  env={"SLUICE_TOKEN": TOKEN, "RUST_LOG": "info"})
    service = None
    try:
        def field_of(message: str, key: str) -> str:
            line = sluice.wait_line(lambda l: f'"message":"{message}"' in l, message)
            return json.loads(line)["fields"][key]

        tcp = int(field_of("listening", "addr").rsplit(":", 1)[1])
        udp = int(field_of("listening for HTTP/3 (QUIC)", "addr").rsplit(":", 1)[1])
        acceptor = field_of("acceptor running", "acceptor.addr").removeprefix("Some(").removesuffix(")")
        env = {"SLUICE_TOKEN": TOKEN, "PYTHONPATH": str(REPO / "sdk/python/src")}
        service = Proc("echo", [sys.executable, str(HERE / "echo_service.py"), "--acceptor", acceptor],
                       env=env)
        service.wait_line(lambda l: l == "registered 2", "'registered 2'")
        yield Setup(tcp, udp, str(ca), go_client, sluice)
    finally:
        if service is not None:
            service.stop()
        sluice.stop()
        upstream.shutdown()


BODY = "héllo over QUIC " * 300  # 5 KiB and more: several QUIC packets


def _go(setup: Setup, method: str, path: str, data: str = "") -> tuple[int, str]:
    argv = [str(setup.go_client), "-ca", setup.ca, "-method", method]
    if data:
        argv += ["-data", data]
    out = subprocess.run(argv + [f"https://localhost:{setup.udp}{path}"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    status, _, body = out.stdout.partition("\n")
    return int(status), body


@pytest.mark.parametrize("where", ["static", "dialin"])
def test_aioquic_get_and_post(setup: Setup, where: str) -> None:
    path = "/static/a?x=1" if where == "static" else "/dial/b?y=2"
    got = aioquic_client.request("127.0.0.1", setup.udp, "GET", path, ca=setup.ca)
    assert got.status == 200, got
    assert got.body.decode() == f"{where} GET {path} 0\n"
    body = BODY.encode()
    got = aioquic_client.request("127.0.0.1", setup.udp, "POST", path, body=body, ca=setup.ca)
    assert got.status == 200, got
    assert got.body == f"{where} POST {path} {len(body)}\n".encode() + body


@pytest.mark.parametrize("where", ["static", "dialin"])
def test_quic_go_get_and_post(setup: Setup, where: str) -> None:
    path = "/static/c" if where == "static" else "/dial/d"
    assert _go(setup, "GET", path) == (200, f"{where} GET {path} 0\n")
    size = len(BODY.encode())
    assert _go(setup, "POST", path, BODY) == (200, f"{where} POST {path} {size}\n{BODY}")


def test_tcp_answers_offer_http3_by_alt_svc(setup: Setup) -> None:
    context = ssl.create_default_context(cafile=setup.ca)
    conn = http.client.HTTPSConnection("localhost", setup.tcp, context=context, timeout=20)
    conn.request("GET", "/static/e")
    res = conn.getresponse()
    assert res.read() == b"static GET /static/e 0\n"
    assert res.getheader("alt-svc") == f'h3=":{setup.udp}"; ma=86400'
    conn.close()


def test_the_access_log_names_http3(setup: Setup) -> None:
    aioquic_client.request("127.0.0.1", setup.udp, "GET", "/static/logged", ca=setup.ca)
    line = setup.sluice.wait_line(lambda l: "/static/logged" in l and '"protocol"' in l,
                                  "the access log line")
    assert json.loads(line)["protocol"] == "HTTP/3.0", line
