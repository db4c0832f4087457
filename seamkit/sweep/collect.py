"""Collecting a sweep: every point's status read from its files (`seamkit.sweep.status`), the
aggregate (`seamkit.sweep.stats`), sweep.json, the CSV tables and the figures
(`seamkit.sweep.plots`); and reading a collected sweep back (`load_sweep`)."""

from __future__ import annotations

import json
from pathlib import Path

from seamkit.report import atomic_write_text, write_json
from seamkit.reproduce import write_figures
from seamkit.sweep.folder import load_plan
from seamkit.sweep.plan import SweepError, check_target
from seamkit.sweep.plots import sweep_figures
from seamkit.sweep.stats import aggregate, csv_tables
from seamkit.sweep.status import STATUSES, point_status


def collect(out_dir, ran: int | None = None, target: float | None = None, figures: bool = True) -> dict:
    """Read every point's files, aggregate, write sweep.json, sweep.csv, sweep_summary.csv, figures."""
    check_target(target)
    out_dir = Path(out_dir).resolve()
    plan = load_plan(out_dir)
    points = []
    for p in plan["points"]:
        st = point_status(out_dir, p, plan["preset"])
        points.append({"id": p["id"], "study": p["study"], "dir": p["dir"], "grid": p["grid"], "seed": p["seed"],
                       "status": st["status"], "error": st["error"], "seconds": st["seconds"],
                       "report": st["report"]})
    sweep = aggregate(plan, points, target if target is not None else plan.get("target"))
    counts = {s: sum(p["status"] == s for p in sweep["points"]) for s in STATUSES}
    sweep.update(status="complete" if counts["complete"] == len(points) else "incomplete", counts=counts,
                 points_run=ran)
    write_json(out_dir / "sweep.json", sweep)
    for name, text in csv_tables(sweep).items():
        atomic_write_text(out_dir / name, text)
    if figures:
        write_figures(sweep_figures(sweep), out_dir / "figures", "sweep_")
    return sweep


def load_sweep(sweep_dir) -> dict:
    """DIR/sweep.json; a folder with only a plan (points run elsewhere) is collected first."""
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / "sweep.json").exists() and (sweep_dir / "plan.json").exists():
        return collect(sweep_dir)
    try:
        return json.loads((sweep_dir / "sweep.json").read_text())
    except FileNotFoundError:
        raise SweepError(f"{sweep_dir}: no sweep.json (run `seamkit sweep ... --out {sweep_dir}`)") from None
    except (OSError, ValueError) as e:
        raise SweepError(f"{sweep_dir / 'sweep.json'}: not a readable sweep ({e})") from None
