"""results.json -> report.md and PNG plots. Every figure is a median over rounds with its
min-max; comparisons are medians of per-round ratios (rounds interleave the targets, so a
ratio compares runs that were seconds apart)."""

import json
import os
import platform
import statistics
import subprocess

import matplotlib

from . import cache as cache_module
from . import tls as tls_module

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BASELINES = ("nginx-keepalive", "haproxy")


def median_range(values, digits=0):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratios(a_runs, b_runs, key):
    out = []
    for a, b in zip(a_runs, b_runs):
        x, y = key(a), key(b)
        if x is not None and y:
            out.append(x / y)
    return out


def rps(r):
    return r["rps"]


def cpu(r):
    return r["cpu_us_per_req"]


def p99(r):
    return r["latency_us"].get("p99")


def write(results, out_dir):
    """Writes report.md and the plots into `out_dir`; returns the target verdicts."""
    lines = [f"# Sluice benchmark report ({results['profile']}, {results['date']})", ""]
    lines += _setup(results)
    verdicts = []
    if "steady" in results:
        lines += _steady(results["steady"], out_dir)
    if "spike" in results:
        lines += _spike(results["spike"], out_dir)
    if "slow" in results:
        lines += _slow(results["slow"])
    if "ports" in results:
        lines += _ports(results["ports"])
    if "size" in results:
        lines += _size(results["size"], out_dir)
    if "size-gzip" in results:
        lines += _size_gzip(results["size-gzip"])
    if "tls" in results:
        lines += _tls(results["tls"])
    if "h2" in results:
        lines += _h2(results["h2"])
    if "idle" in results:
        lines += _idle(results["idle"])
    if "http3" in results:
        lines += _http3(results["http3"])
    if "grpc" in results:
        lines += _grpc(results["grpc"])
    if "nginx-module" in results:
        lines += _module(results["nginx-module"], out_dir)
    if "multinode" in results:
        lines += _multinode(results["multinode"])
    if "global-limit" in results:
        lines += _global_limit(results["global-limit"])
    if "cache" in results:
        lines += cache_module.report(results["cache"], median_range, ratios, cpu, rps)
    verdicts = evaluate(results)
    lines += ["## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in verdicts]
    lines.append("")
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines))
    return verdicts


