"""The admin API's live dashboard (`GET /ui`), as a browser shows it.

`sluice demo` runs with its two instances (demo-a: 8 sessions, demo-b: 4) under a closed-loop
GET load, and headless Chromium loads `/ui` and prints the DOM (`--dump-dom`). Chromium's
virtual time (`--virtual-time-budget`) lets the page run its one-second polling loop several
times within a single dump without the test sleeping: virtual time stands still while a fetch
is in flight, so every poll reads the real admin API, and the page derives rates from the
server's `uptime_seconds`, which is real time. Two dumps taken while more requests complete
must show the live numbers moving; a screenshot is kept at target/dashboard/dashboard.png.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import harness
import pytest
from harness import Load, Proc

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Virtual milliseconds per page load: about five polls of the page's one-second loop.
BUDGET_MS = 5500
SCREENSHOT = harness.REPO / "target/dashboard/dashboard.png"
ADMIN_TOKEN = "dashboard-s3cret"


class Dom(HTMLParser):
    """The parts of a dumped page the test reads: each id'd element's text and attributes,
    and the rows (attributes and cell texts) of each id'd table."""

    VOID = {"meta", "link", "br", "hr", "img", "input", "col", "area", "base", "wbr"}

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.texts: dict[str, str] = {}
        self.attrs_of: dict[str, dict[str, str]] = {}
        self.rows: dict[str, list[tuple[dict[str, str], list[str]]]] = {}
        self._open: list[tuple[str, str | None]] = []  # (tag, id)
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        ident = attrs.get("id")
        if ident:
            self.texts[ident] = ""
            self.attrs_of[ident] = attrs
        table = next((i for t, i in reversed(self._open) if t == "table"), None)
        if tag == "tr" and table:
            self.rows.setdefault(table, []).append((attrs, []))
        if tag == "td" and table and self.rows.get(table):
            self._cell = []
            self.rows[table][-1][1].append("")
        if tag not in self.VOID:
            self._open.append((tag, ident))

    def handle_endtag(self, tag):
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break
        if tag == "td":
            self._cell = None

    def handle_data(self, data):
        for _, ident in self._open:
            if ident:
                self.texts[ident] += data
        if self._cell is not None:
            table = next(i for t, i in reversed(self._open) if t == "table")
            self.rows[table][-1][1][-1] += data

    def text(self, ident: str) -> str:
        assert ident in self.texts, f"the page has no #{ident}"
        return self.texts[ident].strip()

    def number(self, ident: str) -> float | None:
        try:
            return float(self.text(ident))
        except ValueError:  # "–": not known yet
            return None

    def summary(self) -> str:
        keys = ["updated", "state", "notice", "rps", "requests-total", "latency-ms", "queue-depth"]
        return ", ".join(f"{k}={self.texts.get(k, '<missing>').strip()!r}" for k in keys)


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    assert CHROMIUM, "chromium is not installed: `apt-get install chromium` (scripts/test installs it)"
    argv = [
        CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={tmp / 'chromium-profile'}",
        f"--virtual-time-budget={BUDGET_MS}", *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=harness.WAIT, check=True)


def dump(tmp: Path, url: str) -> Dom:
    return Dom(chromium(tmp, "--dump-dom", url).stdout)


def live_dump(tmp: Path, url: str, load: Load | None, ready, tries: int = 10) -> Dom:
    """A dump for which `ready(dom)` holds; between tries, more requests complete."""
    for _ in range(tries):
        dom = dump(tmp, url)
        if ready(dom):
            return dom
        if load:
            load.wait_for(50)
    raise AssertionError(f"the dashboard at {url} never showed live numbers; last: {dom.summary()}")


@pytest.fixture(scope="module")
def sluice_bin() -> Path:
    """`target/debug/sluice`, built as harness.build() builds it (only the proxy is needed)."""
    return harness.prebuilt_or_build("sluice-cli", "--bin", "sluice")


@pytest.fixture
def demo(sluice_bin: Path):
    """`sluice demo` on ephemeral ports, once both instances registered: (proxy, admin)."""
    argv = [str(sluice_bin), "demo", "--listen", "127.0.0.1:0", "--acceptor", "127.0.0.1:0",
            "--admin", "127.0.0.1:0"]
    proc = Proc("demo", argv)
    try:
        proxy = proc.wait_line(lambda l: l.startswith("listening proxy="), "the proxy address")
        admin = proc.wait_line(lambda l: l.startswith("listening admin="), "the admin address")
        proc.wait_line(lambda l: l.startswith("ready "), "the ready line")
        host, port = proxy.split("=", 1)[1].rsplit(":", 1)
        yield proc, (host, int(port)), admin.split("=", 1)[1]
    finally:
        proc.stop()


