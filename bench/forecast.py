"""Benchmark: the forecast (seamkit.forecast) against every placement candidate measured here (not a test).

Validation (the default): --rounds rounds, each starting with the costs measured afresh
(`measure_costs`: every entry, the runtime's figures, the sharing factors, DDP's cost) and the
forecast made from them at every N of --devices, then every placement candidate
(`seams.placement.candidates`) trained for `seams.calibrate_steps` steps with
`seams.calibration.measure`: round r runs every candidate once, in the listed order on even
rounds and reversed on odd ones, so a machine that slows over the run slows the candidates
alike. Right before and right after its run, the cost entries the candidate's forecast reads
(`costs.measure_candidate`) are timed again, and, for a candidate of several ranks, its own
sharing factor (shares.py), and the candidate is forecast from their means in place of the
round's (`costs.with_entries`; the runtime's other figures stay the round's): both sides of its
error then come from the same minute of the machine. A candidate's error is the median
over rounds of (forecast - measured) / measured, its speed the median over rounds, and the worst
is named; beside it, `round_start_error` is the same from the round's own table (measured
minutes before the later runs), and each round keeps the forecasts from the timings before and
after the run alone. A candidate the forecast flags (oversubscribed: more ranks x threads than
cores; or one that cannot run) is reported with the reason and not measured.

--seed-scale: no measured runs; the forecast of a preset (default seed) at N = 1,2,4,8,16 from
costs measured on this CPU, over the nvlink link. Timing the seed model at full rows on a CPU
takes too long, so every entry is timed at --max-rows rows and scaled linearly in rows (the
output's `assumed` says so), and the ranks are given a core each (cores = N_max x threads), so no
N is flagged and no sharing factor applies (forecast with `extrapolate=True`: every candidate
beyond the ranks and cores this CPU measured says so in its entry's `extrapolated`); the
pipelining runtime's figures are not measured (zeros, `runtime.how` says so): a CPU's compute per
rank with a GPU's link, a shape of the curve, not a GPU forecast.

    python bench/forecast.py --preset cpu --devices 1,2 --rounds 6 --repeats 15 --steps 60 --set seams.arms=e2e,local,delayed --out bench/results/forecast.json
    python bench/forecast.py --seed-scale --set seams.arms=e2e,local,delayed --out bench/results/forecast_seed_scale.json
"""

from __future__ import annotations

import argparse
import copy
import shlex
import statistics
import sys
import time

from seamkit import config as C
from seamkit.forecast import (
    forecast,
    measure_costs,
    parse_devices,
    validate_report,
    validation_lines,
)
from seamkit.forecast.candidates import candidates as forecast_candidates
from seamkit.forecast.costs import measure_candidate, with_entries
from seamkit.forecast.predict import summary_lines
from seamkit.report import provenance, write_json
from seamkit.seams import calibration
from seamkit.seams.placement import candidates

TARGET = 0.15  # every candidate at N=2 within this relative error


def build(args) -> C.RunConfig:
    over = C.parse_overrides(args.overrides)
    if args.steps:
        over["seams.calibrate_steps"] = args.steps
    return C.override(C.preset(args.preset), over)


def _to_measure(cfg, devices: list[int], report: dict) -> tuple[list, list]:
    """(N, arm, placement, forecast candidate) of every placement candidate the forecast has, and
    those it flags (with why)."""
    cpu = report["costs"]["device"] == "cpu"
    todo, flagged = [], []
    for n in devices:
        mine = {(c.arm, c.name): c for c in forecast_candidates(cfg, n, cores=report["cores"], cpu=cpu)}
        for arm, ps in candidates(cfg, n).items():
            for p in ps:
                f = report["by_devices"][str(n)][arm]["candidates"].get(p.name)
                if f is None or not f["forecast"]:
                    flagged.append({"arm": arm, "devices": n, "candidate": p.name,
                                    "why": f["reason"] if f else "not a candidate of the forecast"})
                else:
                    todo.append((n, arm, p, mine[(arm, p.name)]))
    return todo, flagged


