"""The TLS scenario: each proxy terminates TLS with the same certificate (ECDSA P-256, then
RSA 2048) in front of its own plain keep-alive backend, and is measured three ways, rounds
interleaved: keep-alive HTTPS (wrk), a new connection with a full handshake per request, and a
new connection that resumes its session per request (`tlsload`, rustls, 16 clients), and a new
connection per request from wrk (`Connection: close`, 32 at once; OpenSSL, as curl-like clients
and load balancers are) over TLS and, on a second plain listener of each proxy, in plaintext.
What counts is the proxy's CPU per request (per connection, for all but the first), as a ratio
to NGINX's in the same round. NGINX and HAProxy speak TLS 1.3 as Sluice does (Debian's NGINX
1.22 offers only up to TLS 1.2 unless `ssl_protocols` names TLSv1.3, and its TLS 1.2 handshake
is much the cheaper: a comparison across versions measures the version).
`sluice-tls-b` is a second, identical Sluice: the A/A pair (with SLUICE_B set, that binary: an
A/B). `sluice-tls-aws-lc` is Sluice built
with AWS-LC instead of ring (`CARGO_TARGET_DIR=target/awslc cargo build --release -p sluice-cli
--features sluice/aws-lc-rs`), run when that build is there."""

import dataclasses
import json
import os
import subprocess

from . import load, targets
from .procs import LOAD_CPU, PROXY_CPU, Group, free_port, only_child, sample_proc, wait_port
from .targets import Backend, Target, binary

TARGETS = ("sluice-tls", "sluice-tls-b", "nginx-tls", "haproxy-tls")
AWS_LC = os.path.join(targets.ROOT, "target", "awslc", "release", "sluice")
KEYS = ("ecdsa", "rsa")
MODES = ("keepalive", "full", "resumed", "close", "close-plain")
KEEPALIVE_CONNECTIONS = 64
HANDSHAKE_CONNECTIONS = 16
CLOSE_CONNECTIONS = 32


def _certificate(tmp, key):
    """A `localhost` certificate of `key` type signed by a CA of the same type; returns the
    paths (CA, certificate, key, certificate and key in one file, as HAProxy wants them)."""
    algo = (["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"] if key == "ecdsa"
            else ["-newkey", "rsa:2048"])
    ca, ca_key = f"{tmp}/{key}-ca.pem", f"{tmp}/{key}-ca.key"
    cert, priv, csr = f"{tmp}/{key}.pem", f"{tmp}/{key}.key", f"{tmp}/{key}.csr"
    ext = _write_ext(tmp)

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", *algo, "-nodes", "-days", "2", "-subj", f"/CN=bench {key} CA",
            "-keyout", ca_key, "-out", ca)
    openssl("req", "-new", *algo, "-nodes", "-subj", "/CN=localhost", "-keyout", priv,
            "-out", csr)
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-days", "2", "-extfile", ext, "-out", cert)
    combined = f"{tmp}/{key}.combined.pem"
    with open(combined, "w") as out:
        for path in (cert, priv):
            with open(path) as f:
                out.write(f.read())
    return ca, cert, priv, combined


def _write_ext(tmp):
    return targets._write(tmp, "leaf.ext", "basicConstraints=CA:FALSE\n"
                          "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")


def _start(group, tmp, name, pem, h2=False):
    """Starts proxy `name` (`sluice-*`, `nginx-*` or `haproxy-*`) terminating TLS with `pem`
    in front of a plain keep-alive backend of its own; `h2` offers HTTP/2 by ALPN (the h2
    scenario), else HTTP/1.1 only. Returns the HTTPS target and the same proxy's plain
    listener (HTTP/1.1) as a second one."""
    upstream, stats, port, plain = free_port(), free_port(), free_port(), free_port()
    targets._backend(group, f"{name}-backend", Backend(), stats,
                     ["--listen", f"127.0.0.1:{upstream}"], "listening")
    starter = (_sluice if name.startswith("sluice") else
               _nginx if name.startswith("nginx") else _haproxy)
    pid = starter(group, tmp, name, pem, (port, plain), upstream, h2)
    wait_port(port)
    wait_port(plain)
    return (Target(name, port, pid, upstream, stats, scheme="https"),
            Target(name, plain, pid, upstream, stats))


