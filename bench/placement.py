"""Benchmark: every placement candidate's tokens/s at a hardware budget (not a test).

What `seamkit seams --placement best` picks from (seamkit.seams.calibration): every candidate of
each arm (one process, data parallel, each pipeline schedule at its default micro-batches, local
stages) trains `--steps` steps alone in processes of its own; its speed is taken over the steps
after the first quarter. Rounds interleave the candidates (round r runs each once, the order
reversed every other round), so a slow minute of the machine lands on all of them; the entry
keeps each candidate's median and every round's value.

The entry is stored under this machine's key (CPU model, cores, torch) and the config's speed
key in bench/results/placement.json, where `seams.calibration=auto` (the default) finds it: a
study on a matching machine then runs no calibration of its own.

    python bench/placement.py --preset cpu --devices 2 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys

from seamkit import config as C
from seamkit.report import git_commit, write_json
from seamkit.seams import calibration as K
from seamkit.seams.placement import candidates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, help="steps per candidate and round (seams.calibrate_steps)")
    ap.add_argument("--out", default=str(K.BENCH))
    args = ap.parse_args(argv)
    cfg = C.override(C.preset(args.preset), C.parse_overrides(args.overrides))
    if args.steps:
        cfg = C.override(cfg, {"seams.calibrate_steps": args.steps})
    cands = candidates(cfg, args.devices)
    order = [(arm, p) for arm, ps in cands.items() for p in ps]
    values = {arm: {p.name: [] for p in ps} for arm, ps in cands.items()}
    seconds = 0.0
    for r in range(args.rounds):
        todo = order if r % 2 == 0 else order[::-1]
        for arm, p in todo:
            print(f"round {r + 1}/{args.rounds}: {arm} on {p.name}", file=sys.stderr, flush=True)
            got = K.measure(cfg, args.devices, {arm: [p]})
            seconds += got["seconds"]
            values[arm][p.name].append(got["tokens_per_s"][arm][p.name])
    med = {arm: {n: statistics.median(v) if all(x is not None for x in v) else None for n, v in vs.items()}
           for arm, vs in values.items()}
    entry = {
        "machine": K.machine_key(), "speed_key": K.speed_key(cfg, args.devices), "devices": args.devices,
        "preset": args.preset, "overrides": args.overrides, "steps": cfg.seams.calibrate_steps,
        "rounds": args.rounds, "tokens_per_s": med,
        "spread": {arm: {n: {"values": v, "min": min(v), "max": max(v)} if all(x is not None for x in v) else None
                         for n, v in vs.items()} for arm, vs in values.items()},
        "fastest": {arm: K.fastest(m) for arm, m in med.items()},
        "seconds": seconds, "git_commit": git_commit(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        table = json.loads(open(args.out).read())
    except (OSError, ValueError):
        table = {"about": "placement candidates' tokens/s per machine and config: bench/placement.py", "entries": []}
    table["entries"] = [e for e in table["entries"]
                        if not (e["machine"] == entry["machine"] and e["speed_key"] == entry["speed_key"])] + [entry]
    write_json(args.out, table)
    for arm, m in med.items():
        print(f"{arm}: " + ", ".join(f"{n} {'-' if v is None else f'{v:,.0f}'}" for n, v in m.items())
              + f" tok/s; fastest {entry['fastest'][arm]}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
