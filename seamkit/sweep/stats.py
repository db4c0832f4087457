"""A sweep's numbers: each point's key figures read from its report, and per grid point the
summary across seeds (`seamkit.stats.stats`: n, mean, std and the t-based 95% interval).

Key figures are read from the reports' reference keys and tolerate extra ones. Seams:
per arm `final_loss`, `tokens_per_s` and peak memory (`peak_vram_bytes`, else our
`peak_rss_bytes`), `loss_gap` (local - e2e), every number in `local_over_e2e`, the traffic
ratios, and the seconds each arm's training-loss curve takes to reach a target loss
(`<arm>_train_curve_time_to_target_s`; the sweep's `target_loss`: given, or the highest loss
every complete arm's curve reached, so each arm has a time). Pruning: the medians over windows
of `speedup`, `memory_ratio` and any `*flop*` number, the median words/s per mode, `bitwise`
and `within_tolerance` as 1/0.
"""

from __future__ import annotations

import csv
import io
import math
import statistics

from seamkit.report import provenance
from seamkit.seams.policy import ARMS
from seamkit.stats import stats, train_curve_time_to_target

DEFAULT_ARMS = ARMS[:2]  # e2e and local: the arms of a report that names none (the reference report's)


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _median(values) -> float | None:
    vals = [v for v in map(_num, values) if v is not None]
    return statistics.median(vals) if vals else None


def seams_numbers(report: dict) -> dict:
    """A seams report's key figures as numbers (see the module docstring)."""
    out = {}
    arms = report.get("arms", {})
    for arm in [a for a in ARMS if a in arms] or DEFAULT_ARMS:
        a = arms.get(arm, {})
        out[f"{arm}_final_loss"] = _num(a.get("final_loss"))
        out[f"{arm}_tokens_per_s"] = _num(a.get("tokens_per_s"))
        mem = a.get("peak_vram_bytes") if a.get("peak_vram_bytes") is not None else a.get("peak_rss_bytes")
        out[f"{arm}_peak_memory_bytes"] = _num(mem)
    for arm in [a for a in ARMS[1:] if a in arms] or DEFAULT_ARMS[1:]:
        if out[f"{arm}_final_loss"] is not None and out["e2e_final_loss"] is not None:  # local's is `loss_gap`
            out["loss_gap" if arm == "local" else f"{arm}_loss_gap"] = out[f"{arm}_final_loss"] - out["e2e_final_loss"]
        for k, v in (report.get(f"{arm}_over_e2e") or {}).items():
            if _num(v) is not None:
                out[f"{arm}_over_e2e_{k}"] = _num(v)
    for k in ("traffic_ratio_e2e_over_local", "traffic_ratio_no_allreduce"):
        if _num(report.get(k)) is not None:
            out[k] = _num(report[k])
    return out


def pruning_numbers(report: dict) -> dict:
    """A pruning report's key figures as numbers (see the module docstring)."""
    windows = report.get("windows") or []
    out = {k: _median(w.get(k) for w in windows) for k in ("speedup", "memory_ratio", "reserved_ratio")}
    flop = sorted({k for w in windows for k, v in w.items() if "flop" in k.lower() and _num(v) is not None})
    out.update({k: _median(w.get(k) for w in windows) for k in flop})
    out.update({k: _num(v) for k, v in report.items() if "flop" in k.lower() and _num(v) is not None})
    for mode in ("base", "prune_exact"):
        out[f"{mode}_words_per_s"] = _median(s.get("words_per_second") for t in report.get("timings", [])
                                             if t.get("mode") == mode for s in t.get("samples", []))
    for k in ("bitwise", "within_tolerance"):
        if isinstance(report.get(k), bool):
            out[k] = float(report[k])
    return out


def curve_minimum(report: dict, arm: str) -> float | None:
    curve = [v for v in map(_num, report.get("arms", {}).get(arm, {}).get("loss_curve", [])) if v is not None]
    return min(curve) if curve else None


