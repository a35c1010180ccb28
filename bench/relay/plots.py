#!/usr/bin/env python3
"""Plots of a relay run's table.md (bench/relay/run): time to first byte in end-to-end RTTs per
variant, and total time per size relative to direct, at 0 % and 1 % loss on the long leg.

    target/venv/bin/python bench/relay/plots.py bench/results/DATE/relay/table.md
"""

import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VARIANTS = ("direct", "naive", "+pool", "+early", "+tuning", "+splice", "+route", "+end pool",
            "+window")
SIZES = ("10KB", "100KB", "1MB", "10MB")
RTT_MS, FLOOR_MS = 255.0, 285.0  # end-to-end RTT; plus the client's own first-leg handshake
# A row of `sluice-wan bench`: variant (may hold a space), size, TTFB, TTFB/RTT, total, and
# (since 2026-11-26) the totals' min-max.
ROW = re.compile(r"^\| ([^|]+?) \| (\w+) \| (\d+) \| ([\d.]+) \| (\d+) \|(?: \d+-\d+ \|)?$")


def sections(path):
    """{section title: {(variant, size): (ttfb_ms, total_ms)}}, in file order."""
    out, title = {}, None
    with open(path) as f:
        for line in f:
            if line.startswith("## "):
                title = line[3:].strip()
                out[title] = {}
            m = ROW.match(line.strip())
            if m and title:
                variant, size, ttfb, _, total = m.groups()
                out[title][(variant, size)] = (int(ttfb), int(total))
    return out


def plot_ttfb(runs, out):
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(runs)
    for i, (label, cells) in enumerate(runs):
        xs = [v + i * width for v in range(len(VARIANTS))]
        ys = [cells[(v, "10KB")][0] / RTT_MS if (v, "10KB") in cells else 0 for v in VARIANTS]
        ax.bar(xs, ys, width, label=label)
    ax.axhline(FLOOR_MS / RTT_MS, color="black", linestyle="--", linewidth=1,
               label=f"floor: RTT + first-leg handshake ({FLOOR_MS:.0f} ms)")
    ax.set_xticks([v + 0.4 - width / 2 for v in range(len(VARIANTS))], VARIANTS)
    ax.set_ylabel("time to first byte (end-to-end RTTs)")
    ax.set_title("Relay TTFB, 10 KB (legs 30/200/25 ms RTT, 100 Mbit/s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_totals(runs, out):
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), sharey=True)
    axes = axes if len(runs) > 1 else [axes]
    for ax, (label, cells) in zip(axes, runs):
        sizes = [s for s in SIZES if ("direct", s) in cells]
        width = 0.8 / len(VARIANTS)
        for i, v in enumerate(VARIANTS):
            ys = [cells[(v, s)][1] / cells[("direct", s)][1] if (v, s) in cells else 0
                  for s in sizes]
            ax.bar([x + i * width for x in range(len(sizes))], ys, width, label=v)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(sizes))], sizes)
        ax.set_title(label, fontsize=9)
    axes[0].set_ylabel("total time / direct's")
    axes[-1].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    table = sys.argv[1]
    found = sections(table)
    runs = [(title.split(" (")[0].replace("Loss ", "loss "), cells)
            for title, cells in found.items() if cells]
    out = os.path.dirname(os.path.abspath(table))
    # Totals: no loss, and the last run with loss (a later run may add the sizes an earlier
    # one left out).
    plot_ttfb(runs[:2], os.path.join(out, "ttfb_rtt.png"))
    plot_totals([runs[0], runs[-1]] if len(runs) > 1 else runs,
                os.path.join(out, "total_vs_direct.png"))


if __name__ == "__main__":
    main()
