"""The forecast: every placement of each arm at every N, from a cost table and a link
(`forecast`), its check against measured speeds (`validate`) and the time to a target loss it
implies (`time_to_target`).

Each candidate (`candidates`) is forecast from the costs measured with the threads its processes
run (`table.costs_at`), never another count; then, where it runs more than one rank, every
compute time is scaled by how much slower ranks compute while they share the host
(`table.shared`): by its own factor where the table measured one (`runtime.candidate_factors`,
shares.py: its ranks' own work alone and at once, the slowest rank's pace), else by the
one-block factors: dp, local and delayed stages by `runtime.shared_factor` (ranks computing side
by side), the pipe schedules by `runtime.pipe_factor` (ranks computing inside torch's pipelining
runtime, passing messages meanwhile). Each entry's `share` and `threads` say which. Its step time
is then `steps.step_time`; tokens/s = batch x seq / step time, and the bubble is the idle share
of all ranks' time over a step.

Not forecast, with the reason: a candidate whose placement cannot run (`placement.layout`), that
needs more cores than given, whose threads the table has no costs for, or (CPU) whose sharing
factor would be an extrapolation beyond the ranks and cores the table measured
(`table.extrapolated`; `extrapolate=True` forecasts it anyway and says so in its entry).
"""

from __future__ import annotations

import math

from seamkit.config import RunConfig, SeamkitError
from seamkit.forecast.candidates import Candidate, candidates
from seamkit.forecast.costs import measure_costs
from seamkit.forecast.links import LOOPBACK, Link, parse_link
from seamkit.forecast.steps import step_time
from seamkit.forecast.table import (
    check_costs,
    check_matches,
    costs_at,
    extrapolated,
    runtime_of,
    share_of,
    shared,
    thread_counts,
)
from seamkit.report import provenance
from seamkit.stats import held_out_time_to_target, stats

FORECAST_KIND = "seamkit-forecast"


class ForecastError(SeamkitError):
    """A forecast input a user can fix: devices, cores, curves, a target, measured figures."""