def git_commit():
    """The checkout's commit (short), or '' outside git."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()


def _setup(results):
    # The commit that ran (results from before it was recorded: the one rendering them).
    git = results.get("commit") or git_commit()
    return [
        f"Sluice commit `{git or '?'}`; {platform.node()}, {os.cpu_count()} CPUs, "
        f"kernel {platform.release()}. Command: `{results['command']}`.", "",
        "Setup: each proxy runs alone on CPU 1 with one worker (NGINX `worker_processes 1`, "
        "HAProxy `nbthread 1`, Sluice `workers = 1`, Pingora one thread); the load generator and "
        "the target's own backend (`bench-backend`, the same binary for every target: it listens, "
        "or dials in as sessions for `sluice-reverse`) share CPU 0. Targets run in rotated order "
        "each round. `sluice-static-b` is a second, identical Sluice: its ratio to "
        "`sluice-static` is this session's noise floor (A/A). A run whose load CPU was >= 95% "
        "busy is flagged: it may have measured the load generator, not the proxy. Proxy CPU per "
        "request is the proxy's utime+stime over the run divided by the requests answered.", ""
    ] + ([f"Note: {results['note']}", ""] if results.get("note") else [])


def _steady(s, out_dir):
    points = {int(c): runs for c, runs in s["points"].items()}
    head = max(points, key=lambda c: len(next(iter(points[c].values()))))
    runs = points[head]
    names = list(runs)
    rounds = len(runs[names[0]])
    lines = ["## 1. Steady (closed loop, wrk -t1)", "",
             f"### Headline: c={head}, {rounds} rounds", "",
             "| target | RPS | p50 us | p90 us | p99 us | proxy CPU us/req | ctx sw/req | "
             "syscalls/req | RSS MiB | new upstream conns/req | non-2xx + errors | load CPU busy "
             "| backend CPU us/req |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        rs = runs[n]
        sc = s["syscalls"].get(n)
        busy = sum(r["load_cpu_busy"] >= 0.95 for r in rs)
        conns = sum(r["new_upstream_conns"] for r in rs) / max(1, sum(r["requests"] for r in rs))
        lines.append(
            f"| {n} | {median_range([rps(r) for r in rs])} "
            f"| {median_range([r['latency_us']['p50'] for r in rs])} "
            f"| {median_range([r['latency_us']['p90'] for r in rs])} "
            f"| {median_range([p99(r) for r in rs])} | {median_range([cpu(r) for r in rs], 1)} "
            f"| {median_range([r['ctx_per_req'] for r in rs], 2)} "
            f"| {f'{sc:.2f}' if sc is not None else '-'} "
            f"| {median_range([r['rss_kib'] / 1024 if r['rss_kib'] else None for r in rs], 1)} "
            f"| {conns:.4f} | {sum(r['non2xx'] + r['errors'] for r in rs)} "
            f"| {busy}/{len(rs)} flagged "
            f"| {median_range([r['extra'].get('backend_cpu_us_per_req') for r in rs], 1)} |")
    lines += ["", "The backend shares the load CPU with wrk: in rounds where that CPU is flagged "
              "busy, a backend that costs more per request (sluice-reverse's dials in through the "
              "Rust SDK, the others listen) caps the target's RPS below what the proxy could "
              "serve.", "", "Per-round ratios, median (min-max):", "",
              "| ratio | RPS | p99 | proxy CPU/req |", "|---|---|---|---|"]
    pairs = [(a, b) for b in BASELINES if b in runs
             for a in names if a not in (b, "direct", "sluice-static-b", "sluice-reverse-b")]
    if "sluice-static-b" in runs:
        pairs.insert(0, ("sluice-static-b", "sluice-static"))
    if "sluice-reverse-b" in runs and "sluice-reverse" in runs:
        pairs.insert(1, ("sluice-reverse-b", "sluice-reverse"))
    if "nginx" in runs and "sluice-reverse" in runs:
        pairs.append(("sluice-reverse", "nginx"))
    if "sluice-static" in runs and "sluice-reverse" in runs:
        pairs.append(("sluice-reverse", "sluice-static"))
    for a, b in pairs:
        second = a in ("sluice-static-b", "sluice-reverse-b")
        aa = " (A/A: the noise floor; A/B when SLUICE_B was set, see the note)" if second else ""
        lines.append(f"| {a} / {b}{aa} "
                     f"| {median_range(ratios(runs[a], runs[b], rps), 2)} "
                     f"| {median_range(ratios(runs[a], runs[b], p99), 2)} "
                     f"| {median_range(ratios(runs[a], runs[b], cpu), 2)} |")
    lines += ["", "### Sweep: median RPS / proxy CPU us per request / context switches per request",
              "", "| target | " + " | ".join(f"c={c}" for c in points) + " |",
              "|---|" + "---|" * len(points)]
    for n in names:
        cells = []
        for c in points:
            rs = points[c].get(n, [])
            cu, cx = med([cpu(r) for r in rs]), med([r["ctx_per_req"] for r in rs])
            cells.append(f"{med([rps(r) for r in rs]) or 0:.0f} / "
                         f"{'-' if cu is None else f'{cu:.1f}'} / "
                         f"{'-' if cx is None else f'{cx:.2f}'}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "![RPS vs concurrency](steady_rps.png) "
              "![context switches per request](steady_ctx.png)",
              "![time per request](steady_time.png) ![proxy CPU per request](steady_cpu.png)", ""]
    conc = list(points)
    _plot(out_dir, "steady_rps.png", "Requests/s vs concurrency", "concurrency", "requests/s",
          {n: (conc, [med([rps(r) for r in points[c][n]]) for c in conc]) for n in names})
    _plot(out_dir, "steady_ctx.png", "Proxy context switches per request", "concurrency",
          "switches/request",
          {n: (conc, [med([r["ctx_per_req"] for r in points[c][n]]) for c in conc])
           for n in names if n != "direct"})
    _plot(out_dir, "steady_cpu.png", "Proxy CPU time per request", "concurrency", "us/request",
          {n: (conc, [med([cpu(r) for r in points[c][n]]) for c in conc])
           for n in names if n != "direct"})
    # The paper's "time per request": mean latency = concurrency / throughput.
    _plot(out_dir, "steady_time.png", "Time per request (concurrency / RPS)", "concurrency",
          "us/request",
          {n: (conc, [c * 1e6 / (med([rps(r) for r in points[c][n]]) or 1) for c in conc])
           for n in names})
    return lines


def _spike(s, out_dir):
    levels = {float(k): v for k, v in s["levels"].items()}
    names = list(next(iter(levels.values())))
    lines = ["## 2. Spike (open loop, fixed offered rate)", "",
             f"Declared capacity: {s['capacity']} sessions of a service taking {s['delay_ms']} ms "
             f"per request; in requests/s, what {s['capacity']} concurrent clients get directly "
             f"from the backend: {s['capacity_rps']:.0f} rps. Goodput: 2xx answers complete "
             "within the offered window, per second, over that capacity. sluice-reverse: the service dials in with "
             f"{s['capacity']} sessions, queue_max {s['queue_max']}, queue_timeout "
             f"{s['queue_timeout_s']} s (Sluice's defaults). nginx-keepalive: `max_conns="
             f"{s['capacity']}` (NGINX OSS has no upstream queue: over the limit it answers 502). "
             f"haproxy: `maxconn {s['capacity']} maxqueue {s['queue_max']}`, `timeout queue "
             f"{s['queue_timeout_s']}s`. Latency is measured from each request's scheduled send "
             "time (no coordinated omission).", "",
             "| offered | target | goodput (of capacity) | p50 ok ms | p99 ok ms | p99.9 ok ms | "
             "non-2xx | timeouts | not sent (generator at 4096 conns) | max in service | "
             "proxy CPU us/req | generator max lag ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for level, runs in levels.items():
        for n in names:
            r = runs[n]
            lat = r["latency_us"]
            cu = "-" if r["cpu_us_per_req"] is None else f"{r['cpu_us_per_req']:.1f}"
            ol = r["extra"]["openloop"]
            lines.append(
                f"| {level:g}x | {n} | {r['rps'] / s['capacity_rps']:.1%} "
                f"| {lat.get('p50', 0) / 1e3:.1f} | {lat.get('p99', 0) / 1e3:.1f} "
                f"| {lat.get('p999', 0) / 1e3:.1f} | {r['non2xx']} "
                f"| {ol['errors']['timeout'] + ol['errors']['io'] + ol['errors']['connect']} "
                f"| {ol['not_sent']} "
                f"| {r['extra']['backend_max_in_flight']} "
                f"| {cu} "
                f"| {ol.get('max_lag_us', 0) / 1e3:.1f} |")
    lines += ["", "![goodput vs offered load](spike_goodput.png) "
              "![p99 of successful requests](spike_p99.png)", ""]
    xs = list(levels)
    _plot(out_dir, "spike_goodput.png", "Goodput vs offered load", "offered / capacity",
          "goodput / capacity",
          {n: (xs, [levels[x][n]["rps"] / s["capacity_rps"] for x in xs]) for n in names})
    _plot(out_dir, "spike_p99.png", "p99 of successful requests", "offered / capacity", "ms",
          {n: (xs, [levels[x][n]["latency_us"].get("p99", 0) / 1e3 for x in xs])
           for n in names})
    return lines


def _slow(s):
    lines = ["## 3. Slow clients", "",
             f"{s['clients']} clients each fetch a {_bytes(s['body_bytes'])} body and read it at "
             f"1 KiB/s (SO_RCVBUF 4 KiB) while wrk -c{s['fast_connections']} fetches the small "
             "body. Held: at the end of the wrk run, the connections open to the backend (busy "
             "or pooled) or, for sluice-reverse, the sessions leased. Start: each slow response "
             "first flows at full speed until the socket buffers on its way are full; wrk starts "
             "once the proxy is below 5% CPU again (at most 10 s), and the start's cost is "
             "reported on its own.", "",
             "| target | fast RPS | fast p50 ms | fast p99 ms | fast non-2xx + errors | "
             "upstream conns/sessions held | slow responses completed | slow clients connected | "
             "start: proxy CPU s | start: s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, r in s["targets"].items():
        sl = r["extra"]["slow"]
        st = r["extra"].get("start")  # absent in reports from before it was measured
        start = (f"{st['proxy_cpu_s']:.2f} | {st['seconds']:.1f} | {st['peak_rss_mib']:.0f}"
                 if st else "- | - | -")
        lines.append(f"| {n} | {r['rps']:.0f} | {r['latency_us']['p50'] / 1e3:.2f} "
                     f"| {r['latency_us']['p99'] / 1e3:.2f} | {r['non2xx'] + r['errors']} "
                     f"| {r['extra']['upstream_held']} | {sl['responses_completed']} "
                     f"| {sl['connected']} | {start} |")
    return lines + [""]


def _ports(s):
    lines = ["## 4. Ports", "",
             f"{s['requests']} requests per target over wrk -c{s['connections']} keep-alive "
             "client connections. New upstream connections are the connections the backend "
             "accepted (each took an ephemeral port on the proxy) or, for sluice-reverse, the "
             "sessions that dialed in during the run. TIME_WAIT counts the sockets the run added "
             "on each side of each hop.", "",
             "| target | requests | new upstream conns (ephemeral ports taken) | per request | "
             "TIME_WAIT upstream "
             "(backend side / proxy side) | TIME_WAIT client hop (proxy side / client side) | "
             "machine TcpActiveOpens | non-2xx + errors |", "|---|---|---|---|---|---|---|---|"]
    for n, r in s["targets"].items():
        lines.append(f"| {n} | {r['requests']} | {r['new_upstream_conns']} "
                     f"| {r['new_upstream_conns'] / max(1, r['requests']):.4f} "
                     f"| {r['tw_upstream'][0]} / {r['tw_upstream'][1]} "
                     f"| {r['tw_client'][0]} / {r['tw_client'][1]} | {r['active_opens']} "
                     f"| {r['non2xx'] + r['errors']} |")
    return lines + [""]


def _size(s, out_dir):
    sizes = {int(k): v for k, v in s["sizes"].items()}
    names = list(next(iter(sizes.values())))
    lines = ["## 5. Response size", "", f"wrk -c{s['connections']}; throughput of response "
             "bodies in MB/s (median of rounds) and proxy CPU us per request.", "",
             "| target | " + " | ".join(_bytes(b) for b in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for n in names:
        cells = []
        for b, runs in sizes.items():
            rs = runs[n]
            cu = med([cpu(r) for r in rs])
            cells.append(f"{med([rps(r) for r in rs]) * b / 1e6:.1f} MB/s"
                         + (f" / {cu:.1f} us" if cu is not None else ""))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "![throughput by body size](size_mbps.png)", ""]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([j + i * width for j in range(len(sizes))],
               [med([rps(r) for r in runs[n]]) * b / 1e6 for b, runs in sizes.items()],
               width, label=n)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [_bytes(b) for b in sizes])
    ax.set_ylabel("MB/s")
    ax.set_title("Throughput by response body size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "size_mbps.png"), dpi=90)
    plt.close(fig)
    return lines


def _size_gzip(s):
    sizes = {int(k): v for k, v in s["sizes"].items()}
    names = list(next(iter(sizes.values())))
    base = "nginx-keepalive" if "nginx-keepalive" in names else "nginx"
    lines = ["## 5b. Response size, gzip level 1", "",
             f"wrk -c{s['connections']} with `Accept-Encoding: gzip`; bodies of JSON lines "
             "(`?text=1`); every target compresses them with gzip at level 1 (Sluice "
             "`compression`, NGINX `gzip on; gzip_comp_level 1`). Per target and body size: "
             "requests/s, proxy CPU us per request and bytes per response as wrk read them "
             "(head and body; the gzip body alone in brackets), medians of rounds; the ratios "
             f"are each target's over {base}'s.", ""]
    for b, runs in sizes.items():
        lines += [f"**{_bytes(b)}**", "", "| target | rps | CPU us/req | bytes/response | "
                  f"CPU vs {base} | bytes vs {base} |", "|---|---|---|---|---|---|"]
        base_cpu = med([cpu(r) for r in runs[base]]) if base in runs else None
        base_bytes = _per_response(runs[base]) if base in runs else None
        for n in names:
            rs = runs[n]
            cu, per = med([cpu(r) for r in rs]), _per_response(rs)
            encoded = s["encoded_bytes"].get(str(b), {}).get(n, "?")
            cu_text = f"{cu:.1f}" if cu is not None else "-"
            cpu_ratio = f"{cu / base_cpu:.2f}x" if cu is not None and base_cpu else "-"
            bytes_ratio = f"{per / base_bytes:.2f}x" if base_bytes else "-"
            lines.append(f"| {n} | {med([rps(r) for r in rs]):.0f} | {cu_text} | "
                         f"{per:.0f} ({encoded}) | {cpu_ratio} | {bytes_ratio} |")
        lines.append("")
    return lines


def _per_response(runs):
    """Bytes per response as wrk read them (heads and bodies), median of rounds."""
    return med([r["bytes_read"] / max(r["requests"], 1) for r in runs])


def _tls(s):
    lines = ["## TLS termination", "",
             "Each proxy terminates TLS with the same self-signed certificate in front of its own "
             "plain keep-alive backend. `keepalive`: wrk over HTTPS, "
             f"{tls_module.KEEPALIVE_CONNECTIONS} connections; `full` and `resumed`: "
             f"`tlsload`, {tls_module.HANDSHAKE_CONNECTIONS} clients each opening a new "
             "connection per request (`Connection: close`), without resumption or resuming the "
             "session the previous connection got (the `resumed` column counts those that did); "
             f"`close` and `close-plain`: wrk (OpenSSL), {tls_module.CLOSE_CONNECTIONS} "
             "connections with `Connection: close`, over TLS and to a plain listener of the "
             "same proxy. "
             "CPU per request is the proxy's; a ratio is the median of per-round ratios "
             f"(min-max) over {s['rounds']} round(s) to the same round's NGINX or HAProxy. "
             "`sluice-tls-b` is an identical second Sluice (A/A; with SLUICE_B set, that "
             "binary: an A/B), and its column is its ratio to `sluice-tls`.", ""]
    for key, modes in s["keys"].items():
        lines += [f"### {key}", "",
                  "| mode | target | rps | CPU us/req | vs nginx-tls (CPU) | vs haproxy-tls (CPU) "
                  "| vs sluice-tls (CPU) | errors | resumed |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for mode, runs in modes.items():
            for name, rs in runs.items():
                vs = [median_range(ratios(rs, runs[base], cpu), 2) if base in runs else "-"
                      for base in ("nginx-tls", "haproxy-tls")]
                second = (median_range(ratios(rs, runs["sluice-tls"], cpu), 2)
                          if name == "sluice-tls-b" and "sluice-tls" in runs else "-")
                resumed = sum(r["extra"].get("resumed", 0) for r in rs)
                errors = sum(r["errors"] + r["non2xx"] for r in rs)
                lines.append(f"| {mode} | {name} | {median_range([rps(r) for r in rs])} | "
                             f"{median_range([cpu(r) for r in rs], 1)} | {vs[0]} | {vs[1]} | "
                             f"{second} | {errors} | {resumed if mode in ('full', 'resumed') else '-'} |")
        lines.append("")
    return lines


def _h2(s):
    runs = s["targets"]
    lines = ["## HTTP/2", "",
             "Each proxy terminates TLS (ECDSA P-256) offering h2 by ALPN and forwards over "
             "HTTP/1.1 keep-alive to its own plain backend. Load: `h2load -c "
             f"{s['connections']} -m {s['streams']}` for {s['seconds']} s after a "
             f"{s['warmup_s']} s warm-up, {s['rounds']} round(s), targets rotated. rps and "
             "latency (h2load's time per request, mean and max) are over the measured seconds; "
             "CPU per request is the proxy's CPU over the whole run divided by the requests its "
             "backend served in it. A ratio is the median of per-round ratios (min-max) to the "
             "same round's NGINX or HAProxy. New upstream conns: those the backend accepted in a run; "
             "up to connections x streams per run even with keep-alive, as h2load's stop cuts "
             "off the streams in flight and an HTTP/1.1 connection with a request cut off is "
             "closed. `sluice-h2-b` is an identical second Sluice (A/A); `sluice-h2own` is "
             "Sluice with its own HTTP/2 transport (`own_http2 = true`).",
             "", "| target | rps | CPU us/req | vs nginx-h2 (CPU) | vs haproxy-h2 (CPU) "
             "| mean ms | max ms | new upstream conns | errors | load CPU busy |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        vs = [median_range(ratios(rs, runs[base], cpu), 2) if base in runs else "-"
              for base in ("nginx-h2", "haproxy-h2")]
        busy = sum(r["load_cpu_busy"] >= 0.95 for r in rs)
        lines.append(f"| {name} | {median_range([rps(r) for r in rs])} | "
                     f"{median_range([cpu(r) for r in rs], 1)} | {vs[0]} | {vs[1]} | "
                     f"{median_range([r['latency_us']['mean'] / 1e3 for r in rs], 1)} | "
                     f"{median_range([r['latency_us']['max'] / 1e3 for r in rs], 1)} | "
                     f"{median_range([r['new_upstream_conns'] for r in rs])} | "
                     f"{sum(r['errors'] + r['non2xx'] for r in rs)} | {busy}/{len(rs)} flagged |")
    if {"sluice-h2", "sluice-h2-b"} <= set(runs):
        a, b = runs["sluice-h2-b"], runs["sluice-h2"]
        lines += ["", f"A/A, sluice-h2-b / sluice-h2: rps {median_range(ratios(a, b, rps), 2)}, "
                  f"CPU/req {median_range(ratios(a, b, cpu), 2)}."]
    if {"sluice-h2", "sluice-h2own"} <= set(runs):
        a, b = runs["sluice-h2own"], runs["sluice-h2"]
        lines += ["", f"Own transport, sluice-h2own / sluice-h2: rps "
                  f"{median_range(ratios(a, b, rps), 2)}, CPU/req "
                  f"{median_range(ratios(a, b, cpu), 2)}."]
    return lines + [""]


def _idle(s):
    lines = ["## Idle connections", "",
             f"{s['connections']} client connections per target, each after one request, held "
             "open and idle (`idleclients.py`); the proxy's VmRSS before (after a warm-up of "
             f"{s['warmup']} connections opened and closed), with them open and {_IDLE_SETTLE} "
             "after they closed. Per connection: the growth over the connections; returned: "
             "what closing them gave back, as a fraction of that growth; peak: VmHWM. "
             f"{s['rounds']} round(s), fresh processes each, targets rotated; a ratio is the "
             "median of per-round ratios (min-max). `sluice-hyper` has `fast_path = false`; "
             "`-b` targets run SLUICE_B.", ""]
    for mode, runs in s["modes"].items():
        lines += [f"### {mode}", "", "| target | KiB per idle conn | vs nginx | vs haproxy "
                  "| returned | peak MiB | failed |", "|---|---|---|---|---|---|---|"]
        for name, rs in runs.items():
            vs = [median_range(ratios(rs, runs[base], _per_conn), 1) if base in runs else "-"
                  for base in ("nginx", "haproxy")]
            lines.append(f"| {name} | {median_range([_per_conn(r) for r in rs], 2)} | {vs[0]} | "
                         f"{vs[1]} | {median_range([r['returned'] * 100 for r in rs])}% | "
                         f"{median_range([r['peak_mib'] for r in rs], 1)} | "
                         f"{sum(r['failed'] for r in rs)} |")
        for name in runs:
            if name.endswith("-b") and name[:-2] in runs:
                lines.append(f"\n{name[:-2]} / {name} (this build / SLUICE_B), per idle conn: "
                             f"{median_range(ratios(runs[name[:-2]], runs[name], _per_conn), 2)}")
        lines.append("")
    return lines


HTTP3_OWN_H2_LIMIT = 1.3  # issue 51: CPU per request over HTTP/3 / Sluice's own HTTP/2


def _http3(s):
    ran_caddy = any("caddy-h3" in runs for runs in s["bodies"].values())
    caddy = s["caddy"] if ran_caddy else f"{s['caddy']} (not in this run: the smoke leaves it out)"
    lines = ["## HTTP/3", "",
             "Sluice (`workers = 1`, one TLS listener with `http2` and `http3`) and Caddy "
             f"{caddy} (`GOMAXPROCS=1`, HTTP/3 on as by default), each on CPU 1 with the "
             "same ECDSA P-256 certificate, forward over HTTP/1.1 keep-alive to their own "
             "`bench-backend`. HTTP/3 load: `h3load` (bench/tools: h3 over quinn; Debian's "
             f"h2load has no QUIC) with {s['connections']} connections x {s['streams']} "
             "requests in flight; HTTP/2 load: `h2load` of the same shape, to the same "
             f"processes. {s['seconds']} s after a {s['warmup_s']} s warm-up, {s['rounds']} "
             "round(s), runs rotated. CPU per request: the proxy's CPU over the whole run "
             "divided by the requests its backend served. A ratio is the median of per-round "
             "ratios (min-max). `sluice-h3-b` is a second, identical Sluice (A/A).", "",
             f"UDP offload the sockets take: `{json.dumps(s.get('udp_offload', {}))}`.", ""]
    lines += _udp_calls(s.get("udp_calls"))
    for path, runs in s["bodies"].items():
        lines += [f"### `GET {path}`", "", "| run | rps | CPU us/req | vs caddy-h3 (CPU) "
                  "| vs sluice-h2 (CPU) | mean ms | errors | load CPU busy |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, rs in runs.items():
            vs = [median_range(ratios(rs, runs[base], cpu), 2) if base in runs else "-"
                  for base in ("caddy-h3", "sluice-h2")]
            busy = sum(r["load_cpu_busy"] >= 0.95 for r in rs)
            lines.append(f"| {name} | {median_range([rps(r) for r in rs])} | "
                         f"{median_range([cpu(r) for r in rs], 1)} | {vs[0]} | {vs[1]} | "
                         f"{median_range([r['latency_us']['mean'] / 1e3 for r in rs], 1)} | "
                         f"{sum(r['errors'] + r['non2xx'] for r in rs)} | "
                         f"{busy}/{len(rs)} flagged |")
        if {"sluice-h3", "sluice-h3-b"} <= set(runs):
            a, b = runs["sluice-h3-b"], runs["sluice-h3"]
            lines += ["", f"A/A, sluice-h3-b / sluice-h3: rps {median_range(ratios(a, b, rps), 2)}"
                      f", CPU/req {median_range(ratios(a, b, cpu), 2)}."]
        lines.append("")
    idle = s.get("idle")
    if idle:
        lines += [f"### Idle connections: {idle['connections']} per run", "",
                  "Each after one request (HTTP/3: `h3load --mode idle`, QUIC PINGs every 5 s; "
                  "HTTP/2: `idleclients.py`), held open; the proxy's VmRSS before (after a "
                  f"warm-up of {idle['warmup']} connections), with them open and after they "
                  f"closed; fresh processes each run, {idle['rounds']} round(s).", "",
                  "| run | KiB per idle conn | returned | failed |", "|---|---|---|---|"]
        for name, rs in idle["targets"].items():
            lines.append(f"| {name} | {median_range([_per_conn(r) for r in rs], 2)} | "
                         f"{median_range([r['returned'] * 100 for r in rs])}% | "
                         f"{sum(r['failed'] for r in rs)} |")
        t = idle["targets"]
        if {"sluice-h3", "sluice-h2"} <= set(t):
            lines += ["", "sluice-h3 / sluice-h2, per idle conn: "
                      f"{median_range(ratios(t['sluice-h3'], t['sluice-h2'], _per_conn), 2)}"]
        lines.append("")
    return lines


def _udp_calls(calls):
    """The GSO/GRO pass: what each proxy's UDP system calls carried under strace."""
    if not calls:
        return []
    lines = ["GSO/GRO in use: each proxy's UDP calls over one second of the same HTTP/3 load "
             "under `strace -f` (a pass of its own; tracing slows the calls it counts, so it "
             "gives no other number). A send with GSO carries a `UDP_SEGMENT` control "
             "message, a receive with GRO a `UDP_GRO` one.", "",
             "| proxy | sends | with GSO | of them > 1 datagram | result per send | receives "
             "| with GRO | result per receive |", "|---|---|---|---|---|---|---|---|"]
    for name, c in calls.items():
        lines.append(f"| {name} | {c['sends']} | {c['sends_gso']} | "
                     f"{c.get('sends_batched', '-')} | "
                     f"{c['send_bytes'] / max(c['sends'], 1):.0f} | {c['recvs']} | "
                     f"{c['recvs_gro']} | {c['recv_bytes'] / max(c['recvs'], 1):.0f} |")
    return lines + ["", "(\"result\": what the call returned: bytes for sendmsg/recvmsg, "
                        "messages for sendmmsg/recvmmsg.)", ""]


