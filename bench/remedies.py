"""Benchmark: how much of local's loss gap each remedy closes, on one process and on 2 devices (not a test).

Three studies per device count, each with `--repeats` paired seeds at the same budget per arm
(equal wall-clock), every arm on its fastest placement (`seams.placement=best`):
  A: local aux_head, delayed d=1 with weight stashing;
  B: local aux_block, delayed d=1 without stashing;
  C: local own_head.
Per arm: the final held-out loss (equal wall-clock), its paired gap to e2e with a 95% interval,
tokens/s, time to target (seconds to the held-out loss every arm of its study reaches), peak
memory and growth. Per remedy: the share of local aux_head's gap it closes, seed by seed
(1 - gap_remedy / gap_aux_head, both against e2e of the same seed), with its interval.

    python bench/remedies.py --preset cpu --devices 1,2 --budget 20 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import tempfile
import time
from pathlib import Path

from seamkit import config as C
from seamkit.report import provenance, write_json
from seamkit.seams.study import seams_study
from seamkit.stats import stats

STUDIES = {
    "A": {"seams.objective": "aux_head", "seams.arms": "e2e,local,delayed", "seams.weight_stashing": True},
    "B": {"seams.objective": "aux_block", "seams.arms": "e2e,local,delayed", "seams.weight_stashing": False},
    "C": {"seams.objective": "own_head", "seams.arms": "e2e,local"},
}
# remedy -> (study, arm); the baseline is local aux_head of study A
REMEDIES = {"local aux_head": ("A", "local"), "delayed d=1, stashing": ("A", "delayed"),
            "local aux_block": ("B", "local"), "delayed d=1, no stashing": ("B", "delayed"),
            "local own_head": ("C", "local")}


def arm_rows(report: dict) -> dict:
    out = {}
    for arm in report["arms"]:
        per_seed = []
        for rep in report["repeats"]:
            a, e = rep["arms"][arm], rep["arms"]["e2e"]
            ttt = rep.get("time_to_target") or {}
            per_seed.append({"seed": rep["seed"], "final_loss": a["final_loss"], "tokens_per_s": a["tokens_per_s"],
                             "gap_to_e2e": None if a["final_loss"] is None or e["final_loss"] is None
                             else a["final_loss"] - e["final_loss"],
                             "time_to_target_s": (ttt.get("seconds") or {}).get(arm),
                             "peak_memory_bytes": a.get("peak_vram_bytes") or a.get("peak_rss_bytes"),
                             "memory_growth_bytes": a.get("vram_growth_bytes") or a.get("rss_growth_bytes"),
                             "placement": a.get("placement")})
        out[arm] = {"per_seed": per_seed, **{k: stats([s[k] for s in per_seed]) for k in (
            "final_loss", "gap_to_e2e", "tokens_per_s", "time_to_target_s", "peak_memory_bytes",
            "memory_growth_bytes")}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--devices", default="1,2")
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/remedies.json")
    args = ap.parse_args(argv)
    base = C.override(C.preset(args.preset), {**C.parse_overrides(args.overrides),
                                              "train.budget_seconds": args.budget, "seams.repeats": args.repeats})
    results = {}
    with tempfile.TemporaryDirectory(prefix="seamkit-remedies-") as tmp:
        for n in [int(x) for x in args.devices.split(",")]:
            by_study = {}
            for name, over in STUDIES.items():
                cfg = C.override(base, {**over, "seams.devices": n})
                t0 = time.perf_counter()
                print(f"devices {n}, study {name}: {over}", file=sys.stderr, flush=True)
                report = seams_study(cfg, Path(tmp) / f"{name}_{n}.json", progress=False)
                by_study[name] = {"config": over, "status": report["status"], "wall_s": time.perf_counter() - t0,
                                  "placement": report["placement"], "arms": arm_rows(report)}
            base_gaps = {s["seed"]: s["gap_to_e2e"] for s in by_study["A"]["arms"]["local"]["per_seed"]}
            closes = {}
            for remedy, (study, arm) in REMEDIES.items():
                seeds = by_study[study]["arms"][arm]["per_seed"]
                fr = [1 - s["gap_to_e2e"] / base_gaps[s["seed"]] if s["gap_to_e2e"] is not None
                      and base_gaps.get(s["seed"]) else None for s in seeds]
                closes[remedy] = {"gap_to_e2e": by_study[study]["arms"][arm]["gap_to_e2e"],
                                  "share_of_aux_head_gap_closed": stats(fr),
                                  "tokens_per_s": by_study[study]["arms"][arm]["tokens_per_s"]}
            results[str(n)] = {"studies": by_study, "remedies": closes}
    write_json(args.out, {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
                          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                          "budget_seconds": args.budget, "repeats": args.repeats, "results": results,
                          **provenance(base)})
    for n, r in results.items():
        print(f"devices {n}:")
        for remedy, c in r["remedies"].items():
            g, f = c["gap_to_e2e"], c["share_of_aux_head_gap_closed"]
            print(f"  {remedy:26s} gap {g['mean']:+.4f} [{g['ci95'][0]:+.4f}, {g['ci95'][1]:+.4f}]" if g and g.get("ci95")
                  else f"  {remedy:26s} gap {g}", end="")
            print(f"; closes {f['mean']:.2f} [{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}] of aux_head's gap"
                  if f and f.get("ci95") else "")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
