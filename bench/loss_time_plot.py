#!/usr/bin/env python3
"""Loss against wall time of several trainings, as one SVG (no plotting
library needed: the machine these figures come from has none).

Each curve is one run's metrics.jsonl: the training loss of every step
record, at the end of that step (`time`), in seconds since the start of the
run's first recorded step (its `time` less its `step_time_s`), so start-up
(the process launch, the rendezvous, the start-up matmul peak) is left out
of every curve alike. A step record with `val_loss` adds a marker at that
time. Used by bench/diloco_figures.sh for docs/diloco_loss_vs_time.svg.

Usage: bench/loss_time_plot.py --out FILE.svg [--title TEXT]
           [--subtitle TEXT] LABEL=METRICS.jsonl...
"""

import argparse
import json
import math
import sys

COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
WIDTH, HEIGHT = 760, 470
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 58, 62


def load(path):
    """(times, losses, val_points) of one run; times from its first step's
    start."""
    records = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                if "step" in r and "time" in r:
                    records.append(r)
    if not records:
        sys.exit(f"loss_time_plot.py: no step records in {path}")
    records.sort(key=lambda r: r["step"])
    t0 = records[0]["time"] - records[0].get("step_time_s", 0.0)
    times = [r["time"] - t0 for r in records]
    losses = [r["loss"] for r in records]
    vals = [(r["time"] - t0, r["val_loss"]) for r in records if "val_loss" in r]
    return times, losses, vals


def nice_ticks(lo, hi, count=6):
    """Round tick values covering [lo, hi]."""
    span = max(hi - lo, 1e-9)
    raw = span / count
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw))
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [round(k * step, 10) for k in range(first, max(last, first + 1) + 1)]


def fmt(v):
    return f"{v:g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the SVG file to write")
    ap.add_argument("--title", default="Training loss against wall time")
    ap.add_argument("--subtitle", default="")
    ap.add_argument("runs", nargs="+", metavar="LABEL=METRICS.jsonl")
    args = ap.parse_args()

    curves = []
    for spec in args.runs:
        label, sep, path = spec.rpartition("=")
        if not sep or not label or not path:
            sys.exit(f"loss_time_plot.py: '{spec}' is not LABEL=METRICS.jsonl")
        curves.append((label, *load(path)))

    t_max = max(max(c[1]) for c in curves)
    all_losses = [v for c in curves for v in c[2]] + [v for c in curves for _, v in c[3]]
    x_ticks = nice_ticks(0.0, t_max)
    y_ticks = nice_ticks(min(all_losses), max(all_losses))
    x_lo, x_hi = 0.0, x_ticks[-1]
    y_lo, y_hi = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(t):
        return LEFT + (t - x_lo) / (x_hi - x_lo) * plot_w

    def py(v):
        return TOP + (1 - (v - y_lo) / (y_hi - y_lo)) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="15">{esc(args.title)}</text>']
    if args.subtitle:
        out.append(f'<text x="{WIDTH / 2}" y="38" text-anchor="middle" font-size="11" '
                   f'fill="#444">{esc(args.subtitle)}</text>')
    for t in x_ticks:
        x = px(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{fmt(t)}</text>')
    for v in y_ticks:
        y = py(v)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 22}" text-anchor="middle">'
               'wall time since the first step started (s)</text>')
    out.append(f'<text transform="translate(18 {TOP + plot_h / 2}) rotate(-90)" text-anchor="middle">'
               'training loss (nats per byte); circles: val_loss</text>')
    legend_w = 40 + 6.6 * max(len(c[0]) for c in curves)  # about 6.6 px a character
    legend_x = LEFT + plot_w - legend_w - 6
    out.append(f'<rect x="{legend_x:.0f}" y="{TOP + 4}" width="{legend_w:.0f}" height="{18 * len(curves) + 6}" '
               'fill="white" fill-opacity="0.85" stroke="#bbb"/>')
    for i, (label, times, losses, vals) in enumerate(curves):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in zip(times, losses))
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        if len(times) <= 12:  # few steps: show each one
            for t, v in zip(times, losses):
                out.append(f'<circle cx="{px(t):.1f}" cy="{py(v):.1f}" r="2.2" fill="{colour}"/>')
        for t, v in vals:
            out.append(f'<circle cx="{px(t):.1f}" cy="{py(v):.1f}" r="4.5" fill="white" '
                       f'stroke="{colour}" stroke-width="1.6"/>')
        ly = TOP + 16 + 18 * i
        lx = round(legend_x + 6)
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" y2="{ly - 4}" stroke="{colour}" '
                   'stroke-width="2.5"/>')
        out.append(f'<text x="{lx + 30}" y="{ly}">{esc(label)}</text>')
    out.append("</svg>")
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
