"""Draw one sweep figure as a standalone SVG (no browser, no plotting library): a metric per arm
against one grid key, from a sweep folder's sweep.json, with the 95% intervals where the points
have several seeds. For the README, which cannot show the sweep's plotly figures.

    python bench/sweep_figure.py bench/results/sweep_arms --x seams --metric final_loss --out docs/img/sweep_arms.svg
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLORS = {"e2e": "#1f77b4", "local": "#ff7f0e", "delayed": "#2ca02c"}
W, H, L, R, T, B = 560, 340, 70, 130, 40, 50  # size and margins, px


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--x", default="seams")
    ap.add_argument("--metric", default="final_loss", help="per-arm figure: <arm>_<metric> in sweep.json")
    ap.add_argument("--title", default="final held-out loss after equal wall-clock")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    sweep = json.loads((Path(args.sweep_dir) / "sweep.json").read_text())
    rows = sorted(sweep["aggregate"], key=lambda a: a["grid"][args.x])
    xs = [a["grid"][args.x] for a in rows]
    series = {arm: [a["figures"].get(f"{arm}_{args.metric}") for a in rows] for arm in COLORS
              if any(a["figures"].get(f"{arm}_{args.metric}") for a in rows)}
    vals = [v for s in series.values() for f in s if f for v in ([f["mean"]] + (f.get("ci95") or []))]
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.1 or 0.1
    lo, hi = lo - pad, hi + pad

    def px(i):
        return L + (i + 0.5) * (W - L - R) / len(xs)

    def py(v):
        return T + (hi - v) * (H - T - B) / (hi - lo)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{args.title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for k in range(6):
        v = lo + (hi - lo) * k / 5
        out.append(f'<text x="{L - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        out.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" stroke="#eee"/>')
    for i, x in enumerate(xs):
        out.append(f'<text x="{px(i):.1f}" y="{H - B + 18}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">{args.x}</text>')
    for j, (arm, fs) in enumerate(series.items()):
        c, dx = COLORS[arm], (j - (len(series) - 1) / 2) * 8
        pts = [(px(i) + dx, py(f["mean"])) for i, f in enumerate(fs) if f]
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                   + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        for i, f in enumerate(fs):
            if not f:
                continue
            x = px(i) + dx
            if f.get("ci95"):
                out.append(f'<line x1="{x:.1f}" y1="{py(f["ci95"][0]):.1f}" x2="{x:.1f}" y2="{py(f["ci95"][1]):.1f}" '
                           f'stroke="{c}"/>')
            out.append(f'<circle cx="{x:.1f}" cy="{py(f["mean"]):.1f}" r="4" fill="{c}"/>')
        out.append(f'<rect x="{W - R + 15}" y="{T + 20 * j}" width="12" height="12" fill="{c}"/>')
        out.append(f'<text x="{W - R + 32}" y="{T + 20 * j + 11}">{arm}</text>')
    n = max((a.get("complete", 0) for a in rows), default=0)
    out.append(f'<text x="{W - R + 15}" y="{T + 20 * len(series) + 16}" font-size="11">{n} seed(s) a point'
               + (", 95% bars" if n > 1 else "") + '</text>')
    out.append("</svg>")
    Path(args.out).write_text("\n".join(out) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
