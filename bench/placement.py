"""Benchmark: every placement candidate's tokens/s at a hardware budget, written as this host's
committed calibration (not a test).

What `seamkit seams --placement best` picks from (`seamkit.seams.calibration`): every candidate of
each arm (one process, data parallel, each pipeline schedule at its default micro-batches, local
and delayed stages) trains `--steps` steps alone on processes of its own; its speed is taken over
the steps after the first quarter. Rounds interleave the candidates (round r runs each once, the
order reversed every other round), so a slow minute of the machine lands on all of them; the
entry keeps each candidate's median and every round's value.

`--busy` runs every candidate twice a round, quiet and beside one CPU-bound process (a pair, its
order alternating by round, so both sides see the same minute of the machine). Each round gives
local at its best over e2e at its best (`local_over_best_e2e`), quiet and busy; over the rounds
their mean with a t-based 95% interval, and busy over quiet, whose target is to stay within 10%
of 1 (the study's answer does not hang on a neighbour).

The quiet entry goes into `--out`, by default the committed calibrations the study reads
(`seamkit/calibrations.json`, package data: `seamkit.seams.calibration.COMMITTED`), under this
host's machine key (CPU model, cores, torch, OpenMP wait policy, GPU), the config's speed key and
this host's speed fingerprint, measured at the start of the run. It replaces an entry of the same
machine, speed key and a fingerprint within `FINGERPRINT_TOL`, and keeps every other. With
`seams.calibration=auto` (the default) a study on this host and config then re-times the
entry's choices instead of calibrating.

    python bench/placement.py --preset cpu --devices 2 --rounds 3 --set seams.arms=e2e,local,delayed
    python bench/placement.py --preset cpu --devices 2 --rounds 3 --busy --out bench/results/placement_busy.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import statistics
import sys
from pathlib import Path

from seams import busy_neighbour

from seamkit import config as C
from seamkit.report import git_commit, write_json
from seamkit.seams import calibration as K
from seamkit.seams.placement import candidates
from seamkit.stats import stats

BUSY_TARGET = 0.10  # busy over quiet of local_over_best_e2e stays within this of 1
ABOUT = ("placement candidates' tokens/s per host and config, written by bench/placement.py; a study takes an "
         "entry only on the host it was measured on (machine key and speed fingerprint)")


def _measure(cfg, devices: int, arm: str, p, busy: bool) -> float | None:
    hog = busy_neighbour() if busy else None
    try:
        return K.measure(cfg, devices, {arm: [p]}, rounds=1)["tokens_per_s"][arm][p.name]
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def _whole(v: list) -> bool:
    return bool(v) and all(x is not None for x in v)


def medians(values: dict) -> dict:
    """{arm: {candidate: the median of its speeds}} (None where any run gave none)."""
    return {arm: {n: statistics.median(v) if _whole(v) else None for n, v in vs.items()} for arm, vs in values.items()}


def spread(values: dict) -> dict:
    """{arm: {candidate: {values, min, max}}} of every run's speed (None where any run gave none)."""
    return {arm: {n: {"values": v, "min": min(v), "max": max(v)} if _whole(v) else None for n, v in vs.items()}
            for arm, vs in values.items()}


def _ratio(round_values: dict) -> float | None:
    """local at its best over e2e at its best, in one round."""
    best = {arm: max((v for v in vs.values() if v is not None), default=None) for arm, vs in round_values.items()}
    return best["local"] / best["e2e"] if best.get("local") and best.get("e2e") else None


def rounds(cfg, devices: int, n: int, sides: tuple) -> tuple[dict, dict]:
    """Every candidate once a round on each side, in interleaved rounds: ({side: {arm: {name:
    [speeds]}}}, {side: [local over e2e of each round]})."""
    cands = candidates(cfg, devices)
    order = [(arm, p) for arm, ps in cands.items() for p in ps]
    values = {side: {arm: {p.name: [] for p in ps} for arm, ps in cands.items()} for side in sides}
    ratios = {side: [] for side in sides}
    for r in range(n):
        todo = order if r % 2 == 0 else order[::-1]
        pair = sides if r % 2 == 0 else sides[::-1]
        this = {side: {arm: {} for arm in cands} for side in sides}
        for arm, p in todo:
            for side in pair:
                print(f"round {r + 1}/{n}: {arm} on {p.name}, {side}", file=sys.stderr, flush=True)
                v = _measure(cfg, devices, arm, p, side == "busy")
                values[side][arm][p.name].append(v)
                this[side][arm][p.name] = v
        for side in sides:
            ratios[side].append(_ratio(this[side]))
    return values, ratios


