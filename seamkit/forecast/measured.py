"""What real runs measured, read for the forecast: each placement candidate's tokens/s, to check
the forecast against (`validate_report`), and held-out loss against steps, for its time to target
(`curves_from_report`). `forecast_seams` does both for a study's report: the forecast of its
config with the time to target its curves give, checked against its measured candidates.

Measured speeds come from any of: a seams report (its `placement` block: the candidates
`seams.placement=best` measured at `placement.devices`), one calibration (`{"devices", "tokens_per_s"}`,
as `seams.calibration.measure` returns it with the devices beside it), a bench table of such entries
(`{"entries": [...]}`), or bench/forecast.py's output (`{"measured": {N: {arm: {name: tokens/s}}}}`).

Curves. A seams report holds, per seed, the held-out loss of both arms at equal-token marks (the
`equal_tokens` rows: step, tokens, each arm's loss) and each arm's final held-out loss at its
final step. Held-out loss against steps is what the time to target uses: no placement changes it,
since every placement trains the same maths step for step. Only where a seed has no equal-token
rows (no snapshots were kept) is the training loss against steps (`loss_curve_steps`,
`loss_curve`) used instead, for every seed alike; `curve` in the result says which.
"""

from __future__ import annotations

import math

from seamkit.config import STUDY_ARMS, RunConfig
from seamkit.forecast.costs import measure_costs
from seamkit.forecast.links import LOOPBACK, Link
from seamkit.forecast.study import (
    ForecastError,
    forecast,
    parse_devices,
    summary_lines,
    validate,
)

ARMS = STUDY_ARMS  # every arm a study can run
BASE = ("e2e", "local")


def _speeds_of(entry: dict, where: str) -> tuple[int, dict]:
    n = entry.get("devices")
    speeds = entry.get("tokens_per_s", entry.get("candidates"))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ForecastError(f"{where}: devices missing or not a positive whole number (got {n!r})")
    if not isinstance(speeds, dict) or not all(isinstance(speeds.get(a, {}), dict) for a in ARMS):
        raise ForecastError(f"{where}: no tokens/s per arm and candidate ({{arm: {{candidate: tokens/s}}}})")
    return n, {a: dict(speeds.get(a, {})) for a in ARMS if a in BASE or a in speeds}


def measured_speeds(doc) -> dict:
    """{"tokens_per_s": {arm: {N: {candidate: tokens/s or None}}}, "source": str} from any of the
    shapes in the module docstring; ForecastError (one line) on anything else."""
    if not isinstance(doc, dict):
        raise ForecastError("measured speeds: expected a seams report, a calibration or a bench table (a JSON object)")
    out = {a: {} for a in BASE}
    if isinstance(doc.get("placement"), dict):
        entries, source = [(doc["placement"], "placement")], "a seams report's placement candidates"
    elif isinstance(doc.get("entries"), list):
        entries, source = [(e, f"entries[{i}]") for i, e in enumerate(doc["entries"])], "a bench table's entries"
    elif isinstance(doc.get("measured"), dict):
        entries = [({"devices": _int(n), "tokens_per_s": v}, f"measured[{n}]") for n, v in doc["measured"].items()]
        source = "a forecast bench's measured candidates"
    elif "tokens_per_s" in doc:
        entries, source = [(doc, "calibration")], "a calibration"
    else:
        raise ForecastError("measured speeds: no placement block, entries, measured or tokens_per_s in the document "
                            "(give a seams report made with --devices N, a calibration or a bench table)")
    for entry, where in entries:
        if not isinstance(entry, dict):
            raise ForecastError(f"measured speeds: {where} is not an object")
        n, speeds = _speeds_of(entry, f"measured speeds: {where}")
        for a, got in speeds.items():
            out.setdefault(a, {}).setdefault(n, {}).update(got)
    return {"tokens_per_s": out, "source": source}


def _int(n):
    try:
        return int(n)
    except (TypeError, ValueError):
        return n