def _http3_verdicts(s):
    """Issue 51's targets: CPU per request over HTTP/3 <= Caddy's and <= 1.3x Sluice's own
    HTTP/2, per body size."""
    if not s:
        return []
    out = []
    for path, runs in s["bodies"].items():
        aa = (f"; A/A {med(ratios(runs['sluice-h3-b'], runs['sluice-h3'], cpu)):.2f}x"
              if {"sluice-h3", "sluice-h3-b"} <= set(runs) else "")
        if {"sluice-h3", "caddy-h3"} <= set(runs):
            r = med(ratios(runs["sluice-h3"], runs["caddy-h3"], cpu))
            out.append((f"http3 {path}: sluice-h3 CPU/req <= caddy-h3", f"{r:.2f}x{aa}",
                        verdict(r <= 1.0)))
        if {"sluice-h3", "sluice-h2"} <= set(runs):
            r = med(ratios(runs["sluice-h3"], runs["sluice-h2"], cpu))
            out.append((f"http3 {path}: sluice-h3 CPU/req <= {HTTP3_OWN_H2_LIMIT:g}x sluice-h2",
                        f"{r:.2f}x", verdict(r <= HTTP3_OWN_H2_LIMIT)))
    return out


GRPC_BASELINES = ("nginx-grpc", "haproxy-grpc")
GRPC_STATIC, GRPC_REVERSE = "sluice-grpc", "sluice-grpc-reverse"
GRPC_REVERSE_LIMIT = 1.1  # issue 31: CPU per call over dial-in HTTP/2 sessions / static h2c