def sessions_by_instance(dom: Dom) -> dict[str, int]:
    return {a["data-instance"]: int(a["data-sessions"])
            for a, _ in dom.rows.get("sessions-table", []) if "data-instance" in a}


def test_dashboard_shows_live_numbers(demo, tmp_path: Path):
    _, proxy, admin = demo
    url = f"http://{admin}/ui"
    load = Load(proxy, clients=6, method="GET").start()
    try:
        load.wait_for(100)

        def live(dom: Dom) -> bool:
            return (dom.number("updated") or 0) >= 3 and (dom.number("rps") or 0) > 0

        first = live_dump(tmp_path, url, load, live)
        assert first.text("state") == "live", first.summary()
        assert first.attrs_of["notice"].get("hidden") is not None, first.text("notice")
        assert sessions_by_instance(first) == {"demo-a": 8, "demo-b": 4}
        slices = {a["data-slice"]: int(a["data-queued"]) for a, _ in first.rows["slices-table"] if "data-slice" in a}
        assert list(slices) == ["default"]
        assert first.number("queue-depth") == sum(slices.values())
        assert first.number("requests-total") > 0
        assert first.number("latency-ms") > 0 and first.number("latency-p99") > 0
        assert int(first.attrs_of["rps-chart"]["data-points"]) >= 2
        # Each chart has a time axis: server seconds before the newest poll, "now" at the right.
        for chart in ("rps", "latency", "queue"):
            assert first.attrs_of[f"{chart}-axis"].get("data-window-seconds") == "60", chart
            labels = first.text(f"{chart}-axis")
            assert labels.startswith("−60 s") and labels.endswith("now"), labels
            assert "−30 s" in labels, labels
        # The demo has no static cluster, and the endpoints table says so.
        assert "no static clusters" in first.text("endpoints-table")
        # No request failed, and the error table says so.
        assert "no 4xx or 5xx responses" in first.text("errors-table")
        # Nor has it a relay: the relay card stays hidden.
        assert first.attrs_of["relays-card"].get("hidden") is not None

        load.wait_for(100)
        second = live_dump(tmp_path, url, load, live)
        assert second.number("requests-total") > first.number("requests-total")
        assert float(second.attrs_of["uptime"]["data-seconds"]) > float(first.attrs_of["uptime"]["data-seconds"])

        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        SCREENSHOT.unlink(missing_ok=True)
        chromium(tmp_path, f"--screenshot={SCREENSHOT}", "--window-size=1280,900", url)
        print(f"dashboard screenshot: {SCREENSHOT}")
        png = SCREENSHOT.read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000, f"{SCREENSHOT} is not a PNG"
    finally:
        results = load.stop()
    assert results and all(r.status == 200 for r in results), {r.status for r in results}


@pytest.fixture
def guarded(sluice_bin: Path, tmp_path: Path):
    """`sluice run` with an admin token and one static cluster whose only endpoint refuses
    connections, so every request fails with a 5xx: (proxy, admin)."""
    with socket.socket() as refusing:  # bound, never listening: connecting to it is refused
        refusing.bind(("127.0.0.1", 0))
        config = tmp_path / "sluice.toml"
        config.write_text(GUARDED_CONFIG.format(endpoint="%s:%d" % refusing.getsockname()))
        proc = Proc("sluice", [str(sluice_bin), "run", "-c", str(config), "--log-format", "json"],
                    env={"DASHBOARD_ADMIN_TOKEN": ADMIN_TOKEN, "RUST_LOG": "info"})
        try:
            def field(message: str, key: str) -> str:
                line = proc.wait_line(lambda l: f'"message":"{message}"' in l, f"the {message!r} line")
                return json.loads(line)["fields"][key]

            host, port = field("listening", "addr").rsplit(":", 1)
            admin = field("admin API listening", "admin.addr").removeprefix("Some(").removesuffix(")")
            yield (host, int(port)), admin, "%s:%d" % refusing.getsockname()
        finally:
            proc.stop()


GUARDED_CONFIG = """
[admin]
listen = "127.0.0.1:0"
token = "env:DASHBOARD_ADMIN_TOKEN"

[[listener]]
name = "public"
listen = "127.0.0.1:0"

[[route]]
name = "gone"
path_prefix = "/gone"
direct_response = {{ status = 404, body = "not here" }}

[[route]]
name = "broken"
cluster = "nowhere"

[[relay]]
name = "edge"
listen = "127.0.0.1:0"
to = "{endpoint}"

[cluster.nowhere]
kind = "static"
endpoints = ["{endpoint}"]
"""


