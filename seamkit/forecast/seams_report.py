"""A seams study's report, forecast: held-out loss against steps from it (`curves_from_report`),
for the time to target, and the forecast of its config checked against the speeds its run
measured (`forecast_seams`).

Curves. A seams report holds, per seed, the held-out loss of every arm at equal-token marks (the
`equal_tokens` rows: step, tokens, each arm's loss) and each arm's final held-out loss at its
final step. Held-out loss against steps is what the time to target uses: no placement changes it,
since every placement trains the same maths step for step. Only where a seed has no equal-token
rows (no snapshots were kept) is the training loss against steps (`loss_curve_steps`,
`loss_curve`) used instead, for every seed alike; `curve` in the result says which.
"""

from __future__ import annotations

import math

from seamkit.config import RunConfig
from seamkit.forecast.costs import measure_costs
from seamkit.forecast.links import LOOPBACK, Link
from seamkit.forecast.measured import (
    NOTHING_HERE,
    measured_speeds,
    validate_report,
    validation_lines,
)
from seamkit.forecast.predict import (
    ForecastError,
    forecast,
    parse_devices,
    summary_lines,
)
from seamkit.seams.policy import ARMS

BASE = ("e2e", "local")  # the arms every study runs (config.parse_arms)


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
    "delayed": [...] (where every kept seed ran it), "arms", "seeds", "target"}. Held-out: every
    (step, loss) the study evaluated (`time_to_target.curve`: the equal-token marks, the snapshots
    either side of the crossing, the final point); a report without it, each equal-token row's
    (step, loss), then (final step, final held-out loss). The target is the
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
            if held and ((r.get("time_to_target") or {}).get("curve") or {}).get(a):
                pts = r["time_to_target"]["curve"][a]  # every held-out point the study evaluated
            elif held:  # a report from before the study kept its curves: the marks and the final point
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

# ----------------------------------------------------------------------------- a study's report, forecast

def forecast_seams(cfg: RunConfig, report: dict, devices=(1, 2, 4, 8), link: Link | str = LOOPBACK,
                   repeats: int | None = None, cores: int | None = None) -> dict:
    """The forecast of `cfg` at `devices` from costs measured now (`repeats` runs each; default 1
    on the tiny preset, else 3), with the time to target of `report`'s curves and, where the report
    measured placement candidates in its run, their validation (its devices are added to
    `devices`; `measured.validate_report` refuses a report of another config or host).
    cores: CPU only; default one core a rank at the largest N, which the report's `assumed` says;
    a candidate whose costs or sharing factor were not measured for it is not forecast, with why."""
    devices = parse_devices(devices)
    here = isinstance(report.get("placement"), dict) and any(measured_speeds(report)["tokens_per_s"].values())
    if here:
        devices = parse_devices(sorted(set(devices) | {report["placement"]["devices"]}))
    repeats = repeats or (1 if cfg.preset == "tiny" else 3)
    costs = measure_costs(cfg, devices, repeats=repeats)
    assumed = None
    if costs["device"] == "cpu" and cores is None:
        cores = max(devices) * (costs.get("threads") or 1)
        singles = ", ".join(sorted(costs.get("by_threads") or {}, key=int)) or "none"
        assumed = (f"CPU costs ({costs['threads']} thread(s) a rank, measured on {costs['machine'].get('cpu_count')} "
                   f"cores; single's whole step again with {singles} threads); every rank given a core of its own "
                   f"up to N={max(devices)} ({cores} cores); a candidate whose threads or sharing this machine could "
                   f"not measure is not forecast")
    curves = curves_from_report(report)
    out = forecast(cfg, devices, costs=costs, link=link, cores=cores,
                   curves={a: curves[a] for a in curves["arms"]}, target=curves["target"])
    out["time_to_target"].update(curve=curves["curve"], seeds=curves["seeds"])
    out["assumed"] = assumed
    if here:
        out["validation"] = validate_report(out, report)
    elif isinstance(report.get("placement"), dict):
        out["validation"] = {"errors": [], "worst": None, "missing": [], "devices": [report["placement"]["devices"]],
                             "source": "the seams report", "note": f"{NOTHING_HERE}: nothing to check the forecast "
                                                                   "against"}
    return out


def forecast_lines(report: dict) -> list[str]:
    """What a reader of `forecast_seams` output needs in text: the table, what was assumed, the validation."""
    lines = summary_lines(report) + ([report["assumed"]] if report.get("assumed") else [])
    return lines + (validation_lines(report["validation"]) if report.get("validation") else [])