def _rounds(cfg, devices: list[int], args, todo: list, report: dict) -> tuple[dict, dict, list]:
    """Every candidate's run in every round (module docstring): (its speeds, its forecasts from its
    entries timed around each run, each round's own forecast)."""
    keys = [(n, arm, p.name) for n, arm, p, _ in todo]
    speeds = {k: [] for k in keys}
    paired = {k: [] for k in keys}  # each round's forecast from the candidate's entries timed around its run
    forecasts = []  # each round's forecast, from the costs measured at that round's start
    for r in range(args.rounds):
        if r:
            report = _round_forecast(cfg, devices, args)
        forecasts.append(report)
        for n, arm, p, c in todo if r % 2 == 0 else todo[::-1]:
            print(f"round {r + 1}/{args.rounds}: N={n} {arm} on {p.name}", flush=True)
            before = measure_candidate(cfg, c, args.repeats, share=True)
            speed = calibration.measure(cfg, n, {arm: [p]}, rounds=1)["tokens_per_s"][arm][p.name]
            after = measure_candidate(cfg, c, args.repeats, share=True)
            one = {k: _candidate_forecast(cfg, n, arm, p.name, report["cost_table"], c, ts, args.link)
                   for k, ts in (("both", [before, after]), ("before", [before]), ("after", [after]))}
            # each timing's own forecast beside their mean's: how far the machine moved over the run
            speeds[(n, arm, p.name)].append(speed)
            paired[(n, arm, p.name)].append(one["both"] | {"tokens_per_s_before": one["before"]["tokens_per_s"],
                                                           "tokens_per_s_after": one["after"]["tokens_per_s"]})
    return speeds, paired, forecasts


def _medians(cfg, speeds: dict) -> tuple[dict, list, list]:
    """({arm: {N: {name: median speed}}}, each candidate's spread over rounds, those that never finished)."""
    measured, spread, didnt = {a: {} for a in cfg.seams.arm_names}, [], []
    for (n, arm, name), vals in speeds.items():
        ok = [v for v in vals if v is not None]
        if not ok:
            didnt.append({"arm": arm, "devices": n, "candidate": name, "why": "did not finish in any round"})
            continue
        med = statistics.median(ok)
        measured[arm].setdefault(n, {})[name] = med
        spread.append({"arm": arm, "devices": n, "candidate": name, "rounds": vals, "median": med,
                       "spread": (max(ok) - min(ok)) / med})
    return measured, spread, didnt


def _validated(cfg, devices: list[int], fr: dict, got: dict) -> dict:
    """`validate_report` of forecast `fr` against the speeds this run measured at every N, each N
    a placement block of its own (measured here, in this run, for this config)."""
    out = {"errors": [], "missing": [], "devices": []}
    for n in devices:
        doc = {"placement": {"devices": n, "candidates": got[n], "measured_here": got[n]},
               "run_config": cfg.to_dict(), "device": fr["costs"]["device"]}
        v = validate_report(fr, doc)
        out = {**v, **{k: out[k] + v[k] for k in ("errors", "missing", "devices")}}
    out.pop("note", None)
    out["worst"] = max(out["errors"], key=lambda e: abs(e["relative_error"]), default=None)
    return out


def _per_round(cfg, devices: list[int], forecasts: list, speeds: dict, paired: dict, arms) -> dict:
    """Two forecasts of every run, each held to it: from the candidate's entries timed just before
    and just after the run (the error the bench reports), and from the costs measured at its
    round's start (minutes away, so the machine's drift over a round shows in it); validate_report
    gives the threads each measured process had beside each row (CPU)."""
    per_round = {"paired": [], "round_start": []}
    for r, fr in enumerate(forecasts):
        got = {n: {a: {name: vals[r] for (m, b, name), vals in speeds.items() if m == n and b == a
                       and vals[r] is not None} for a in arms} for n in devices}
        per_round["round_start"].append(_validated(cfg, devices, fr, got))
        per_round["paired"].append(_validated(cfg, devices, _with_paired(fr, paired, r), got))
    return per_round