def test_dashboard_asks_for_the_admin_token(guarded, tmp_path: Path):
    """Behind a token the page says how to give it one, and polls once it has it."""
    _, admin, _ = guarded
    url = f"http://{admin}/ui"
    refused = live_dump(tmp_path, url, None, lambda d: d.attrs_of["notice"].get("hidden") is None)
    assert "This admin API needs a token: open /ui#token=" in refused.text("notice")
    assert refused.number("updated") == 0

    wrong = live_dump(tmp_path, f"{url}#token=not-it", None, lambda d: d.attrs_of["notice"].get("hidden") is None)
    assert "refused the token" in wrong.text("notice")

    allowed = live_dump(tmp_path, f"{url}#token={ADMIN_TOKEN}", None, lambda d: (d.number("updated") or 0) >= 1)
    assert allowed.attrs_of["notice"].get("hidden") is not None, allowed.text("notice")
    endpoints = [(a, cells) for a, cells in allowed.rows["endpoints-table"] if "data-endpoint" in a]
    assert [(a["data-cluster"], a["data-endpoint"]) for a, _ in endpoints] == [("nowhere", guarded[2])]


def test_dashboard_lists_server_errors(guarded, tmp_path: Path):
    """Requests the proxy answers with 502/503 (its only endpoint refuses) show in the table,
    and the endpoint shows its ejections."""
    proxy, admin, endpoint = guarded
    load = Load(proxy, clients=1, method="GET").start()
    try:
        load.wait_for(5)

        def shows_errors(dom: Dom) -> bool:
            return any("data-status" in a for a, _ in dom.rows.get("errors-table", []))

        dom = live_dump(tmp_path, f"http://{admin}/ui#token={ADMIN_TOKEN}", load, shows_errors)
        rows = [cells for a, cells in dom.rows["errors-table"] if "data-status" in a]
        for route, status, _last, recent, total in ([c.strip() for c in r] for r in rows):
            assert route == "broken" and status in {"502", "503"}, (route, status)
            assert 0 < int(recent) <= int(total)
        [(attrs, cells)] = [(a, c) for a, c in dom.rows["endpoints-table"] if "data-endpoint" in a]
        assert (attrs["data-cluster"], attrs["data-endpoint"]) == ("nowhere", endpoint)
        # Refused connects eject it; between backoffs it is tried (and refused) again.
        assert int(attrs["data-ejections"]) >= 1, cells
        assert attrs["data-state"] in {"ejected", "up"}, attrs
        if attrs["data-state"] == "ejected":
            assert cells[2].startswith("ejected ") and cells[2].endswith(" s"), cells
    finally:
        results = load.stop()
    assert results and all(r.status in {502, 503} for r in results), {r.status for r in results}


def test_dashboard_lists_client_errors_and_relays(guarded, tmp_path: Path):
    """4xx responses show in the error table beside 5xx (before, only 5xx did), and a process
    with a `[[relay]]` shows a relay card with its counters (before, it had none)."""
    proxy, admin, _ = guarded
    status = admin_json(admin, "/status")
    [relay] = status["relays"]
    host, port = relay["addr"].rsplit(":", 1)
    # The relay's next hop refuses: the client's connection is accepted, then closed.
    with socket.create_connection((host, int(port)), timeout=harness.WAIT) as conn:
        conn.settimeout(harness.WAIT)
        assert conn.recv(1) == b""
    # The table counts what arrived during the page's polls: 404s keep coming meanwhile.
    stop = threading.Event()
    answered: list[int] = []

    def not_found() -> None:
        for _ in range(300):  # bounded: at most a minute
            if stop.wait(0.2):
                return
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://{proxy[0]}:{proxy[1]}/gone", timeout=harness.WAIT)
            answered.append(refused.value.code)

    def shows_both(dom: Dom) -> bool:
        statuses = {a.get("data-status") for a, _ in dom.rows.get("errors-table", [])}
        relays = [a for a, _ in dom.rows.get("relays-table", []) if "data-relay" in a]
        return "404" in statuses and bool(relays) and int(relays[0]["data-accepted"]) >= 1

    sender = threading.Thread(target=not_found, daemon=True)
    sender.start()
    try:
        dom = live_dump(tmp_path, f"http://{admin}/ui#token={ADMIN_TOKEN}", None, shows_both)
    finally:
        stop.set()
        sender.join()
    assert answered and set(answered) == {404}, answered
    [(route, status, _last, recent, total)] = [
        [c.strip() for c in cells] for a, cells in dom.rows["errors-table"] if a.get("data-status") == "404"
    ]
    assert (route, status) == ("gone", "404")
    assert 0 < int(recent) <= int(total) <= len(answered), (recent, total, len(answered))
    assert dom.attrs_of["relays-card"].get("hidden") is None
    [(attrs, cells)] = [(a, c) for a, c in dom.rows["relays-table"] if "data-relay" in a]
    assert attrs["data-relay"] == "edge" and cells[1].strip() == relay["addr"], cells


def admin_json(admin: str, path: str) -> dict:
    request = urllib.request.Request(f"http://{admin}{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=harness.WAIT) as reply:
        return json.load(reply)
