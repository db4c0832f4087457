"""Benchmark: every placement candidate's tokens/s at a hardware budget (not a test).

What `seamkit seams --placement best` picks from (seamkit.seams.calibration): every candidate of
each arm (one process, data parallel, each pipeline schedule at its default micro-batches, local
stages) trains `--steps` steps alone in processes of its own; its speed is taken over the steps
after the first quarter. Rounds interleave the candidates (round r runs each once, the order
reversed every other round), so a slow minute of the machine lands on all of them; the entry
keeps each candidate's median and every round's value.

`--busy` runs every candidate twice a round, quiet and beside one CPU-bound process (a pair, its
order alternating by round, so both sides see the same minute of the machine). Each round gives
local at its best over e2e at its best (`local_over_best_e2e`), quiet and busy; over the rounds
their mean with a t-based 95% interval, and busy over quiet, whose target is to stay within 10%
of 1 (the study's answer does not hang on a neighbour).

The quiet entry is stored under this machine's key (CPU model, cores, torch) and the config's
speed key in bench/results/placement.json, where `seams.calibration=auto` (the default) finds it:
a study on a matching machine then runs no calibration of its own.

    python bench/placement.py --preset cpu --devices 2 --rounds 3
    python bench/placement.py --preset cpu --devices 2 --rounds 3 --busy
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys

from seams import busy_neighbour

from seamkit import config as C
from seamkit.report import git_commit, write_json
from seamkit.seams import calibration as K
from seamkit.seams.placement import candidates
from seamkit.stats import stats

BUSY_TARGET = 0.10  # busy over quiet of local_over_best_e2e stays within this of 1


def _measure(cfg, devices: int, arm: str, p, busy: bool) -> float | None:
    hog = busy_neighbour() if busy else None
    try:
        return K.measure(cfg, devices, {arm: [p]}, rounds=1)["tokens_per_s"][arm][p.name]
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def _ratio(round_values: dict) -> float | None:
    """local at its best over e2e at its best, in one round."""
    best = {arm: max((v for v in vs.values() if v is not None), default=None) for arm, vs in round_values.items()}
    return best["local"] / best["e2e"] if best.get("local") and best.get("e2e") else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, help="steps per candidate and round (seams.calibrate_steps)")
    ap.add_argument("--busy", action="store_true", help="each candidate also beside one busy process, in pairs")
    ap.add_argument("--out", default=str(K.BENCH))
    args = ap.parse_args(argv)
    cfg = C.override(C.preset(args.preset), C.parse_overrides(args.overrides))
    if args.steps:
        cfg = C.override(cfg, {"seams.calibrate_steps": args.steps})
    cands = candidates(cfg, args.devices)
    order = [(arm, p) for arm, ps in cands.items() for p in ps]
    sides = ("quiet", "busy") if args.busy else ("quiet",)
    values = {side: {arm: {p.name: [] for p in ps} for arm, ps in cands.items()} for side in sides}
    ratios = {side: [] for side in sides}
    t0 = datetime.datetime.now(datetime.timezone.utc)
    for r in range(args.rounds):
        todo = order if r % 2 == 0 else order[::-1]
        pair = sides if r % 2 == 0 else sides[::-1]
        this = {side: {arm: {} for arm in cands} for side in sides}
        for arm, p in todo:
            for side in pair:
                print(f"round {r + 1}/{args.rounds}: {arm} on {p.name}, {side}", file=sys.stderr, flush=True)
                v = _measure(cfg, args.devices, arm, p, side == "busy")
                values[side][arm][p.name].append(v)
                this[side][arm][p.name] = v
        for side in sides:
            ratios[side].append(_ratio(this[side]))
    med = K.medians(values["quiet"])
    ratio = {side: {"rounds": ratios[side], **(stats(ratios[side]) or {})} for side in sides}
    entry = {
        "machine": K.machine_key(), "speed_key": K.speed_key(cfg, args.devices), "devices": args.devices,
        "preset": args.preset, "overrides": args.overrides, "steps": cfg.seams.calibrate_steps,
        "rounds": args.rounds, "tokens_per_s": med, "spread": K.spread(values["quiet"]),
        "fastest": {arm: K.fastest(m) for arm, m in med.items()},
        "local_over_best_e2e": ratio["quiet"],
        "seconds": (datetime.datetime.now(datetime.timezone.utc) - t0).total_seconds(), "git_commit": git_commit(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": t0.isoformat(timespec="seconds"),
    }
    if args.busy:
        q, b = ratio["quiet"].get("mean"), ratio["busy"].get("mean")
        over = b / q if q and b else None
        busy_med = K.medians(values["busy"])
        entry["busy"] = {
            "neighbour": "one CPU-bound Python process beside each run, in quiet/busy pairs",
            "tokens_per_s": busy_med, "spread": K.spread(values["busy"]),
            "fastest": {arm: K.fastest(m) for arm, m in busy_med.items()},
            "local_over_best_e2e": ratio["busy"], "busy_over_quiet": over,
            "target": f"busy over quiet within {BUSY_TARGET:.0%} of 1",
            "target_met": over is not None and abs(over - 1) <= BUSY_TARGET,
        }
    try:
        table = json.loads(open(args.out).read())
    except (OSError, ValueError):
        table = {"about": "placement candidates' tokens/s per machine and config: bench/placement.py", "entries": []}
    table["entries"] = [e for e in table["entries"]
                        if not (e["machine"] == entry["machine"] and e["speed_key"] == entry["speed_key"])] + [entry]
    write_json(args.out, table)
    for side in sides:
        m = K.medians(values[side])
        for arm, vs in m.items():
            print(f"{side} {arm}: " + ", ".join(f"{n} {'-' if v is None else f'{v:,.0f}'}" for n, v in vs.items())
                  + f" tok/s; fastest {K.fastest(vs)}")
        s = ratio[side]
        if s.get("mean") is not None:
            print(f"{side}: local at its best over the best e2e {s['mean']:.3f} "
                  f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]" if s.get("ci95") else f"{side}: {s['mean']:.3f}")
    if args.busy:
        print(f"busy over quiet: {entry['busy']['busy_over_quiet']:.3f} (target met: {entry['busy']['target_met']})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