def _over_rounds(v: dict, per_round: dict, speeds: dict, paired: dict, devices: list[int]) -> None:
    """Each row of `v` the median over rounds of its errors, with every round's figures beside it;
    the worst, and how many candidates of each N are within TARGET."""
    for row in v["errors"]:
        key = (row["devices"], row["arm"], row["candidate"])
        for how, rounds in per_round.items():
            mine = [e for pr in rounds for e in pr["errors"] if (e["devices"], e["arm"], e["candidate"]) == key]
            row[f"{how}_rounds"] = [{k: e[k] for k in ("forecast", "measured", "relative_error")} for e in mine]
            row[f"{how}_error"] = statistics.median(e["relative_error"] for e in mine)
        ran = [e for e, s in zip(paired[key], speeds[key]) if s is not None]  # the rounds validated
        for r, e in zip(row["paired_rounds"], ran):
            r.update(forecast_before=e["tokens_per_s_before"], forecast_after=e["tokens_per_s_after"])
        got = [e["measured"] for e in row["paired_rounds"]]
        row.update(forecast=statistics.median(e["forecast"] for e in row["paired_rounds"]),
                   measured=statistics.median(got), relative_error=row["paired_error"])
        # the candidate's own run-to-run spread: how far this machine moves the measured side alone
        row["measured_spread"] = (max(got) - min(got)) / row["measured"]
    v["worst"] = max(v["errors"], key=lambda e: abs(e["relative_error"]), default=None)
    v["within_target"] = {}
    for n in devices:
        rows = [e for e in v["errors"] if e["devices"] == n]
        if rows:
            v["within_target"][str(n)] = {"target": TARGET, "of": len(rows),
                                          **{("within" if how == "paired" else f"within_{how}"):
                                             sum(abs(e[f"{how}_error"]) <= TARGET for e in rows) for how in per_round}}


def validation(args) -> dict:
    cfg = build(args)
    devices = parse_devices(args.devices)
    report = _round_forecast(cfg, devices, args)  # the first round's costs; also says what it flags
    todo, flagged = _to_measure(cfg, devices, report)
    speeds, paired, forecasts = _rounds(cfg, devices, args, todo, report)
    measured, spread, didnt = _medians(cfg, speeds)
    per_round = _per_round(cfg, devices, forecasts, speeds, paired, measured)
    v = per_round["paired"][0]
    _over_rounds(v, per_round, speeds, paired, devices)
    v["missing"] += flagged + didnt
    v["source"] = (f"bench/forecast.py, {args.rounds} interleaved round(s); error: the median over rounds of "
                   "(forecast - measured) / measured, the forecast from the candidate's cost entries timed just "
                   "before and just after its run (their mean) and the runtime figures of its round's start; "
                   "round_start_error: the same from every cost measured at the round's start")
    report = forecasts[-1]
    report["validation"] = v
    print("\n".join(summary_lines(report) + validation_lines(v)))
    for n, w in v["within_target"].items():
        print(f"N={n}: {w['within']} of {w['of']} candidates within {w['target']:.0%} "
              f"(from the round's start: {w['within_round_start']})")
    by_n = {n: {a: measured[a].get(n, {}) for a in measured} for n in devices}
    return {"mode": "validation", "rounds": args.rounds, "measured": by_n,
            "measured_rounds": spread, "flagged": flagged, "errors": v["errors"], "worst": v["worst"],
            "within_target": v["within_target"], "steps": cfg.seams.calibrate_steps, "cost_repeats": args.repeats,
            "forecast": report, "round_costs": [f["cost_table"]["runtime"] | {"seconds": f["costs_seconds"]}
                                                for f in forecasts]}


