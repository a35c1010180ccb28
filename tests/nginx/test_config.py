"""`nginx -t` with the module: a good `sluice_sessions` passes; every bad one fails with a
message that names what is wrong."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import NGINX_CONF, Built

GOOD = ("sluice_sessions unix:{socket} cluster=interop slice=default idle=4 queue=16 queue_timeout=1s "
        "no_sessions_wait=0;")

BAD = [
    ("sluice_sessions /tmp/x.sock cluster=a;", 'must be given as "unix:/absolute/path"'),
    ("sluice_sessions unix:relative.sock cluster=a;", "must be an absolute path"),
    ("sluice_sessions unix:/" + "x" * 120 + " cluster=a;", "must be an absolute path shorter than"),
    ("sluice_sessions unix:{socket};", "cluster=NAME is required"),
    ("sluice_sessions unix:{socket} cluster=;", 'invalid "cluster="'),
    ("sluice_sessions unix:{socket} cluster=" + "c" * 129 + ";", "a name is 1-128 bytes"),
    ("sluice_sessions unix:{socket} cluster=a slice=;", 'invalid "slice="'),
    ("sluice_sessions unix:{socket} cluster=a idle=0;", 'invalid "idle=0"'),
    ("sluice_sessions unix:{socket} cluster=a idle=x;", 'invalid "idle=x"'),
    ("sluice_sessions unix:{socket} cluster=a queue=-1;", 'invalid "queue=-1"'),
    ("sluice_sessions unix:{socket} cluster=a queue_timeout=soon;", 'invalid queue_timeout "soon"'),
    ("sluice_sessions unix:{socket} cluster=a queue_timeout=0s;", 'invalid queue_timeout "0s"'),
    ("sluice_sessions unix:{socket} cluster=a no_sessions_wait=soon;", 'invalid no_sessions_wait "soon"'),
    ("sluice_sessions unix:{socket} cluster=a colour=blue;", 'unknown parameter "colour=blue"'),
    ("sluice_sessions unix:{socket} cluster=a; sluice_sessions unix:{socket} cluster=b;",
     '"sluice_sessions" directive is duplicate'),
    ("sluice_sessions unix:{socket} cluster=a; server 127.0.0.1:9;", 'has both sluice_sessions and "server"'),
    ("server 127.0.0.1:9; sluice_sessions unix:{socket} cluster=a;", 'has both sluice_sessions and "server"'),
    ("least_conn; sluice_sessions unix:{socket} cluster=a;", "cannot be combined with another balancing"),
    ("sluice_sessions;", 'invalid number of arguments in "sluice_sessions"'),
]


# (the location's sluice_pass line, the message); the test's config has an upstream "interop"
# with sluice_sessions.
BAD_PASS = [
    ("sluice_pass https://interop;", 'sluice_pass: "https://interop" must be "http://NAME"'),
    ("sluice_pass http://$host;", 'sluice_pass: "http://$host" must be "http://NAME"'),
    ("sluice_pass http://interop:80;", 'sluice_pass: "http://interop:80" must be "http://NAME"'),
    ("sluice_pass interop;", 'sluice_pass: "interop" must be "http://NAME"'),
    ("sluice_pass http://127.0.0.9;", 'upstream "127.0.0.9" has no sluice_sessions'),
    ("sluice_pass http://interop; sluice_pass http://interop;", '"sluice_pass" directive is duplicate'),
    ("sluice_pass http://interop; proxy_pass http://interop;", '"proxy_pass" directive is duplicate'),
    ("sluice_pass;", 'invalid number of arguments in "sluice_pass"'),
]


def nginx_t(built: Built, tmp: Path, directive: str, pass_line: str | None = None) -> subprocess.CompletedProcess:
    """`nginx -t` on the suite's config with its sluice_sessions directive replaced by
    `directive`, and its first sluice_pass line by `pass_line` if given."""
    prefix = tmp / "nginx"
    prefix.mkdir(exist_ok=True)
    text = NGINX_CONF.format(module=built.module, workers=1, user="", prefix=prefix, socket=tmp / "h.sock",
                             idle=1, queue=1, queue_timeout="1s", port=9, extra="")
    text = replace_statement(text, "sluice_sessions", directive.format(socket=tmp / "h.sock"))
    if pass_line is not None:
        text = replace_statement(text, "sluice_pass", pass_line)
    conf = prefix / "nginx.conf"
    conf.write_text(text)
    return subprocess.run(["nginx", "-t", "-p", str(prefix), "-c", str(conf)], check=False,
                          capture_output=True, text=True)


def replace_statement(text: str, name: str, by: str) -> str:
    """`text` with the first statement `name ...;` that starts a line replaced by `by`."""
    found = re.search(rf"^\s*{name}\b", text, re.MULTILINE)
    assert found, name
    start = found.start() + len(found.group()) - len(name)
    end = text.index(";", start) + 1
    return text[:start] + by + text[end:]


def test_a_good_directive_passes(built: Built, tmp_path: Path) -> None:
    res = nginx_t(built, tmp_path, GOOD)
    assert res.returncode == 0, res.stderr
    assert "test is successful" in res.stderr


@pytest.mark.parametrize(("directive", "message"), BAD)
def test_a_bad_directive_fails_nginx_t_clearly(built: Built, tmp_path: Path, directive: str, message: str) -> None:
    res = nginx_t(built, tmp_path, directive)
    assert res.returncode != 0
    assert "[emerg]" in res.stderr and message in res.stderr, res.stderr


@pytest.mark.parametrize(("pass_line", "message"), BAD_PASS)
def test_a_bad_sluice_pass_fails_nginx_t_clearly(built: Built, tmp_path: Path, pass_line: str, message: str) -> None:
    res = nginx_t(built, tmp_path, GOOD, pass_line)
    assert res.returncode != 0
    assert "[emerg]" in res.stderr and message in res.stderr, res.stderr


def test_sluice_pass_takes_a_uri_and_works_inside_if_and_limit_except(built: Built, tmp_path: Path) -> None:
    res = nginx_t(built, tmp_path, GOOD,
                  "sluice_pass http://interop/v1/; limit_except GET { sluice_pass http://interop; } "
                  "if ($http_x) { sluice_pass http://interop; }")
    assert res.returncode == 0, res.stderr
