"""Benchmark: the seams study as 1, 2 and 4 real pipeline stages (seamkit.dist), not a test.

For each stage count: tokens/s of e2e and local, local/e2e, each arm's mean wait share
(the pipeline bubble), and the measured bytes per step next to the analytic ones. Threads are
split evenly: each rank gets max(1, cores // stages), so 4 stages on 2 cores oversubscribe
(`--threads 1` gives every rank one thread instead: on a shared 2-core machine two OpenMP
threads in one process can be far slower than one).

    .venv/bin/python bench/dist.py                      # cpu preset, 20 s per arm
    .venv/bin/python bench/dist.py --budget 60 --stages 1,2,4 --out runs/bench_dist
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from seamkit import config as C
from seamkit.dist import launch


def row(stages: int, report: dict, wall_s: float) -> dict:
    e2e, local = report["arms"]["e2e"], report["arms"]["local"]
    mb = report["measured_bytes"]
    return {
        "stages": stages, "threads_per_rank": report["run_config"]["train"]["threads"],
        "micro_batches": report["micro_batches"],
        "e2e_tok_s": e2e["tokens_per_s"], "local_tok_s": local["tokens_per_s"],
        "local_over_e2e": round(local["tokens_per_s"] / e2e["tokens_per_s"], 2) if e2e["tokens_per_s"] else None,
        "e2e_wait": round(report["bubble"]["e2e"], 3), "local_wait": round(report["bubble"]["local"], 3),
        "e2e_bytes": mb["e2e"]["per_step"], "e2e_analytic": mb["e2e"]["analytic_per_step"],
        "local_bytes": mb["local"]["per_step"], "local_analytic": mb["local"]["analytic_per_step"],
        "agree": report["measured_matches_analytic"],
        "e2e_loss": e2e["final_loss"], "local_loss": local["final_loss"], "wall_s": round(wall_s, 1),
    }


def table(rows: list[dict]) -> str:
    head = ("| stages | threads/rank | M | e2e tok/s | local tok/s | local/e2e | wait e2e | wait local "
            "| e2e B/step (analytic) | local B/step (analytic) | agree | final loss e2e / local |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['stages']} | {r['threads_per_rank']} | {r['micro_batches']} | {r['e2e_tok_s']:,.0f} "
                     f"| {r['local_tok_s']:,.0f} | {r['local_over_e2e']} | {r['e2e_wait']:.2f} | {r['local_wait']:.2f} "
                     f"| {r['e2e_bytes']:,} ({r['e2e_analytic']:,}) | {r['local_bytes']:,} ({r['local_analytic']:,}) "
                     f"| {r['agree']} | {r['e2e_loss']} / {r['local_loss']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per arm")
    ap.add_argument("--stages", default="1,2,4", help="comma-separated stage counts")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores to split between the ranks")
    ap.add_argument("--threads", type=int, default=0, help="threads per rank; 0: cores // stages (at least 1)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default="runs/bench_dist", help="directory for the reports and the table")
    args = ap.parse_args(argv)
    out = Path(args.out)
    rows = []
    for S in (int(s) for s in args.stages.split(",")):
        cfg = C.override(C.preset(args.preset), {**C.parse_overrides(args.overrides),
                                                 "train.budget_seconds": args.budget,
                                                 "train.threads": args.threads or max(1, args.cores // S)})
        t0 = time.perf_counter()
        report = launch(cfg, out / f"stages{S}.json", S, progress=False)
        rows.append(row(S, report, time.perf_counter() - t0))
        print(json.dumps(rows[-1]), file=sys.stderr)
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