def _candidate_forecast(cfg, n: int, arm: str, name: str, table: dict, c, timed: list, link) -> dict:
    """One candidate's forecast entry from `table` with its own entries and sharing factor
    (`timed`) in place."""
    rep = forecast(cfg, [n], costs=with_entries(table, c, timed), link=link)
    return rep["by_devices"][str(n)][arm]["candidates"][name]


def _with_paired(report: dict, paired: dict, r: int) -> dict:
    """The round's forecast report with each measured candidate's entry the one forecast from
    its own entries timed around its run in round r."""
    out = copy.deepcopy(report)
    for (n, arm, name), fs in paired.items():  # every candidate has one a round
        out["by_devices"][str(n)][arm]["candidates"][name] = fs[r]
    return out


def _round_forecast(cfg, devices, args) -> dict:
    t0 = time.perf_counter()
    costs = measure_costs(cfg, devices, repeats=args.repeats)
    report = forecast(cfg, devices, costs=costs, link=args.link)
    report["costs_seconds"] = time.perf_counter() - t0
    print(f"costs measured in {report['costs_seconds']:.1f} s", flush=True)
    return report


def seed_scale(args) -> dict:
    cfg = build(args)
    devices = parse_devices(args.devices if args.devices != "1,2" else "1,2,4,8,16")
    t0 = time.perf_counter()
    # the runtime's figures are left out: the sharing factors are of ranks sharing this machine's
    # cores, which ranks of a core each do not, its per-action cost (a fraction of a millisecond)
    # is lost beside actions of seconds, and timing them at this shape (an LM head over the whole
    # vocabulary in every one-block stage) takes an hour of this CPU
    costs = measure_costs(cfg, devices, repeats=args.repeats, max_rows=args.max_rows, runtime=False)
    threads = costs.get("threads") or 1
    cores = max(devices) * threads
    report = forecast(cfg, devices, costs=costs, link=args.seed_link, cores=cores, extrapolate=True)
    assumed = (f"CPU costs: {cfg.preset} preset timed on this CPU ({costs['machine'].get('processor')}, "
               f"{threads} thread(s) a rank, mean of {args.repeats}), each entry at most {args.max_rows} rows and "
               f"scaled linearly in rows; every rank given a core of its own ({cores} cores for N={max(devices)}), "
               f"so no sharing factor, and no pipelining runtime overhead (not measured); "
               f"messages over the {args.seed_link} link. A CPU's compute with a GPU's link: not a GPU forecast.")
    report["assumed"] = assumed
    print(f"costs measured in {time.perf_counter() - t0:.1f} s")
    print("\n".join(summary_lines(report)))
    print(assumed)
    return {"mode": "seed_scale", "assumed": assumed, "forecast": report}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", help="config preset (default: cpu; seed with --seed-scale)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--devices", default="1,2", help="device counts (default 1,2; 1,2,4,8,16 with --seed-scale)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every candidate")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of every cost entry (their mean)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps of every measured run (seams.calibrate_steps; its first quarter is warm-up)")
    ap.add_argument("--link", default="loopback", help="the link of the validation forecast (ranks on this host)")
    ap.add_argument("--seed-scale", action="store_true", help="forecast only, the seed preset's scaling (docstring)")
    ap.add_argument("--seed-link", default="nvlink", help="--seed-scale: the link")
    ap.add_argument("--max-rows", type=int, default=1, help="--seed-scale: rows an entry is timed at, then scaled")
    ap.add_argument("--out", default="bench/results/forecast.json")
    args = ap.parse_args(argv)
    args.preset = args.preset or ("seed" if args.seed_scale else "cpu")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    try:
        body = seed_scale(args) if args.seed_scale else validation(args)
    except C.SeamkitError as e:
        print(f"bench/forecast.py: error: {e}", file=sys.stderr)
        return 2
    cfg = build(args)
    write_json(args.out, {"command": "python bench/forecast.py " + shlex.join(sys.argv[1:] if argv is None else argv),
                          **body, **provenance(cfg)})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