def _grpc(s):
    load = s["load_average"]
    lines = ["## gRPC", "",
             "Each proxy takes h2c with prior knowledge and carries gRPC calls over HTTP/2 to its own "
             "`bench-backend --grpc` (Sluice `protocol = \"h2c\"`, NGINX `grpc_pass` with `keepalive "
             "512`, HAProxy `proto h2` both sides). Load: h2load with gRPC framing (a "
             f"{s['request_bytes']}-byte message, `te: trailers`), `-c {s['connections']} "
             f"-m {s['streams']}`, {s['seconds']} s after a {s['warmup_s']} s warm-up, "
             f"{s['rounds']} round(s), targets rotated. `unary`: one {s['reply_bytes']}-byte message "
             f"back; `stream`: server streaming, {s['stream_messages']} such messages, each its own "
             "DATA frame (h2load sends a whole request before reading, so calls that stream both "
             "ways cannot be expressed). CPU per call is the proxy's CPU over the whole run divided "
             "by the calls its backend served; p50/p99 are from h2load's per-request log of the "
             "measured seconds. A ratio is the median of per-round ratios (min-max) to the same "
             "round's NGINX or HAProxy. Errors include calls answered without their messages (a "
             "proxy's own gRPC error is HTTP 200). `sluice-grpc-b` is an identical second Sluice "
             "(A/A); `sluice-grpc-own` has Sluice's own HTTP/2 transport on its listener "
             f"(`own_http2 = true`), the other Sluices hyper's.{_grpc_reverse_setup(s)} "
             f"Load average {_loadavg(load['start'])} at the start, "
             f"{_loadavg(load['end'])} at the end.", ""]
    for kind, runs in s["kinds"].items():
        lines += [f"### {kind}", "", "| target | calls/s | CPU us/call | vs nginx-grpc (CPU) | "
                  "vs haproxy-grpc (CPU) | p50 ms | p99 ms | new upstream conns | errors | "
                  "load CPU busy |", "|---|---|---|---|---|---|---|---|---|---|"]
        for name, rs in runs.items():
            vs = [median_range(ratios(rs, runs[base], cpu), 2) if base in runs else "-"
                  for base in GRPC_BASELINES]
            busy = sum(r["load_cpu_busy"] >= 0.95 for r in rs)
            lines.append(
                f"| {name} | {median_range([rps(r) for r in rs])} | "
                f"{median_range([cpu(r) for r in rs], 1)} | {vs[0]} | {vs[1]} | "
                f"{median_range([_ms(r, 'p50') for r in rs], 2)} | "
                f"{median_range([_ms(r, 'p99') for r in rs], 2)} | "
                f"{median_range([r['new_upstream_conns'] for r in rs])} | "
                f"{sum(r['errors'] + r['non2xx'] for r in rs)} | {busy}/{len(rs)} flagged |")
        lines.append("")
        lines += ["Backend CPU us/call (it shares the load CPU with h2load): " + "; ".join(
            f"{name} {median_range([r['extra'].get('backend_cpu_us_per_req') for r in rs], 1)}"
            for name, rs in runs.items()) + ".", ""]
        lines += ["Per round, CPU us/call: " + "; ".join(
            f"{name} {', '.join(f'{cpu(r):.1f}' for r in rs)}" for name, rs in runs.items()) + "."]
        if {"sluice-grpc", "sluice-grpc-b"} <= set(runs):
            a, b = runs["sluice-grpc-b"], runs["sluice-grpc"]
            lines += ["", f"A/A, sluice-grpc-b / sluice-grpc: calls/s "
                      f"{median_range(ratios(a, b, rps), 2)}, CPU/call {median_range(ratios(a, b, cpu), 2)}."]
        if {"sluice-grpc", "sluice-grpc-own"} <= set(runs):
            a, b = runs["sluice-grpc-own"], runs["sluice-grpc"]
            lines += ["", f"Own transport, sluice-grpc-own / sluice-grpc: calls/s "
                      f"{median_range(ratios(a, b, rps), 2)}, CPU/call "
                      f"**{median_range(ratios(a, b, cpu), 2)}**."]
        if {GRPC_REVERSE, GRPC_STATIC} <= set(runs):
            a, b = runs[GRPC_REVERSE], runs[GRPC_STATIC]
            lines += ["", f"Dial-in / static, {GRPC_REVERSE} / {GRPC_STATIC}: CPU/call "
                      f"**{median_range(ratios(a, b, cpu), 2)}** (issue 31: <= "
                      f"{GRPC_REVERSE_LIMIT:g}), calls/s {median_range(ratios(a, b, rps), 2)}."]
        lines.append("")
    return lines