def train_curve_seconds(report: dict, arm: str, target: float) -> float | None:
    """Seconds of training until the arm's training-loss curve first reaches `target` (None: never, or no times)."""
    a = report.get("arms", {}).get(arm, {})
    return train_curve_time_to_target(a.get("loss_curve_elapsed_s", []), a.get("loss_curve", []), target)


# ----------------------------------------------------------------------------- the sweep

def aggregate(plan: dict, points: list[dict], target: float | None = None) -> dict:
    """The sweep dict written to sweep.json; `points` carry their loaded report (dropped here)."""
    study = plan["study"]
    main = [p for p in points if p["study"] == study]
    done = [p for p in main if p["status"] == "complete"]
    if study == "seams" and target is None:
        mins = [curve_minimum(p["report"], arm) for p in done for arm in p["report"].get("arms", DEFAULT_ARMS)]
        mins = [m for m in mins if m is not None]
        target = max(mins) if mins else None
    rows = []
    for p in points:
        figures = {}
        if p["status"] == "complete":
            rep = p["report"]
            figures = seams_numbers(rep) if p["study"] == "seams" else pruning_numbers(rep)
            if p["study"] == "seams" and target is not None:
                figures.update({f"{arm}_train_curve_time_to_target_s": train_curve_seconds(rep, arm, target)
                                for arm in rep.get("arms", DEFAULT_ARMS)})
        rows.append({**{k: v for k, v in p.items() if k != "report"}, "figures": figures})
    names = list(dict.fromkeys(k for r in rows if r["study"] == study for k in r["figures"]))
    groups: dict = {}
    for r in rows:
        if r["study"] == study:
            groups.setdefault(tuple(r["grid"].values()), []).append(r)
    agg = []
    for rs in groups.values():
        ok = [r for r in rs if r["status"] == "complete"]
        agg.append({"grid": rs[0]["grid"], "points": len(rs), "complete": len(ok),
                    "seeds": [r["seed"] for r in ok],
                    "figures": {k: stats([r["figures"].get(k) for r in ok]) for k in names}})
    swept = [k for k, v in plan["grid"].items() if len(v) > 1]
    return {"study": study, "preset": plan["preset"], "grid": plan["grid"], "swept": swept,
            "seeds": plan["seeds"], "overrides": plan["overrides"], "checkpoint": plan.get("checkpoint"),
            "target_loss": target, "interval": "t-based 95% interval of the mean across seeds (n-1 df)",
            "figure_names": names, "points": rows, "aggregate": agg, **provenance()}


def csv_tables(sweep: dict) -> dict[str, str]:
    """sweep.csv (one row per point) and sweep_summary.csv (one row per grid point)."""
    keys = list(sweep["grid"])
    points = [{"id": p["id"], "study": p["study"], **{k: p["grid"].get(k) for k in keys}, "seed": p["seed"],
               "status": p["status"], "error": p["error"], "seconds": p["seconds"],
               **{k: p["figures"].get(k) for k in sweep["figure_names"]}} for p in sweep["points"]]
    summary = []
    for a in sweep["aggregate"]:
        row = {**a["grid"], "points": a["points"], "complete": a["complete"]}
        for k, s in a["figures"].items():
            s = s or {"n": 0, "mean": None, "std": None, "ci95": None}
            ci = s["ci95"] or [None, None]
            row.update({f"{k}_n": s["n"], f"{k}_mean": s["mean"], f"{k}_std": s["std"],
                        f"{k}_ci95_lo": ci[0], f"{k}_ci95_hi": ci[1]})
        summary.append(row)
    return {"sweep.csv": csv_text(points), "sweep_summary.csv": csv_text(summary)}


def csv_text(rows: list[dict]) -> str:
    """Rows as CSV, the columns in first-seen order; None as an empty cell."""
    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), lineterminator="\n")
    w.writeheader()
    w.writerows([{k: ("" if v is None else v) for k, v in r.items()} for r in rows])
    return buf.getvalue()