def _sluice(group, tmp, name, pem, ports, upstream, h2):
    _, cert, priv, _ = pem
    port, plain = ports
    conf = targets._write(tmp, f"{name}.toml", f"""[runtime]
workers = 1

[[listener]]
name = "bench"
listen = "127.0.0.1:{port}"
tls = {{ cert = "{cert}", key = "{priv}" }}
http2 = {"true" if h2 else "false"}
own_http2 = {"true" if "h2own" in name else "false"}

[[listener]]
name = "plain"
listen = "127.0.0.1:{plain}"

[[route]]
cluster = "{targets.SERVICE}"

[cluster.{targets.SERVICE}]
kind = "static"
endpoints = ["127.0.0.1:{upstream}"]
pool = {{ max_idle_per_endpoint = {targets.KEEPALIVE} }}
""")
    sluice = AWS_LC if name == "sluice-tls-aws-lc" else targets._sluice(name)
    return group.start(name, [sluice, "run", "-c", conf], PROXY_CPU).pid


def _nginx(group, tmp, name, pem, ports, upstream, h2):
    # NGINX's defaults: tickets on (as Sluice's), no shared session cache.
    _, cert, priv, _ = pem
    port, plain = ports
    upstream_block = (f"server 127.0.0.1:{upstream}; keepalive {targets.KEEPALIVE}; "
                      "keepalive_requests 1000000;")
    location = 'proxy_http_version 1.1; proxy_set_header Connection "";'
    conf = targets._nginx_conf(tmp, name, port, "", upstream_block, location,
                               tls=(cert, priv), http2=h2, plain=plain)
    return only_child(group.start(name, ["nginx", "-c", conf, "-p", tmp], PROXY_CPU).pid)


def _haproxy(group, tmp, name, pem, ports, upstream, h2):
    port, plain = ports
    alpn = " alpn h2,http/1.1" if h2 else ""
    conf = targets._write(tmp, f"{name}.cfg", f"""
global
    nbthread 1
    maxconn 8000

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    http-reuse always

frontend bench
    bind 127.0.0.1:{port} ssl crt {pem[3]}{alpn}
    bind 127.0.0.1:{plain}
    default_backend backend

backend backend
    server s1 127.0.0.1:{upstream}
""")
    return group.start(name, ["haproxy", "-db", "-f", conf], PROXY_CPU).pid


def _handshakes(target, pem, mode, seconds):
    """`tlsload` for `seconds`: a `Run` whose requests are the handshakes counted."""
    cmd = ["taskset", "-c", str(LOAD_CPU), binary("tlsload"), "--addr",
           f"127.0.0.1:{target.port}", "--ca", pem[0], "--connections",
           str(HANDSHAKE_CONNECTIONS), "--seconds", str(seconds), "--mode", mode]
    before = sample_proc(target.pid)
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    after = sample_proc(target.pid)
    run = load.Run(target.name)
    run.requests = out["requests"]
    run.seconds = out["seconds"]
    run.rps = out["requests"] / max(out["seconds"], 1e-9)
    run.errors = out["errors"]
    run.cpu_us_per_req = (after.cpu_s - before.cpu_s) * 1e6 / max(out["requests"], 1)
    run.extra["resumed"] = out["resumed"]
    return run


def tls(b):
    """Per key type and mode, rounds of every target in rotated order."""

    out = {"keys": {}}
    rounds = max(2, b.p.headline_rounds // 2) if b.p.name != "smoke" else 1
    seconds = b.p.seconds
    for key in (KEYS if b.p.name != "smoke" else KEYS[:1]):
        group = Group(b.work)
        try:
            pem = _certificate(b.work, key)
            names = TARGETS + (("sluice-tls-aws-lc",) if b.p.name != "smoke"
                               and os.path.exists(AWS_LC) else ())
            started = {name: _start(group, b.work, name, pem) for name in names}
            ts = {name: tls for name, (tls, _) in started.items()}
            plain = {name: p for name, (_, p) in started.items()}
            modes = out["keys"][key] = {mode: {name: [] for name in ts} for mode in MODES}
            for r in range(rounds):
                for mode in MODES:
                    for name in load.rotated(ts, r):
                        group.check_alive()
                        t = ts[name]
                        if mode == "keepalive":
                            run = load.wrk(t, KEEPALIVE_CONNECTIONS, seconds=seconds)
                        elif mode in ("close", "close-plain"):
                            t = t if mode == "close" else plain[name]
                            run = load.wrk(t, CLOSE_CONNECTIONS, seconds=seconds,
                                           headers=("Connection: close",))
                        else:
                            run = _handshakes(t, pem, mode, seconds)
                        modes[mode][name].append(dataclasses.asdict(run))
                        b.say(f"tls {key} {mode:9} round {r + 1}/{rounds} {name:13} "
                              f"{run.rps:8.0f} rps  {run.cpu_us_per_req:6.1f} us CPU/req  "
                              f"errors {run.non2xx + run.errors}"
                              + (f"  resumed {run.extra['resumed']}" if mode in ("full", "resumed") else ""))
        finally:
            group.close()
    out["rounds"] = rounds
    return out
