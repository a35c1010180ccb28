"""The targets under comparison and how each is started, all on loopback, each with a backend
of its own (the same `bench-backend` binary for every target: it listens for the conventional
proxies and dials in as sessions for Sluice's reverse cluster).

A target's proxy runs alone on CPU 1 with one worker: NGINX `worker_processes 1`, HAProxy
`nbthread 1`, Sluice `workers = 1`, Pingora `threads 1`. Its backend shares CPU 0 with the load.
"""

import os
from dataclasses import dataclass

from .procs import LOAD_CPU, PROXY_CPU, free_port, only_child, wait_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Where cargo puts Sluice and the bench tools: CARGO_TARGET_DIR when it is set, as for cargo.
CARGO_TARGET_DIR = os.path.abspath(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"))
_bin_dir = os.path.join(CARGO_TARGET_DIR, "release")
PINGORA = os.path.join(ROOT, "target", "pingora", "release", "bench-pingora")
# ngx_http_sluice_module, where nginx/build.sh puts it (bench/run builds it unless --no-build).
_module = os.environ.get("SLUICE_NGINX_MODULE",
                         os.path.join(ROOT, "target", "nginx", "ngx_http_sluice_module.so"))

# Every target of the steady, ports and size scenarios, in report order. `sluice-static-b` is a
# second, identical Sluice: its ratio to `sluice-static` is the session's noise floor (A/A).
ALL = ("direct", "sluice-static", "sluice-static-b", "sluice-reverse", "nginx-keepalive",
       "nginx", "haproxy", "pingora")
# Second Sluices, not run unless asked for (--targets): `sluice-reverse-b` is to
# `sluice-reverse` what `sluice-static-b` is to `sluice-static`. With SLUICE_B set to another
# sluice binary, both `-b` targets run it instead: an A/B of two builds in the same rounds.
SECOND = ("sluice-reverse-b",)
_second_bin = os.environ.get("SLUICE_B")
# The nginx-module scenario (the seed paper's figures): stock NGINX without upstream keep-alive
# (the paper's baseline) and `nginx-b`, an identical second one (A/A: the noise floor of every
# ratio to the baseline); stock NGINX with keep-alive; NGINX with ngx_http_sluice_module, lent
# sessions by a standalone `sluice acceptor` the backend dials in to; and Sluice reverse.
MODULE = ("nginx", "nginx-b", "nginx-keepalive", "nginx-sluice", "sluice-reverse")
# A second NGINX with the module, not run unless asked for (--targets): the same module (A/A),
# or with SLUICE_MODULE_B set to another build of it, that one (an A/B in the same rounds).
MODULE_SECOND = ("nginx-sluice-b",)
_module_b = os.environ.get("SLUICE_MODULE_B")
# The spike scenario compares the proxies that can hold a service to a declared capacity.
LIMITED = ("sluice-reverse", "nginx-keepalive", "haproxy")

SERVICE = "bench"
QUEUE_MAX = 1024  # Sluice's default queue_max, and HAProxy's maxqueue to match it
QUEUE_TIMEOUT_S = 2  # Sluice's default queue_timeout, and HAProxy's `timeout queue`
KEEPALIVE = 512  # NGINX's upstream `keepalive`: above every concurrency the bench runs


@dataclass
class Backend:
    """What the backend does per request, and (spike) the capacity the proxy must respect."""

    delay_ms: int = 0
    body_bytes: int = 13
    # Sessions the dial-in backend registers, and the connection limit the conventional
    # proxies are given (None: unlimited, sessions = SESSIONS).
    capacity: int | None = None


SESSIONS = 512  # dial-in sessions when no capacity is declared: above every concurrency


@dataclass
class Target:
    name: str
    port: int  # where clients send requests
    pid: int | None  # the proxy process measured (None: clients reach the backend directly)
    upstream_port: int  # the backend's listening port, or Sluice's acceptor (reverse)
    stats_port: int  # the backend's /stats listener
    reverse: bool = False
    admin_port: int | None = None  # Sluice's admin API (metrics), where there is one
    scheme: str = "http"  # "https": the target terminates TLS (the tls scenario)
    # Another process on the request path whose CPU is reported apart (nginx-sluice: the
    # standalone acceptor, which shares the load CPU).
    helper_pid: int | None = None
    # The backend, which shares the load CPU with wrk: when that CPU is saturated, a backend
    # that costs more per request (the SDK's sessions against a plain listener) lowers RPS.
    backend_pid: int | None = None


def use_bin_dir(path):
    """Where Sluice and the bench tools are taken from (default target/release, or
    $CARGO_TARGET_DIR/release)."""
    global _bin_dir
    _bin_dir = path


def use_module(path):
    """Where ngx_http_sluice_module.so is taken from (what nginx/build.sh printed)."""
    global _module
    _module = path


def binary(name):
    return os.path.join(_bin_dir, name)


def second_bin():
    """SLUICE_B, the binary the `-b` targets run (None: they run this build, an A/A)."""
    return _second_bin


def _sluice(target):
    """The sluice binary target `target` runs: SLUICE_B's for the `-b` ones, when it is set."""
    if target.endswith("-b") and _second_bin:
        return _second_bin
    return binary("sluice")


def tools_missing(names):
    """What the named targets need that is not on this machine, as messages."""
    need = {binary("sluice"): "cargo build --release -p sluice-cli",
            binary("bench-backend"): "cargo build --release -p sluice-bench",
            binary("tlsload"): "cargo build --release -p sluice-bench"}
    missing = [f"{path} (build: {how})" for path, how in need.items() if not os.path.exists(path)]
    if any(n.startswith("nginx") for n in names) and not _which("nginx"):
        missing.append("nginx (apt-get install nginx-light)")
    if "haproxy" in names and not _which("haproxy"):
        missing.append("haproxy (apt-get install haproxy)")
    if {"nginx-sluice", "nginx-sluice-b"} & set(names) and not os.path.exists(_module):
        missing.append(f"{_module} (build: nginx/build.sh; needs apt-get install nginx nginx-dev)")
    if "pingora" in names and not os.path.exists(PINGORA):
        missing.append(f"{PINGORA} (build: bench/pingora/README.md)")
    return missing


def _which(tool):
    return any(os.access(os.path.join(d, tool), os.X_OK)
               for d in os.environ.get("PATH", "").split(os.pathsep))


# The targets that can compress (the size-gzip scenario), and what each is told: gzip at
# NGINX's default level 1, the same types, 1 KiB minimum and Vary on both.
GZIP = ("sluice-static", "sluice-static-b", "nginx", "nginx-keepalive")
GZIP_TYPES = ("text/plain", "application/json")
GZIP_MIN_LENGTH = 1024
_SLUICE_GZIP = (f'compression = {{ encodings = ["gzip"], level = {{ gzip = 1 }}, '
                f'min_size = {GZIP_MIN_LENGTH}, types = {list(GZIP_TYPES)!r} }}'.replace("'", '"'))
_NGINX_GZIP = (f"gzip on; gzip_comp_level 1; gzip_types {' '.join(GZIP_TYPES)}; "
               f"gzip_min_length {GZIP_MIN_LENGTH}; gzip_vary on; gzip_proxied any;")


def start(group, tmp, name, backend, gzip=False):
    """Starts target `name` and its backend in `group`; returns its `Target` once it answers.
    With `gzip` the proxy compresses responses (one of `GZIP`)."""
    stats = free_port()
    if name in ("sluice-reverse", "sluice-reverse-b"):
        return _sluice_reverse(group, tmp, name, backend, stats)
    if name in ("nginx-sluice", "nginx-sluice-b"):
        return _nginx_sluice(group, tmp, name, backend, stats)
    upstream = free_port()
    served = _backend(group, f"{name}-backend", backend, stats,
                      ["--listen", f"127.0.0.1:{upstream}"], "listening")
    if name == "direct":
        return Target(name, upstream, None, upstream, stats, backend_pid=served)
    port = free_port()
    starter = {"sluice-static": _sluice_static, "sluice-static-b": _sluice_static,
               "nginx": _nginx, "nginx-b": _nginx, "nginx-keepalive": _nginx, "haproxy": _haproxy,
               "pingora": _pingora}[name]
    if gzip and name not in GZIP:
        raise ValueError(f"{name} does not compress; targets that do: {', '.join(GZIP)}")
    pid = starter(group, tmp, name, port, upstream, backend, gzip)
    wait_port(port)
    return Target(name, port, pid, upstream, stats, backend_pid=served)


def _backend(group, name, backend, stats, mode, ready):
    """Starts the backend and waits for `ready` on its stdout; returns its pid."""
    cmd = [binary("bench-backend"), "--delay-ms", str(backend.delay_ms),
           "--body-bytes", str(backend.body_bytes), "--stats", f"127.0.0.1:{stats}"] + mode
    proc = group.start(name, cmd, LOAD_CPU, stdout_pipe=True)
    group.expect_line(proc, ready)
    wait_port(stats)
    return proc.pid


def _write(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _sluice_conf(tmp, name, port, admin, body, route=""):
    # The admin API changes nothing on the request path (metrics are always counted); the
    # slow-clients scenario reads its session gauges.
    return _write(tmp, f"{name}.toml", f"""[runtime]
workers = 1

[admin]
listen = "127.0.0.1:{admin}"

[[listener]]
name = "bench"
listen = "127.0.0.1:{port}"

[[route]]
cluster = "{SERVICE}"
{route}

{body}""")


def _sluice_static(group, tmp, name, port, upstream, backend, gzip=False):
    conf = _sluice_conf(tmp, name, port, free_port(), f"""[cluster.{SERVICE}]
kind = "static"
endpoints = ["127.0.0.1:{upstream}"]
pool = {{ max_idle_per_endpoint = {KEEPALIVE} }}
""", route=_SLUICE_GZIP if gzip else "")
    return group.start(name, [_sluice(name), "run", "-c", conf], PROXY_CPU).pid


def _sluice_reverse(group, tmp, name, backend, stats):
    port, acceptor, admin = free_port(), free_port(), free_port()
    conf = _sluice_conf(tmp, name, port, admin, f"""[acceptor]
listen = "127.0.0.1:{acceptor}"
handshakes_per_second = 0

[cluster.{SERVICE}]
kind = "reverse"
queue_max = {QUEUE_MAX}
queue_timeout = "{QUEUE_TIMEOUT_S}s"
""")
    proxy = group.start(name, [_sluice(name), "run", "-c", conf], PROXY_CPU)
    wait_port(acceptor)
    sessions = backend.capacity or SESSIONS
    served = _backend(group, f"{name}-backend", backend, stats,
                      ["--acceptor", f"127.0.0.1:{acceptor}", "--service", SERVICE,
                       "--sessions", str(sessions)], "registered")
    wait_port(port)
    return Target(name, port, proxy.pid, acceptor, stats, reverse=True, admin_port=admin,
                  backend_pid=served)


def _nginx(group, tmp, name, port, upstream, backend, gzip=False):
    if name != "nginx-keepalive":  # NGINX's default: HTTP/1.0 and a connection per request
        pool, location = "", ""
    else:
        pool = f"keepalive {backend.capacity or KEEPALIVE}; keepalive_requests 1000000;"
        location = 'proxy_http_version 1.1; proxy_set_header Connection "";'
    limit = f" max_conns={backend.capacity}" if backend.capacity else ""
    if gzip:
        location += " " + _NGINX_GZIP
    conf = _nginx_conf(tmp, name, port, "", f"server 127.0.0.1:{upstream}{limit}; {pool}", location)
    master = group.start(name, ["nginx", "-c", conf, "-p", tmp], PROXY_CPU)
    return only_child(master.pid)


def _nginx_conf(tmp, name, port, top, upstream, location, tls=None, http2=False, pass_="proxy_pass",
                connections=8192, scheme="http", plain=None):
    """An NGINX config with one worker of `connections`, `pass_` (proxy_pass, the module's
    sluice_pass, or grpc_pass with `scheme` grpc) in its location; `tls` = (cert, key) makes the
    listener HTTPS, `http2` offers h2 on it by ALPN, or without `tls` speaks h2c with prior
    knowledge only (`listen ... http2`: Debian 12's NGINX 1.22 has no `http2 on;`, which 1.25.1
    added; later ones still take the listen parameter, with a warning); `plain` adds a plaintext
    HTTP/1.1 listener on that port."""
    h2 = " http2" if http2 else ""
    ssl = (f" ssl{h2} backlog=4096;\n        ssl_certificate {tls[0]};\n        ssl_certificate_key "
           f"{tls[1]};\n        ssl_protocols TLSv1.2 TLSv1.3;" if tls else f"{h2} backlog=4096;")
    also = f"\n        listen 127.0.0.1:{plain} backlog=4096;" if plain else ""
    return _write(tmp, f"{name}.conf", f"""{top}
worker_processes 1;
daemon off;
master_process on;
pid {tmp}/{name}.pid;
error_log {tmp}/{name}.error.log crit;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/{name}-body;
    proxy_temp_path {tmp}/{name}-proxy;
    upstream backend {{ {upstream} }}
    server {{
        listen 127.0.0.1:{port}{ssl}{also}
        keepalive_requests 1000000;
        location / {{ {pass_} {scheme}://backend; {location} }}
    }}
}}
""")


def _nginx_sluice(group, tmp, name, backend, stats):
    """NGINX + ngx_http_sluice_module: the backend dials in to a standalone `sluice acceptor`
    (on the load CPU, like every backend), which lends its sessions to the NGINX worker over a
    UNIX socket. NGINX never connects to the backend."""
    acceptor, port, sock = free_port(), free_port(), os.path.join(tmp, f"{name}.sock")
    conf = _write(tmp, f"{name}-acceptor.toml", f"""[acceptor]
listen = "127.0.0.1:{acceptor}"
handshakes_per_second = 0

[handoff]
listen = "{sock}"

[cluster.{SERVICE}]
kind = "reverse"
""")
    helper = group.start(f"{name}-acceptor", [binary("sluice"), "acceptor", "-c", conf], LOAD_CPU)
    wait_port(acceptor)
    sessions = backend.capacity or SESSIONS
    served = _backend(group, f"{name}-backend", backend, stats,
                      ["--acceptor", f"127.0.0.1:{acceptor}", "--service", SERVICE,
                       "--sessions", str(sessions)], "registered")
    # The worker keeps every session idle in its pool, as nginx-keepalive keeps `keepalive`
    # connections; the queue is Sluice's defaults. Workers must run as the acceptor's uid.
    module = _module_b if name == "nginx-sluice-b" and _module_b else _module
    conf = _nginx_conf(
        tmp, name, port, f"load_module {module};\n{'user root;' if os.geteuid() == 0 else ''}",
        f"sluice_sessions unix:{sock} cluster={SERVICE} idle={sessions} queue={QUEUE_MAX} "
        f"queue_timeout={QUEUE_TIMEOUT_S}s;",
        'proxy_http_version 1.1; proxy_set_header Connection "";', pass_="sluice_pass")
    master = group.start(name, ["nginx", "-c", conf, "-p", tmp], PROXY_CPU)
    worker = only_child(master.pid)
    wait_port(port)
    return Target(name, port, worker, acceptor, stats, reverse=True, helper_pid=helper.pid,
                  backend_pid=served)


def _haproxy(group, tmp, name, port, upstream, backend, gzip=False):
    # As HAProxy's users would hold a server to a capacity: `maxconn` per server, a bounded
    # queue (`maxqueue`) and `timeout queue`, both matching Sluice's defaults.
    limit = f"maxconn {backend.capacity} maxqueue {QUEUE_MAX}" if backend.capacity else ""
    conf = _write(tmp, f"{name}.cfg", f"""
global
    nbthread 1
    maxconn 8000  # HAProxy needs two descriptors per connection; the limit here is 20000

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout queue {QUEUE_TIMEOUT_S}s
    http-reuse always

frontend bench
    bind 127.0.0.1:{port}
    default_backend backend

backend backend
    server s1 127.0.0.1:{upstream} {limit}
""")
    return group.start(name, ["haproxy", "-db", "-f", conf], PROXY_CPU).pid


def _pingora(group, tmp, name, port, upstream, backend, gzip=False):
    cmd = [PINGORA, "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{upstream}",
           "--threads", "1", "--keepalive", str(KEEPALIVE)]
    return group.start(name, cmd, PROXY_CPU).pid