def _grpc_reverse_setup(s):
    if "reverse_sessions" not in s:  # results from before the dial-in target
        return ""
    n, m = s["reverse_sessions"], s["reverse_streams"]
    return (f" `{GRPC_REVERSE}` is Sluice with a reverse cluster: its backend dials in with {n} "
            f"HTTP/2 sessions of {m} streams each ({n * m} calls at once, above the load's "
            f"{s['connections'] * s['streams']}), its new upstream conns are the sessions it "
            f"registered in a run; dial-in / static is its CPU per call over `{GRPC_STATIC}`'s.")


_IDLE_SETTLE = "1 s"


def _per_conn(r):
    return r["per_conn_kib"]


def _ms(r, q):
    us = r["latency_us"].get(q)
    return us / 1e3 if us is not None else None


MODULE_BASELINE = "nginx"  # the seed paper's: stock NGINX, a connection per request
MODULE_AA = "nginx-b"


def _module(s, out_dir):
    points = {int(c): runs for c, runs in s["points"].items()}
    conc = list(points)
    names = list(points[conc[0]])
    rounds = len(points[conc[0]][names[0]])
    load = s["load_average"]
    lines = ["## 6. NGINX module (the seed paper's figures)", "",
             f"wrk -t1 for {s['seconds']} s per run, {rounds} round{'s' if rounds > 1 else ''}; each round runs every "
             "concurrency, each concurrency every target in rotated order. `nginx`: stock NGINX "
             "without upstream keep-alive (a connection per request, the paper's baseline); "
             "`nginx-b`: an identical second one, so `nginx-b / nginx` is the noise floor (A/A) of "
             "every ratio to the baseline; `nginx-keepalive`: `keepalive 512`; `nginx-sluice`: "
             "NGINX with ngx_http_sluice_module, `idle=512`, lent the 512 sessions that "
             "`bench-backend` registered with a standalone `sluice acceptor` (on CPU 0 with the "
             "load; its CPU per request is reported apart); `sluice-reverse`: Sluice's own reverse "
             "cluster. Time per request is concurrency / RPS (the paper's mean time per request). "
             "Context switches are the proxy worker's (`/proc/PID/task/*/status`), voluntary and "
             "involuntary, per request. Load average (1, 5, 15 min) at the start: "
             f"{_loadavg(load['start'])}; at the end: {_loadavg(load['end'])}.", ""]
    for c in conc:
        runs = points[c]
        lines += [f"### c={c}", "",
                  "| target | RPS | time per request us | p99 us | proxy CPU us/req | "
                  "voluntary ctx sw/req | involuntary ctx sw/req | acceptor CPU us/req | "
                  "non-2xx + errors | load CPU busy |", "|---|---|---|---|---|---|---|---|---|---|"]
        for n in names:
            rs = runs[n]
            busy = sum(r["load_cpu_busy"] >= 0.95 for r in rs)
            lines.append(
                f"| {n} | {median_range([rps(r) for r in rs])} "
                f"| {median_range([c * 1e6 / r['rps'] if r['rps'] else None for r in rs])} "
                f"| {median_range([p99(r) for r in rs])} | {median_range([cpu(r) for r in rs], 1)} "
                f"| {median_range([r.get('ctx_voluntary_per_req') for r in rs], 3)} "
                f"| {median_range([r.get('ctx_involuntary_per_req') for r in rs], 3)} "
                f"| {median_range([r['extra'].get('helper_cpu_us_per_req') for r in rs], 1)} "
                f"| {sum(r['non2xx'] + r['errors'] for r in rs)} | {busy}/{len(rs)} flagged |")
        lines.append("")
    lines += _module_ratios(points, names, conc)
    if s.get("syscalls"):
        lines += [f"Syscalls per request of the proxy worker at c={s['syscalls_c']} (a separate "
                  "pass under `perf stat -e raw_syscalls:sys_enter`):", "",
                  "| " + " | ".join(s["syscalls"]) + " |", "|" + "---|" * len(s["syscalls"]),
                  "| " + " | ".join(f"{v:.2f}" for v in s["syscalls"].values()) + " |", ""]
    lines += ["![RPS vs concurrency](module_rps.png) ![time per request](module_time.png)",
              "![voluntary context switches per request](module_ctx_voluntary.png) "
              "![involuntary context switches per request](module_ctx_involuntary.png)",
              "![proxy CPU per request](module_cpu.png)", ""]

    def series(value, skip=()):
        return {n: (conc, [med([value(r, c) for r in points[c][n]]) for c in conc])
                for n in names if n not in skip}

    _plot(out_dir, "module_rps.png", "Requests/s vs concurrency", "concurrency", "requests/s",
          series(lambda r, c: rps(r)))
    _plot(out_dir, "module_time.png", "Time per request (concurrency / RPS)", "concurrency",
          "us/request", series(lambda r, c: c * 1e6 / r["rps"] if r["rps"] else None))
    for kind in ("voluntary", "involuntary"):
        _plot(out_dir, f"module_ctx_{kind}.png", f"Proxy worker's {kind} context switches",
              "concurrency", "switches/request",
              series(lambda r, c, k=kind: r.get(f"ctx_{k}_per_req")))
    _plot(out_dir, "module_cpu.png", "Proxy CPU time per request", "concurrency", "us/request",
          series(lambda r, c: cpu(r)))
    return lines