def busy_block(values: dict, ratio: dict) -> dict:
    q, b = ratio["quiet"].get("mean"), ratio["busy"].get("mean")
    over = b / q if q and b else None
    med = medians(values["busy"])
    return {"neighbour": "one CPU-bound Python process beside each run, in quiet/busy pairs",
            "tokens_per_s": med, "spread": spread(values["busy"]),
            "fastest": {arm: K.fastest(m) for arm, m in med.items()},
            "local_over_best_e2e": ratio["busy"], "busy_over_quiet": over,
            "target": f"busy over quiet within {BUSY_TARGET:.0%} of 1",
            "target_met": over is not None and abs(over - 1) <= BUSY_TARGET}


def same_host(a: dict, b: dict) -> bool:
    """Two entries of one host and config: machine key, speed key, fingerprints within FINGERPRINT_TOL."""
    fa, fb = a.get("fingerprint"), b.get("fingerprint")
    return (a.get("machine") == b.get("machine") and a.get("speed_key") == b.get("speed_key")
            and K.same_speed(fa, fb))


def write_entry(path: Path, entry: dict) -> None:
    """`entry` into the calibrations at `path` (created if missing), replacing one of the same host and config."""
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        table = {"about": ABOUT, "entries": []}
    table["entries"] = [e for e in table["entries"] if not same_host(e, entry)] + [entry]
    write_json(path, table)


def report(values: dict, ratio: dict, entry: dict, sides: tuple) -> None:
    for side in sides:
        for arm, vs in medians(values[side]).items():
            print(f"{side} {arm}: " + ", ".join(f"{n} {'-' if v is None else f'{v:,.0f}'}" for n, v in vs.items())
                  + f" tok/s; fastest {K.fastest(vs)}")
        s = ratio[side]
        if s.get("mean") is not None:
            print(f"{side}: local at its best over the best e2e {s['mean']:.3f} "
                  f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]" if s.get("ci95") else f"{side}: {s['mean']:.3f}")
    if "busy" in entry:
        b = entry["busy"]
        print(f"busy over quiet: {b['busy_over_quiet'] or float('nan'):.3f} (target met: {b['target_met']})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, help="steps per candidate and round (seams.calibrate_steps)")
    ap.add_argument("--busy", action="store_true", help="each candidate also beside one busy process, in pairs")
    ap.add_argument("--out", type=Path, default=K.COMMITTED, help="the calibrations file (default: the committed one)")
    args = ap.parse_args(argv)
    cfg = C.override(C.preset(args.preset), C.parse_overrides(args.overrides))
    if args.steps:
        cfg = C.override(cfg, {"seams.calibrate_steps": args.steps})
    t0 = datetime.datetime.now(datetime.timezone.utc)
    printed = K.fingerprint()  # before the runs, as a study measures it before it looks for an entry
    sides = ("quiet", "busy") if args.busy else ("quiet",)
    values, ratios = rounds(cfg, args.devices, args.rounds, sides)
    med = medians(values["quiet"])
    ratio = {side: {"rounds": ratios[side], **(stats(ratios[side]) or {})} for side in sides}
    entry = {
        "machine": K.machine_key(), "speed_key": K.speed_key(cfg, args.devices), "fingerprint": printed,
        "host": platform.node(), "devices": args.devices, "preset": args.preset, "overrides": args.overrides,
        "steps": cfg.seams.calibrate_steps, "rounds": args.rounds, "tokens_per_s": med,
        "spread": spread(values["quiet"]), "fastest": {arm: K.fastest(m) for arm, m in med.items()},
        "local_over_best_e2e": ratio["quiet"],
        "seconds": (datetime.datetime.now(datetime.timezone.utc) - t0).total_seconds(), "git_commit": git_commit(),
        "command": "python " + shlex.join(["bench/placement.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": t0.isoformat(timespec="seconds"),
    }
    if args.busy:
        entry["busy"] = busy_block(values, ratio)
    write_entry(args.out, entry)
    report(values, ratio, entry, sides)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
