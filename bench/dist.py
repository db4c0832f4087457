"""Benchmark: the local arm against every e2e pipeline schedule on real stages (not a test).

For each stage count S (default 2 and 4) and each e2e schedule of torch.distributed.pipelining
(seamkit.seams.pipeline: gpipe, 1f1b, interleaved1f1b, interleavedzb, zbv, dualpipev) at M in {S, 2S, 4S}
micro-batches (combinations a schedule refuses are listed as skipped, with its reason), one
e2e-only launch per configuration; local-only launches are interleaved every few
configurations (the machine may be shared). Each row: tokens/s, the bubble each arm measures
(wait share of all ranks' time, timed where a rank blocks), and measured == analytic bytes.
Then the fastest e2e configuration at each S is re-run in alternation with local
(local, e2e, local, e2e, ...) and local/e2e is the median of the adjacent pairs: the comparison
names that schedule and M. Every rank gets one thread (`--threads`), so 4 stages on a 2-core
machine are oversubscribed.

    python bench/dist.py --stages 2 --budget 10 --json bench/results/dist_s2.json
    python bench/dist.py --dry-run --preset seed --device cuda    # what a GPU run would execute
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from seamkit import config as C
from seamkit.config import ConfigError
from seamkit.report import git_commit, write_json
from seamkit.seams.pipeline import launch, make_plan
from seamkit.seams.pipeline.plan import describe


def configs(S: int, batch: int) -> list[tuple[str, int]]:
    return [(s, M) for s in C.PIPELINE_SCHEDULES for M in (S, 2 * S, 4 * S)]


def run(cfg: C.RunConfig, S: int, arm: str, out: Path) -> dict:
    t0 = time.perf_counter()
    report = launch(cfg, out, S, progress=False, arms=(arm,))
    a = report["arms"][arm]
    m = report["measured_bytes"][arm]
    return {"arm": arm, "stages": S, "schedule": cfg.seams.pipeline_schedule if arm == "e2e" else None,
            "micro_batches": report["micro_batches"] if arm == "e2e" else None,
            "status": a["status"], "steps": a["steps"], "tok_s": a["tokens_per_s"],
            "bubble": round(report["bubble"][arm], 4),
            "wait_share_per_rank": [round(r["wait_share"], 3) for r in report["per_rank"][arm]],
            "unaccounted_share_per_rank": [round(r["other_s"] / r["elapsed_s"], 3) for r in report["per_rank"][arm]],
            "bytes_per_step": m["per_step"], "analytic_per_step": m["analytic_per_step"],
            "agree": m["agrees"] and m["sent_equals_received"],
            "peak_rss_bytes": a["peak_rss_bytes"], "rss_growth_bytes": a.get("rss_growth_bytes"),
            "wall_s": round(time.perf_counter() - t0, 1)}


def sweep(base: C.RunConfig, S: int, args, out: Path, rows: list, skipped: list) -> None:
    todo = []
    for schedule, M in configs(S, base.data.batch):
        cfg = C.override(base, {"seams.pipeline_schedule": schedule, "seams.micro_batches": M})
        try:
            make_plan(cfg, S)
        except ConfigError as e:
            skipped.append({"stages": S, "schedule": schedule, "micro_batches": M, "reason": str(e)})
            continue
        todo.append(cfg)
    local_cfg = base
    for i, cfg in enumerate(todo):
        if i % args.local_every == 0:
            rows.append(run(local_cfg, S, "local", out / f"s{S}_local{i}.json"))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        rows.append(run(cfg, S, "e2e", out / f"s{S}_{cfg.seams.pipeline_schedule}_m{cfg.seams.micro_batches}.json"))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    rows.append(run(local_cfg, S, "local", out / f"s{S}_local_end.json"))
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)


def confirm(base: C.RunConfig, S: int, best: dict, pairs: int, out: Path) -> dict:
    """local and the fastest e2e configuration in alternation; local/e2e from adjacent pairs."""
    cfg = C.override(base, {"seams.pipeline_schedule": best["schedule"], "seams.micro_batches": best["micro_batches"]})
    samples = []
    for k in range(pairs):
        first, second = ("local", "e2e") if k % 2 == 0 else ("e2e", "local")  # same schedule position
        got = {arm: run(cfg if arm == "e2e" else base, S, arm, out / f"s{S}_confirm{k}_{arm}.json")
               for arm in (first, second)}
        samples.append({"local_tok_s": got["local"]["tok_s"], "e2e_tok_s": got["e2e"]["tok_s"],
                        "ratio": got["local"]["tok_s"] / got["e2e"]["tok_s"],
                        "e2e_bubble": got["e2e"]["bubble"], "local_bubble": got["local"]["bubble"],
                        "peak_rss_ratio": got["local"]["peak_rss_bytes"] / got["e2e"]["peak_rss_bytes"],
                        "agree": got["local"]["agree"] and got["e2e"]["agree"]})
        print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
    ratios = [s["ratio"] for s in samples]
    return {"stages": S, "e2e_schedule": best["schedule"], "e2e_micro_batches": best["micro_batches"],
            "comparison": f"local vs e2e {best['schedule']} with {best['micro_batches']} micro-batches on {S} stages",
            "local_over_e2e_median": round(statistics.median(ratios), 3),
            "local_over_e2e_min": round(min(ratios), 3), "local_over_e2e_max": round(max(ratios), 3),
            "e2e_bubble_median": statistics.median(s["e2e_bubble"] for s in samples),
            "local_bubble_median": statistics.median(s["local_bubble"] for s in samples),
            "samples": samples}


def table(rows: list[dict], S: int) -> str:
    head = "| arm | schedule | M | tok/s | bubble | B/step measured (analytic) | agree |"
    lines = [f"S = {S}", head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["stages"] == S:
            lines.append(f"| {r['arm']} | {r['schedule'] or '-'} | {r['micro_batches'] or '-'} | {r['tok_s']:,.0f} "
                         f"| {r['bubble']:.3f} | {r['bytes_per_step']:,} ({r['analytic_per_step']:,}) | {r['agree']} |")
    return "\n".join(lines)


def dry_run(base: C.RunConfig, stages: list[int], device: str) -> int:
    """Print, without running, what each configuration would execute on `device`."""
    for S in stages:
        for schedule, M in configs(S, base.data.batch):
            cfg = C.override(base, {"seams.pipeline_schedule": schedule, "seams.micro_batches": M, "train.device": "cpu"})
            try:
                plan = make_plan(cfg, S)
            except ConfigError as e:
                print(f"# S={S} {schedule} M={M}: skipped: {e}")
                continue
            cmd = (f"torchrun --nproc-per-node {S} -m seamkit.seams.pipeline --preset {base.preset} --schedule {schedule} "
                   f"--micro-batches {M} --set train.device={device} --set data.batch={base.data.batch} "
                   f"--budget {base.train.budget_seconds:g} --out runs/bench_dist/s{S}_{schedule}_m{M}.json")
            print(f"# S={S} {schedule} M={M}\n{cmd}")
            print(json.dumps(describe(cfg, plan, device)))
    if device == "cuda":
        print("# NCCL needs one GPU per rank: S=2 needs 2 GPUs, S=4 needs 4 (seamkit.seams.pipeline refuses fewer).")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--budget", type=float, default=10.0, help="seconds per launch")
    ap.add_argument("--stages", default="2,4", help="comma-separated stage counts")
    ap.add_argument("--batch", type=int, default=16, help="data.batch (16: M = 4S divides it at S = 4)")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--local-every", dest="local_every", type=int, default=4, help="a local run every N e2e runs")
    ap.add_argument("--pairs", type=int, default=4, help="alternating local/e2e pairs for the fastest e2e")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default="runs/bench_dist", help="directory for the reports")
    ap.add_argument("--json", help="write the results here (bench/results/dist.json)")
    ap.add_argument("--note", default="ratios come from alternating adjacent runs",
                    help="what the results file says about the machine (quiet, shared...)")
    ap.add_argument("--dry-run", dest="dry_run", action="store_true", help="print what would run; run nothing")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="--dry-run: the device to describe")
    args = ap.parse_args(argv)
    stages = [int(s) for s in args.stages.split(",")]
    base = C.override(C.preset(args.preset), {**C.parse_overrides(args.overrides), "train.budget_seconds": args.budget,
                                              "train.threads": args.threads, "data.batch": args.batch,
                                              "train.eval_batches": 1, "train.max_steps": 0})
    if args.dry_run:
        return dry_run(base, stages, args.device)
    out = Path(args.out)
    rows, skipped, confirmed = [], [], []
    for S in stages:
        sweep(base, S, args, out, rows, skipped)
        e2e = [r for r in rows if r["stages"] == S and r["arm"] == "e2e" and r["status"] == "complete"]
        best = max(e2e, key=lambda r: r["tok_s"])
        confirmed.append(confirm(base, S, best, args.pairs, out))
        print(table(rows, S))
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "machine": {"platform": platform.platform(), "cores": os.cpu_count(), "note": args.note},
        "torch": torch.__version__, "git_commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "preset": args.preset, "batch": args.batch, "budget_seconds": args.budget, "threads_per_rank": args.threads,
        "comparison": confirmed, "rows": rows, "skipped": skipped,
    }
    if args.json and Path(args.json).exists():  # one locked run per stage count: keep the others' results
        old = json.loads(Path(args.json).read_text())
        keep = lambda xs: [x for x in xs if x["stages"] not in stages]  # noqa: E731
        result["command"] = [c for c in ([old["command"]] if isinstance(old["command"], str) else old["command"])
                             if c != result["command"]] + [result["command"]]
        for k in ("comparison", "rows", "skipped"):
            result[k] = sorted(keep(old[k]) + result[k], key=lambda x: x["stages"])
    if args.json:
        write_json(args.json, result)
    for c in confirmed:
        print(f"S={c['stages']}: {c['comparison']}: local/e2e {c['local_over_e2e_median']} "
              f"(min {c['local_over_e2e_min']}, max {c['local_over_e2e_max']}), bubble e2e "
              f"{c['e2e_bubble_median']:.3f}, local {c['local_bubble_median']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