def _threads_measured(doc: dict, n: int, name: str) -> int | None:
    """Torch threads a process of that measured candidate had (CPU): train.threads where set, else
    an even share of the N cores (`placement.arm_config`). None when the document does not say."""
    rc = doc.get("run_config")
    if not isinstance(rc, dict) or doc.get("device", rc.get("train", {}).get("device")) != "cpu":
        return None  # a seams report's `device` is the one it ran on; its config may say auto
    ranks = 1 if name == "single" else n
    return rc["train"].get("threads") or max(1, n // ranks)


def validate_report(forecast_report: dict, doc: dict) -> dict:
    """The forecast checked against what `doc` measured (a seams report or another shape of
    `measured_speeds`): relative error (forecast - measured) / measured of every candidate with a
    number, the worst by size, and the candidates left out with why (not measured, not forecast:
    oversubscribed, cannot run). On CPU each row also says the threads a measured process had
    and those its forecast's costs were measured with (`single` at N > 1: N x a rank's)."""
    got = measured_speeds(doc)
    have = {str(n) for n in forecast_report["devices"]}
    numbers, unmeasured = {a: {} for a in ARMS}, []
    for a, per_n in got["tokens_per_s"].items():
        for n, cands in per_n.items():
            if str(n) not in have:
                raise ForecastError(f"the forecast has no N={n}, which {got['source']} measured: forecast with "
                                    f"devices including {n}")
            for name, v in cands.items():
                if v is None or (isinstance(v, float) and not math.isfinite(v)):
                    unmeasured.append({"arm": a, "devices": int(n), "candidate": name,
                                       "why": "not measured (the candidate did not run or did not finish)"})
                else:
                    numbers[a].setdefault(n, {})[name] = v
    out = validate(forecast_report, numbers)
    for row in out["errors"]:
        t = _threads_measured(doc, row["devices"], row["candidate"])
        if t is not None:
            f = forecast_report["by_devices"][str(row["devices"])][row["arm"]]["candidates"][row["candidate"]]
            row.update(threads_measured=t, threads_costs=f.get("threads"))
    out["missing"] += unmeasured
    out.update(source=got["source"], devices=sorted({int(n) for per in got["tokens_per_s"].values() for n in per}))
    return out


def validation_lines(v: dict) -> list[str]:
    """Each candidate's forecast, measured and error, the worst named, then what was left out."""
    lines = [f"validation against {v['source']} (N = {', '.join(map(str, v['devices']))}):",
             f"{'N':>4}  {'arm':<6} {'candidate':<26} {'forecast':>10} {'measured':>10} {'error':>8}"]
    for r in sorted(v["errors"], key=lambda r: (r["devices"], r["arm"], r["candidate"])):
        note = ""
        if r.get("threads_measured") is not None and r["threads_measured"] != r.get("threads_costs"):
            note = f"  (measured with {r['threads_measured']} threads, costs with {r.get('threads_costs')})"
        lines.append(f"{r['devices']:>4}  {r['arm']:<6} {r['candidate']:<26} {r['forecast']:>10,.0f} "
                     f"{r['measured']:>10,.0f} {r['relative_error']:>+8.1%}{note}")
    w = v["worst"]
    lines.append(f"worst: {w['arm']} {w['candidate']} at N={w['devices']}, {w['relative_error']:+.1%}" if w
                 else "worst: none (no candidate both forecast and measured)")
    for m in v["missing"]:
        lines.append(f"  left out: {m['arm']} {m['candidate']} at N={m['devices']}: {m['why']}")
    return lines


# ----------------------------------------------------------------------------- curves for time to target

def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _final_held_out(rep: dict, arm: str) -> float | None:
    """The arm's final held-out loss: the last (in time) time-to-target point, unrounded; else the arm's."""
    pts = ((rep.get("time_to_target") or {}).get("points") or {}).get(arm) or []
    if pts:
        return max(pts, key=lambda p: p[0])[1]
    return rep["arms"][arm].get("final_loss")


def _complete(rep: dict, arm: str) -> bool:
    return rep.get("arms", {}).get(arm, {}).get("status") == "complete"


def curves_from_report(report: dict) -> dict:
    """Per-seed loss-vs-steps curves of the study's arms from a seams report, and the target they imply.

    {"curve": "held_out" | "training", "e2e": [[(step, loss), ...] per seed], "local": [...],
    "delayed": [...] (where every kept seed ran it), "arms", "seeds", "target"}. Held-out: each
    equal-token row's (step, loss), then (final step, final held-out loss). The target is the
    largest of the seeds' own targets (each the worst arm's final held-out loss), so every seed of
    every arm reaches it."""
    reps = [r for r in report.get("repeats") or [] if all(_complete(r, a) for a in BASE)]
    if not reps:
        raise ForecastError("time to target: the seams report has no seed whose arms both completed")
    arms = BASE + tuple(a for a in ARMS if a not in BASE and all(a in r.get("arms", {}) for r in reps))
    reps = [r for r in reps if all(_complete(r, a) for a in arms)]
    if not reps:
        raise ForecastError(f"time to target: the seams report has no seed whose arms ({', '.join(arms)}) "
                            "all completed")
    held = all(r.get("equal_tokens") and all(_finite(_final_held_out(r, a)) for a in arms) for r in reps)
    curves = {a: [] for a in arms}
    for r in reps:
        for a in arms:
            arm = r["arms"][a]
            if held:
                pts = [(row["step"], row[a]["loss"]) for row in r["equal_tokens"]]
                pts.append((arm["steps"], _final_held_out(r, a)))
            else:
                pts = list(zip(arm.get("loss_curve_steps") or [], arm.get("loss_curve") or []))
            pts = sorted((float(s), float(v)) for s, v in pts if _finite(s) and _finite(v))
            if not pts:
                raise ForecastError(f"time to target: seed {r.get('seed')} {a} has no finite loss-vs-steps point")
            curves[a].append(pts)
    targets = [(r.get("time_to_target") or {}).get("target_loss") for r in reps]
    if held and all(_finite(t) for t in targets):
        target = max(targets)
    else:  # the worst arm's final loss of each seed's curves, as the study sets its target
        target = max(max(c[-1][1] for c in (curves[a][k] for a in arms)) for k in range(len(reps)))
    return {"curve": "held_out" if held else "training", **curves, "arms": list(arms),
            "seeds": [r.get("seed") for r in reps], "target": target}


# ----------------------------------------------------------------------------- a study's report, forecast

def forecast_seams(cfg: RunConfig, report: dict, devices=(1, 2, 4, 8), link: Link | str = LOOPBACK,
                   repeats: int | None = None, cores: int | None = None) -> dict:
    """The forecast of `cfg` at `devices` from costs measured now (`repeats` runs each; default 1
    on the tiny preset, else 3), with the time to target of `report`'s curves and, where the report
    measured placement candidates, their validation (its devices are added to `devices`).
    cores: CPU only; default one core a rank at the largest N (none flagged as oversubscribed),
    which the report's `assumed` says; `single` at an N whose N threads exceed this machine's cores
    has no costs measured with them and is not forecast."""
    devices = parse_devices(devices)
    pl = report.get("placement") or {}
    measured = any(v is not None for per in (pl.get("candidates") or {}).values() for v in per.values())
    if measured:
        devices = parse_devices(sorted(set(devices) | {pl["devices"]}))
    repeats = repeats or (1 if cfg.preset == "tiny" else 3)
    costs = measure_costs(cfg, devices, repeats=repeats)
    assumed = None
    if costs["device"] == "cpu" and cores is None:
        cores = max(devices) * (costs.get("threads") or 1)
        singles = ", ".join(sorted(costs.get("by_threads") or {}, key=int)) or "none"
        assumed = (f"CPU costs ({costs['threads']} thread(s) a rank, measured on {costs['machine'].get('cpu_count')} "
                   f"cores; single's whole step again with {singles} threads); every rank given a core of its own "
                   f"up to N={max(devices)} ({cores} cores)")
    curves = curves_from_report(report)
    out = forecast(cfg, devices, costs=costs, link=link, cores=cores,
                   curves={a: curves[a] for a in curves["arms"]}, target=curves["target"])
    out["time_to_target"].update(curve=curves["curve"], seeds=curves["seeds"])
    out["assumed"] = assumed
    if measured:
        out["validation"] = validate_report(out, report)
    return out


def forecast_lines(report: dict) -> list[str]:
    """What a reader of `forecast_seams` output needs in text: the table, what was assumed, the validation."""
    lines = summary_lines(report) + ([report["assumed"]] if report.get("assumed") else [])
    return lines + (validation_lines(report["validation"]) if report.get("validation") else [])