def _module_ratios(points, names, conc):
    """Per-round ratios at each concurrency: to the baseline, and the module to keep-alive."""
    head = "| ratio | " + " | ".join(f"c={c}" for c in conc) + " |"
    rule = "|---|" + "---|" * len(conc)
    pairs = ([(n, MODULE_BASELINE) for n in names if n != MODULE_BASELINE]
             if MODULE_BASELINE in names else [])
    for a in ("nginx-sluice", "sluice-reverse"):
        if {a, "nginx-keepalive"} <= set(names):
            pairs.append((a, "nginx-keepalive"))
    if {"nginx-sluice", "nginx-sluice-b"} <= set(names):
        pairs.append(("nginx-sluice-b", "nginx-sluice"))
    lines = []
    for title, key in (("RPS", rps), ("proxy CPU per request", cpu)):
        lines += [f"{title}, per-round ratios, median (min-max):", "", head, rule]
        for a, b in pairs:
            aa = (" (A/A: the noise floor)" if a == MODULE_AA
                  else " (A/A; A/B when SLUICE_MODULE_B was set, see the note)"
                  if a == "nginx-sluice-b" else "")
            cells = [median_range(ratios(points[c][a], points[c][b], key), 2) for c in conc]
            lines.append(f"| {a} / {b}{aa} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _multinode(s):
    """One service's N across three nodes: split by demand in each SDK, by one instance and by
    two, against an even static split; then a rolling restart per SDK."""
    lines = ["## Many nodes: one capacity split by demand", "",
             f"Three nodes, one service declaring {s['capacity']} sessions of "
             f"{s['service_ms']} ms each (capacity {s['capacity'] * 1000 / s['service_ms']:.0f} rps), "
             f"open-loop load at 1.25x capacity skewed 80/10/10 for {s['phase_s']} s, then "
             "flipped to 10/10/80 for as long. Goodput is 200s per second over capacity. "
             "`demand*`: one instance of N in that SDK (`demand` and `demand-b` are Go, the A/A "
             "pair); `instances-*`: two instances of that SDK, of unequal capacity; `static`: "
             "N/3 per node (the comparator). Ratios are per round, to `static`. Rounds alternate "
             "the order of the ways.", "",
             "| way | instances | goodput under skew | / static | goodput after flip | / static | "
             "recovery to 95 % (s) | sessions moved (s) | max in flight / N | 503s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    static = [r["static"] for r in s["rounds"]]
    for way in s["rounds"][0]:
        runs = [r[way] for r in s["rounds"]]
        split = " + ".join(str(k) for k in runs[0].get("instances", []))
        # The most each instance had at once (the highest over rounds), against its capacity.
        each = [max(m) for m in zip(*(r.get("max_in_flight_each", [r["max_in_flight"]]) for r in runs))]
        most = " + ".join(str(m) for m in each)
        lines.append(f"| {way} | {split} | {_col(runs, 'goodput_skew')} | "
                     f"{median_range(ratios(runs, static, lambda r: r['goodput_skew']), 2)} | "
                     f"{_col(runs, 'goodput_flip')} | "
                     f"{median_range(ratios(runs, static, lambda r: r['goodput_flip']), 2)} | "
                     f"{_col(runs, 'recovery_s', 1)} | {_col(runs, 'sessions_moved_s', 2)} | "
                     f"{most} / {split or runs[0]['declared']} | {_col(runs, 'refused_503', 0)} |")
    rolling = s.get("rolling")
    if rolling:
        lines += ["", f"A rolling restart ({rolling['seconds']} s): each node in turn drained, "
                  "SIGTERMed at once with the requests sent to it still queued there, started "
                  f"and taken back once ready; {rolling['rate']:.0f} requests a second to each "
                  "SDK's service (N 6 of 20 ms: 0.8 of its capacity) over the nodes serving.", "",
                  "| SDK | requests | failed | 503s | max in flight / N |", "|---|---|---|---|---|"]
        for sdk, v in rolling["sdks"].items():
            lines.append(f"| {sdk} | {v['requests']} | {v['failed']} | {v['refused_503']} | "
                         f"{v['max_in_flight']} / {v['declared']} |")
    return lines + [""]


def _global_limit(s):
    """What a global rate-limit check adds, and what the local tier answers alone."""
    lat, ld = s["latency"], s["load"]
    p = lambda q: lambda r: r["latency_us"][q]  # noqa: E731
    lines = ["## Global rate limits: the cost of a check", "",
             "One node, `envoyproxy/ratelimit` with its counters in a local `redis-server`, "
             "direct responses. Medians over rounds (range); ratios are per round, to `plain-a`; "
             "`plain-b` and `global-b` are the A/A pairs of `plain-a` and `global-a`.", "",
             f"One request at a time (wrk, 1 connection, {s['latency_seconds']} s per route "
             "and round, rotated):", "",
             "| route | p50 (us) | p99 (us) | p50 ratio | p99 ratio |", "|---|---|---|---|---|"]
    for route, runs in lat.items():
        lines.append(f"| {route} | {median_range([p('p50')(r) for r in runs])} | "
                     f"{median_range([p('p99')(r) for r in runs])} | "
                     f"{median_range(ratios(runs, lat['plain-a'], p('p50')), 2)} | "
                     f"{median_range(ratios(runs, lat['plain-a'], p('p99')), 2)} |")
    added = [g["latency_us"]["p50"] - a["latency_us"]["p50"]
             for g, a in zip(lat["global-a"], lat["plain-a"])]
    lines += ["", f"A check adds {median_range(added)} us at p50 (global-a - plain-a).", "",
              f"Under load (wrk, {s['load_connections']} connections, {s['load_seconds']} s per "
              f"route and round, one tenant; `tiers` has a local bucket of {s['local_rate']}/s "
              "per tenant before the global limit):", "",
              "| route | rps | rps ratio | node CPU us/req | service + Redis CPU us/req | "
              "answered by the local tier alone |", "|---|---|---|---|---|---|"]
    for route, runs in ld.items():
        svc = [r["cpu_us_per_req"]["service"] + r["cpu_us_per_req"]["redis"] for r in runs]
        lines.append(f"| {route} | {median_range([r['rps'] for r in runs])} | "
                     f"{median_range(ratios(runs, ld['plain-a'], rps), 2)} | "
                     f"{median_range([r['cpu_us_per_req']['node'] for r in runs], 1)} | "
                     f"{median_range(svc, 1)} | "
                     f"{median_range([r['local_share'] for r in runs], 3) if route == 'tiers' else '-'} |")
    return lines + [""]


def _col(runs, key, digits=3):
    vals = [r[key] for r in runs if r[key] is not None]
    return median_range(vals, digits) if vals else "never"


def _loadavg(values):
    return " ".join(f"{v:.2f}" for v in values)


def _bytes(b):
    return f"{b // (1 << 20)} MiB" if b >= 1 << 20 else f"{b // 1024} KiB"


def _plot(out_dir, name, title, xlabel, ylabel, series):
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys) in series.items():
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    if len(xs) > 2 and max(xs) / max(min(xs), 1e-9) > 16:
        ax.set_xscale("log", base=2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=90)
    plt.close(fig)


def evaluate(results):
    """The issue's targets, each as (target, what was measured, met/missed/not measured)."""
    out = []
    steady = results.get("steady")
    if steady:
        points = {int(c): runs for c, runs in steady["points"].items()}
        head = max(points, key=lambda c: len(next(iter(points[c].values()))))
        runs = points[head]
        sc = steady["syscalls"]
        have = set(runs)
        if {"sluice-static", "nginx-keepalive"} <= have:
            a, b = runs["sluice-static"], runs["nginx-keepalive"]
            r = med(ratios(a, b, cpu))
            out.append(("sluice-static CPU/req <= 0.8x nginx-keepalive",
                        f"{r:.2f}x ({med([cpu(x) for x in a]):.1f} vs "
                        f"{med([cpu(x) for x in b]):.1f} us)", verdict(r <= 0.8)))
            r = med(ratios(a, b, rps))
            out.append(("sluice-static RPS >= nginx-keepalive", f"{r:.2f}x", verdict(r >= 1.0)))
            r = med(ratios(a, b, p99))
            out.append(("sluice-static p99 <= nginx-keepalive", f"{r:.2f}x", verdict(r <= 1.0)))
        if sc.get("sluice-static") is not None:
            out.append(("sluice-static syscalls/req <= 4.5", f"{sc['sluice-static']:.2f}",
                        verdict(sc["sluice-static"] <= 4.5)))
        if {"sluice-static", "sluice-reverse"} <= have:
            r = med(ratios(runs["sluice-reverse"], runs["sluice-static"], cpu))
            out.append(("sluice-reverse CPU/req <= sluice-static", f"{r:.2f}x",
                        verdict(r <= 1.0)))
        if {"nginx", "sluice-reverse"} <= have:
            r = med(ratios(runs["sluice-reverse"], runs["nginx"], rps))
            out.append(("sluice-reverse RPS >= 3x nginx without keepalive", f"{r:.2f}x",
                        verdict(r >= 3.0)))
        if "sluice-reverse" in have:
            # Not a verdict: wrk ends each run by closing connections with requests in flight,
            # and a session whose request was cut off cannot be reused (HTTP/1.1 has no way to
            # cancel), so its service re-dials. The ports scenario ends cleanly and decides.
            conns = sum(x["new_upstream_conns"] for x in runs["sluice-reverse"])
            reqs = sum(x["requests"] for x in runs["sluice-reverse"])
            out.append(("steady: sluice-reverse sessions re-dialed (after wrk cut requests off "
                        "at each run's end)",
                        f"{conns} over {reqs} requests", "info"))
    spike = results.get("spike")
    if spike:
        top = max(spike["levels"], key=float)
        r = spike["levels"][top].get("sluice-reverse")
        if r:
            good = r["rps"] / spike["capacity_rps"]
            p = r["latency_us"].get("p99", 0) / 1e6
            inflight = r["extra"]["backend_max_in_flight"]
            out.append((f"spike {float(top):g}x: sluice-reverse goodput >= 95% of capacity",
                        f"{good:.1%}", verdict(good >= 0.95)))
            out.append((f"spike {float(top):g}x: in service never above declared",
                        f"max {inflight} of {spike['capacity']}",
                        verdict(inflight <= spike["capacity"])))
            out.append((f"spike {float(top):g}x: p99 of admitted <= queue_timeout",
                        f"{p * 1e3:.0f} ms vs {spike['queue_timeout_s'] * 1e3:.0f} ms",
                        verdict(p <= spike["queue_timeout_s"])))
    out += _module_verdicts(results.get("nginx-module"))
    out += _grpc_verdicts(results.get("grpc"))
    out += _http3_verdicts(results.get("http3"))
    ports = results.get("ports", {}).get("targets", {}).get("sluice-reverse")
    if ports:
        out.append(("ports: sluice-reverse new upstream connections and TIME_WAIT (both sides)",
                    f"{ports['new_upstream_conns']} new, TIME_WAIT upstream "
                    f"{ports['tw_upstream'][0]}/{ports['tw_upstream'][1]}",
                    verdict(ports["new_upstream_conns"] == 0 and sum(ports["tw_upstream"]) == 0)))
    return out


def _module_verdicts(s):
    """The issue's targets for the module, at each concurrency: >= 3x the RPS of stock NGINX
    without keep-alive, and no more proxy CPU per request than stock NGINX with keep-alive."""
    if not s:
        return []
    out = []
    for c, runs in s["points"].items():
        if "nginx-sluice" not in runs:
            continue
        if MODULE_BASELINE in runs:
            r = med(ratios(runs["nginx-sluice"], runs[MODULE_BASELINE], rps))
            aa = (f"; A/A {med(ratios(runs[MODULE_AA], runs[MODULE_BASELINE], rps)):.2f}x"
                  if MODULE_AA in runs else "")
            out.append((f"nginx-module c={c}: nginx-sluice RPS >= 3x nginx without keep-alive",
                        f"{r:.2f}x{aa}", verdict(r >= 3.0)))
        if "nginx-keepalive" in runs:
            r = med(ratios(runs["nginx-sluice"], runs["nginx-keepalive"], cpu))
            out.append((f"nginx-module c={c}: nginx-sluice CPU/req <= nginx-keepalive",
                        f"{r:.2f}x", verdict(r <= 1.0)))
    return out


def _grpc_verdicts(s):
    """Issue 31's targets for gRPC, per kind of call: to static clusters no more proxy CPU per
    call than NGINX's and HAProxy's; over dial-in HTTP/2 sessions at most 1.1x the static h2c
    path's."""
    if not s:
        return []
    out = []
    for kind, runs in s["kinds"].items():
        if {GRPC_REVERSE, GRPC_STATIC} <= set(runs):
            r = med(ratios(runs[GRPC_REVERSE], runs[GRPC_STATIC], cpu))
            out.append((f"grpc {kind}: {GRPC_REVERSE} CPU/call <= {GRPC_REVERSE_LIMIT:g}x "
                        f"{GRPC_STATIC}", f"{r:.2f}x", verdict(r <= GRPC_REVERSE_LIMIT)))
        for base in GRPC_BASELINES:
            if {"sluice-grpc", base} <= set(runs):
                r = med(ratios(runs["sluice-grpc"], runs[base], cpu))
                out.append((f"grpc {kind}: sluice-grpc CPU/call <= {base}", f"{r:.2f}x",
                            verdict(r <= 1.0)))
    return out


def verdict(ok):
    return "met" if ok else "**missed**"
