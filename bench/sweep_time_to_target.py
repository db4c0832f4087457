"""Held-out time to target per grid point of a seams sweep, from its points' reports (not a test).

The sweep's own aggregate (`sweep.json`) times the training curve to one target for all points;
each point's report also holds the study's held-out time to target (the seconds each arm's
held-out loss takes to reach the worse arm's final loss, `seams.report`) and where each arm ran.
This gathers them over the seeds of every grid point: each arm's seconds, their paired ratio,
tokens/s ratio and loss gap, with t-based 95% intervals, and each arm's placement and tokens/s
per seed.

    python bench/sweep_time_to_target.py bench/results/sweep_n2 --out bench/results/sweep_n2/time_to_target.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path

from seamkit.report import write_json
from seamkit.stats import interval, stats


def gather(sweep_dir: Path) -> list[dict]:
    plan = json.loads((sweep_dir / "plan.json").read_text())
    by_grid = defaultdict(list)
    for p in plan["points"]:
        rep = json.loads((sweep_dir / p["dir"] / "seams.json").read_text())
        tt = rep["repeats"][0]["time_to_target"]
        arms = rep["arms"]
        by_grid[json.dumps(p["grid"], sort_keys=True)].append({
            "seed": p["seed"], "placement": rep["placement"]["chosen"], "placement_source": rep["placement"]["source"],
            "tokens_per_s": {a: arms[a]["tokens_per_s"] for a in ("e2e", "local")},
            "final_loss": {a: arms[a]["final_loss"] for a in ("e2e", "local")},
            "target_loss": tt["target_loss"], "seconds": tt["seconds"]})
    rows = []
    for grid, seeds in by_grid.items():
        rows.append({
            "grid": json.loads(grid), "seeds": seeds,
            "e2e_seconds": stats([s["seconds"]["e2e"] for s in seeds]),
            "local_seconds": stats([s["seconds"]["local"] for s in seeds]),
            "local_over_e2e_seconds": stats([s["seconds"]["local"] / s["seconds"]["e2e"] for s in seeds]),
            "local_over_e2e_tokens_per_s": stats([s["tokens_per_s"]["local"] / s["tokens_per_s"]["e2e"] for s in seeds]),
            "loss_gap_local_minus_e2e": stats([s["final_loss"]["local"] - s["final_loss"]["e2e"] for s in seeds]),
        })
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = gather(args.sweep_dir)
    for r in rows:
        places = sorted({f"{s['placement']['e2e']}/{s['placement']['local']}" for s in r["seeds"]})
        digits = {"e2e_seconds": ".1f", "local_seconds": ".1f", "local_over_e2e_seconds": ".2f",
                  "local_over_e2e_tokens_per_s": ".2f", "loss_gap_local_minus_e2e": ".3f"}
        ci = {k: interval(r[k], spec) for k, spec in digits.items()}
        print(f"{r['grid']}: e2e/local on {', '.join(places)}; seconds to target e2e {ci['e2e_seconds']}, "
              f"local {ci['local_seconds']}, local/e2e {ci['local_over_e2e_seconds']}; tokens/s "
              f"local/e2e {ci['local_over_e2e_tokens_per_s']}; gap {ci['loss_gap_local_minus_e2e']}")
    if args.out:
        write_json(args.out, {"command": "python bench/sweep_time_to_target.py " + shlex.join(sys.argv[1:]),
                              "sweep": str(args.sweep_dir), "points": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