def _count(x) -> int | None:
    """A whole number from an int or its text; None for anything else (a bool, a float, words)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    text = str(x).strip()
    return int(text) if text.lstrip("+-").isdigit() else None


def parse_devices(spec) -> list[int]:
    """"1,2,4" or a list of positive ints -> sorted distinct ints; ForecastError (one line) otherwise."""
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    out = [_count(x) for x in items]
    if not out or any(n is None or n < 1 for n in out):
        raise ForecastError(f"devices must be positive whole numbers like 1,2,4,8, got {spec!r}")
    return sorted(set(out))


def check_cores(cores) -> int | None:
    """`cores` (the cores a CPU forecast may give its ranks) as a count, or None (the default: the
    measuring machine's); ForecastError (one line) when it is not a whole number >= 1."""
    if cores is None:
        return None
    n = _count(cores)
    if n is None or n < 1:
        raise ForecastError(f"cores must be a whole number >= 1 (the cores the ranks may share), got {cores!r}")
    return n


# ----------------------------------------------------------------------------- the forecast

def _entry(c: Candidate, costs: dict, link: Link, cfg: RunConfig, extrapolate: bool) -> dict:
    """One candidate's entry of the report: its step time, tokens/s and bubble, or why it is not forecast."""
    at = costs_at(costs, c.threads)
    if at is None and c.reason is None:
        c.reason = (f"the cost table has no costs measured with {c.threads} threads, which this candidate's "
                    f"process runs (measured: {', '.join(thread_counts(costs))}; a count above the measuring "
                    f"machine's cores is not measured)")
    beyond = extrapolated(costs, c) if c.reason is None else None
    if beyond and not extrapolate:
        c.reason = beyond
    entry = {"devices": c.devices, "rows": c.rows, "micro_batches": c.micro_batches, "schedule": c.schedule,
             "threads": c.threads, "forecast": c.reason is None, "reason": c.reason, "tokens_per_s": None,
             "step_s": None, "bubble": None, "best": False}
    if c.reason is None:
        factor, source = share_of(costs, c)  # several ranks computing at once on the host
        entry["share"] = {"factor": factor, "from": source}
        if beyond:
            entry["extrapolated"] = beyond.replace("not forecast: ", "forecast anyway (extrapolate=True): ", 1)
        t = step_time(c, shared(at, factor), link, cfg)
        entry.update(t, tokens_per_s=cfg.data.batch * cfg.model.seq / t["step_s"])
    return entry


def _arms(cfg: RunConfig, n: int, costs: dict, link: Link, cores: int | None, extrapolate: bool) -> dict:
    """{arm: {"best", "candidates": {name: entry}}} at n devices."""
    arms = {a: {} for a in cfg.seams.arm_names}
    for c in candidates(cfg, n, cores=cores, cpu=costs["device"] == "cpu"):
        arms[c.arm][c.name] = _entry(c, costs, link, cfg, extrapolate)
    for arm, cands in arms.items():
        ok = {k: v for k, v in cands.items() if v["forecast"]}
        best = max(ok, key=lambda k: ok[k]["tokens_per_s"]) if ok else None
        if best:
            cands[best]["best"] = True
        arms[arm] = {"best": best, "candidates": cands}
    return arms


def forecast(cfg: RunConfig, devices=(1, 2, 4, 8), costs: dict | None = None, link: Link | str = LOOPBACK,
             cores: int | None = None, curves: dict | None = None, target: float | None = None,
             extrapolate: bool = False) -> dict:
    """tokens/s and bubble of every candidate of every arm at every N in `devices`.

    costs: a cost table (`measure_costs`, `load_costs`); None measures one now. cores: CPU tables
    only, the cores a forecast may give its ranks (default: the measuring machine's); a candidate
    needing more, or whose process runs threads the table has no costs for, is flagged, not
    forecast; so is one whose sharing factor the table cannot stand for (module docstring) unless
    `extrapolate`. curves and target: also `time_to_target`. Bad devices or cores: ForecastError."""
    devices = parse_devices(devices)
    cores = check_cores(cores)
    link = parse_link(link)
    costs = costs if costs is not None else measure_costs(cfg, devices)
    check_costs(costs)
    check_matches(costs, cfg)
    cores = (cores or costs.get("machine", {}).get("cpu_count") or 1) if costs["device"] == "cpu" else None
    by_n = {str(n): _arms(cfg, n, costs, link, cores, extrapolate) for n in devices}
    report = {"kind": FORECAST_KIND, "devices": devices, "tokens_per_step": cfg.data.batch * cfg.model.seq,
              "link": link.to_dict(), "cores": cores,
              "costs": {**{k: costs.get(k) for k in ("device", "gpu", "torch_version", "threads", "machine", "dtype",
                                                     "repeats")},
                        "runtime": runtime_of(costs),
                        "backward_split": costs.get("backward_split", "B - I (autograd.grad)"),
                        "by_threads": sorted(map(int, costs.get("by_threads") or {}))},
              "by_devices": by_n, "cost_table": costs, **provenance(cfg)}
    if curves is not None:
        report["time_to_target"] = time_to_target(report, curves, target)
    return report


# ----------------------------------------------------------------------------- checking it

def validate(report: dict, measured: dict) -> dict:
    """Relative error (forecast - measured) / measured of every candidate measured:
    measured = {arm: {N: {candidate: tokens/s}}}. The worst is the largest in size."""
    rows, missing = [], []
    for arm, per_n in measured.items():
        for n, cands in per_n.items():
            here = report["by_devices"].get(str(n), {}).get(arm, {}).get("candidates", {})
            for name, value in cands.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                    raise ForecastError(f"measured {arm} N={n} {name}: tokens/s must be a positive number, got {value!r}")
                f = here.get(name)
                if f is None or f["tokens_per_s"] is None:
                    missing.append({"arm": arm, "devices": int(n), "candidate": name,
                                    "why": f["reason"] if f else "not a candidate of the forecast"})
                    continue
                rows.append({"arm": arm, "devices": int(n), "candidate": name, "forecast": f["tokens_per_s"],
                             "measured": float(value), "relative_error": (f["tokens_per_s"] - value) / value})
    worst = max(rows, key=lambda r: abs(r["relative_error"])) if rows else None
    return {"errors": rows, "worst": worst, "missing": missing}


def _steps_to_target(curve, target: float) -> float | None:
    pts = [(float(s), float(v)) for s, v in curve]
    return held_out_time_to_target(pts, target)  # interpolates in the first coordinate: steps here


def time_to_target(report: dict, curves: dict, target: float | None) -> dict:
    """Forecast seconds to `target` held-out loss at every N for each arm's best candidate.

    curves = {"e2e": [[(step, loss), ...] per seed], "local": [...], "delayed": [...] where the
    forecast has that arm}: held-out loss against steps, which no placement changes (every
    placement trains the same maths). Each seed's steps to the target over the forecast step rate,
    summarised over seeds by `seamkit.stats.stats` (mean and t-based 95% interval). The break-even
    N is the first where local's or delayed's mean beats the best e2e's (`break_even_arm` says which).
    `censored`: per arm, how many seeds' curves are at the target from their first point on (their
    steps to it are at most that point's)."""
    if target is None or not (isinstance(target, (int, float)) and math.isfinite(target)):
        raise ForecastError(f"time to target needs a finite target loss, got {target!r}")
    arms = [a for a in report["by_devices"][str(report["devices"][0])] if a in ("e2e", "local") or curves.get(a)]
    for arm in arms:
        if not curves.get(arm):
            raise ForecastError(f"time to target needs at least one {arm} curve of (step, loss) points")
    steps = {arm: [_steps_to_target(c, target) for c in curves[arm]] for arm in arms}
    # seeds whose first held-out point is already at the target: their steps are at most that point's
    censored = {arm: sum(1 for c in curves[arm] if c and min(c)[1] <= target) for arm in arms}
    by_n = {}
    for n in report["devices"]:
        row = {}
        for arm in arms:
            best = report["by_devices"][str(n)][arm]["best"]
            if best is None:
                row[arm] = {"candidate": None, "seconds": None, "reached": 0, "seeds": len(steps[arm])}
                continue
            step_s = report["by_devices"][str(n)][arm]["candidates"][best]["step_s"]
            secs = [s * step_s for s in steps[arm] if s is not None]
            row[arm] = {"candidate": best, "seconds": stats(secs), "reached": len(secs), "seeds": len(steps[arm])}
        e = row["e2e"]["seconds"]
        for arm in arms[1:]:
            lo = row[arm]["seconds"]
            row[f"{arm}_first"] = bool(e and lo and lo["mean"] < e["mean"]) or bool(lo and not e)
        by_n[str(n)] = row
    return {"target": target, "arms": arms, "steps_to_target": steps, "censored": censored, "by_devices": by_n,
            **break_even(by_n, arms)}


def break_even(by_n: dict, arms: list[str]) -> dict:
    """The first N (of `by_n`, a time-to-target forecast's by_devices) where local's or delayed's
    mean beats e2e's, the arm, and a line saying so. Without one, the line names the largest N
    forecast for e2e and another arm, and the N that were not forecast (a candidate this machine
    could not measure is not forecast), so that "none" is not read past them."""
    def forecast_at(n, arm):
        return (by_n[n].get(arm) or {}).get("candidate") is not None
    even = even_arm = None
    for n, row in by_n.items():
        first = [a for a in arms[1:] if row.get(f"{a}_first")]
        if first:
            even, even_arm = int(n), min(first, key=lambda a: row[a]["seconds"]["mean"])
            break
    seen = [int(n) for n in by_n if forecast_at(n, "e2e") and any(forecast_at(n, a) for a in arms[1:])]
    unseen = [int(n) for n in by_n if int(n) not in seen]
    if even:
        text = f"N={even} ({even_arm})"
    elif seen:
        text = f"none up to N={max(seen)}" + (f" (N={', '.join(map(str, unseen))} not forecast)" if unseen else "")
    else:
        text = "none: no N forecast for e2e and another arm"
    return {"break_even_devices": even, "break_even_arm": even_arm, "break_even": text, "not_forecast_devices": unseen}


def summary_lines(report: dict) -> list[str]:
    """A short table: per N and arm, the best candidate's tokens/s and bubble, and what was left out."""
    lines = [f"forecast over link {report['link']['name']} ({report['link']['latency_s']:g} s, "
             f"{report['link']['bandwidth_bytes_per_s']:g} B/s), costs measured on {report['costs']['device']}"
             + (f" with {report['costs']['threads']} thread(s) a rank (single at N: N x that; measured with "
                f"{', '.join(map(str, report['costs'].get('by_threads') or [])) or 'no more'} threads too)"
                if report["costs"].get("threads") else "")]
    lines.append(f"{'N':>4}  {'arm':<6} {'best':<26} {'tokens/s':>12} {'bubble':>7}  not forecast")
    for n in report["devices"]:
        for arm, a in report["by_devices"][str(n)].items():
            best = a["best"]
            c = a["candidates"].get(best) if best else None
            left = sum(not v["forecast"] for v in a["candidates"].values())
            lines.append(f"{n:>4}  {arm:<6} {best or '-':<26} {c['tokens_per_s'] if c else 0:>12,.0f} "
                         f"{c['bubble'] if c else 0:>7.3f}  {left}")
    tt = report.get("time_to_target")
    if tt:
        lines.append(f"break-even for target {tt['target']:g}: {tt['break_even']}")
    return lines
