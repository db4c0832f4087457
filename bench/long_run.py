"""Benchmark: one configuration against e2e over a long budget, and the loss gap against tokens (not a test).

One seams study (`--arm`: local or delayed, with `--set` for its objective, delay and corrections)
at `--budget` seconds per arm, `--repeats` paired seeds, every arm on its fastest placement. Its
report is kept whole (`--report`, for `seamkit figures`); the summary (`--out`) holds, at each of
the study's `seams.token_marks` equal-token marks, the paired gap to e2e's held-out loss over the
seeds with its t-interval, absolute and as a share of e2e's loss, beside the study's gap at equal
wall-clock and its time-to-target ratio. `--figure` draws the gap against tokens (one line per
seed, the mean with its interval as a band). Does the gap close, hold or grow with training?

    python bench/long_run.py --preset cpu --devices 2 --budget 1200 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from pathlib import Path

import plotly.graph_objects as go

from seamkit import config as C
from seamkit.report import provenance, write_json
from seamkit.seams.study import seams_study
from seamkit.stats import stats


def gap_rows(report: dict, arm: str) -> list[dict]:
    """Per equal-token mark: the seeds' tokens, their gaps to e2e and the summaries of both (a mark
    is the j-th of each seed's marks; its tokens differ a little from seed to seed)."""
    reps = [r["equal_tokens"] for r in report["repeats"] if r.get("equal_tokens")]
    out = []
    for j in range(min(map(len, reps), default=0)):
        marks = [rows[j] for rows in reps]
        gaps = [m[f"gap_{arm}_minus_e2e"] for m in marks]
        out.append({"tokens": [m["tokens"] for m in marks], "gap": stats(gaps),
                    "relative_gap": stats([m[f"gap_{arm}_minus_e2e"] / m["e2e"]["loss"] for m in marks]),
                    "e2e_loss": stats([m["e2e"]["loss"] for m in marks]),
                    f"{arm}_loss": stats([m[arm]["loss"] for m in marks])})
    return out


def gap_figure(rows: list[dict], arm: str, title: str) -> go.Figure:
    """The gap to e2e against tokens: each seed a thin line, the mean with its 95% interval."""
    fig = go.Figure()
    n = len(rows[0]["gap"]["values"]) if rows else 0
    for s in range(n):
        fig.add_trace(go.Scatter(x=[r["tokens"][s] for r in rows], y=[r["gap"]["values"][s] for r in rows],
                                 mode="lines", line={"width": 1, "color": "rgba(90,90,90,0.5)"},
                                 name=f"seed {s}"))
    x = [sum(r["tokens"]) / len(r["tokens"]) for r in rows]
    lo = [(r["gap"]["ci95"] or [r["gap"]["mean"]] * 2)[0] for r in rows]
    hi = [(r["gap"]["ci95"] or [r["gap"]["mean"]] * 2)[1] for r in rows]
    fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", line={"width": 0},
                             fillcolor="rgba(214,39,40,0.18)", name="95% interval", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=[r["gap"]["mean"] for r in rows], mode="lines+markers",
                             line={"color": "rgb(214,39,40)"}, name=f"mean gap, {arm} - e2e"))
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    fig.update_layout(title=title, xaxis_title="training tokens (each arm)",
                      yaxis_title=f"held-out loss, {arm} minus e2e", template="plotly_white")
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--arm", default="local", choices=["local", "delayed"])
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--budget", type=float, default=1200.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/long_run.json")
    ap.add_argument("--report", default="bench/results/long_run/seams.json")
    ap.add_argument("--figure", default="docs/img/long_run_gap.png")
    args = ap.parse_args(argv)
    cfg = C.override(C.preset(args.preset), {
        "seams.arms": f"e2e,{args.arm}", "seams.placement": "best", "seams.token_marks": 16,
        **C.parse_overrides(args.overrides), "seams.devices": args.devices,
        "train.budget_seconds": args.budget, "seams.repeats": args.repeats})
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    report = seams_study(cfg, args.report, progress=True)
    rows = gap_rows(report, args.arm)
    paired = report["aggregate"]["paired"]
    doc = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "date": started,
           "budget_seconds": args.budget, "repeats": args.repeats, "devices": args.devices, "arm": args.arm,
           "status": report["status"], "placement": report["placement"]["chosen"], "report": args.report,
           "loss_gap": paired.get(f"loss_gap_{args.arm}_minus_e2e"),
           "time_to_target_ratio": paired.get(f"time_to_target_{args.arm}_over_e2e"),
           "tokens_per_s_ratio": paired.get(f"tokens_per_s_{args.arm}_over_e2e"),
           "gap_against_tokens": rows, **provenance(cfg)}
    write_json(args.out, doc)
    for r in rows:
        g, rel = r["gap"], r["relative_gap"]
        ci = f" [{g['ci95'][0]:+.4f}, {g['ci95'][1]:+.4f}]" if g.get("ci95") else ""  # one seed: no interval
        print(f"  {sum(r['tokens']) / len(r['tokens']):>12,.0f} tokens: gap {g['mean']:+.4f}{ci} "
              f"({100 * rel['mean']:+.2f}% of e2e)", file=sys.stderr)
    if args.figure and rows:
        from seamkit.figures import write_bytes, render
        fig = gap_figure(rows, args.arm, f"{args.arm} against e2e, {args.budget:.0f} s an arm on "
                                         f"{args.devices} devices, {args.repeats} seeds")
        fmt = Path(args.figure).suffix.lstrip(".")
        write_bytes(args.figure, render({"gap": fig}, (fmt,))[("gap", fmt)])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
