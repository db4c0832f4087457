"""Benchmark: the local arm on stages against e2e on every pipeline schedule (not a test).

For each stage count S (default 2 and 4) and each e2e schedule of torch.distributed.pipelining
(gpipe, 1f1b, interleaved1f1b, interleavedzb, zbv, dualpipev) at M in {S, 2S, 4S} micro-batches,
one e2e run on placement `pipe:SCHEDULE:M` over S devices (combinations a schedule refuses,
`seamkit.seams.placement.layout`'s one line, are listed as skipped with it); local runs on
`stages` over the same S devices are interleaved every few configurations (the machine may be
shared). Every run is one arm alone on its ranks, as the study runs it
(`seamkit.seams.processes.run_arms`). Each row: tokens/s, the bubble (the share of all ranks'
time spent waiting, timed where a rank blocks: the arm's `wire.wait_share`), and whether the
measured bytes equal the analytic bytes of its crossings (`wire.agrees`). Then the fastest e2e
configuration at each S is run again in alternation with local (local, e2e, e2e, local, ...)
and local/e2e is the median of the adjacent pairs: the comparison names that schedule and M.
Every rank gets `--threads` threads (default 1), so 4 stages on a 2-core machine are
oversubscribed.

    python bench/dist.py --stages 2,4 --budget 6 --pairs 3 --local-every 5 --json bench/results/dist.json
    python bench/dist.py --dry-run --preset seed --device cuda    # what a GPU run would execute

`--dry-run` runs nothing: for every configuration it prints what each rank would hold (its
segments and their blocks, its device and backend) and the torchrun command that runs it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from seamkit import config as C
from seamkit.config import ConfigError, Placement
from seamkit.report import git_commit, machine, write_json
from seamkit.seams.arm import ArmSpec
from seamkit.seams.placement import Layout, layout
from seamkit.seams.processes import run_arms

LOCAL = Placement("stages")


def configs(S: int, schedules=C.PIPELINE_SCHEDULES) -> list[Placement]:
    """Every pipe schedule at S, 2S and 4S micro-batches."""
    return [Placement("pipe", s, M) for s in schedules for M in (S, 2 * S, 4 * S)]


def run(cfg: C.RunConfig, S: int, arm: str, placement: Placement) -> dict:
    """One arm alone on `placement` over S devices: its row."""
    t0 = time.perf_counter()
    results, _ = run_arms({arm: ArmSpec(arm, cfg, placement, S)})
    a = results[arm]
    w = a.wire or {}
    return {"arm": arm, "stages": S, "placement": a.placement,
            "schedule": placement.schedule if arm == "e2e" else None,
            "micro_batches": placement.micro_batches if arm == "e2e" else None,
            "status": a.status, "steps": a.steps, "tok_s": a.tokens_per_s,
            "bubble": round(w["wait_share"], 4) if "wait_share" in w else None,
            "bytes_per_step": w.get("bytes_per_step"), "analytic_per_step": w.get("analytic_bytes_per_step"),
            "agree": w.get("agrees"), "peak_rss_bytes": a.peak_rss_bytes, "rss_growth_bytes": a.rss_growth_bytes,
            "wall_s": round(time.perf_counter() - t0, 1)}


def _say(row: dict) -> dict:
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def runnable(cfg: C.RunConfig, S: int, schedules: list[str], skipped: list) -> list[Placement]:
    """The pipe configurations `layout` accepts at S; the others go to `skipped` with its reason."""
    todo = []
    for p in configs(S, schedules):
        try:
            layout(cfg, "e2e", p, S)
            todo.append(p)
        except ConfigError as e:
            skipped.append({"stages": S, "schedule": p.schedule, "micro_batches": p.micro_batches, "reason": str(e)})
    return todo


def sweep(base: C.RunConfig, S: int, args, rows: list, skipped: list) -> None:
    """Every runnable e2e configuration at S once, a local run before every `local_every`-th and at the end."""
    for i, p in enumerate(runnable(base, S, args.schedules.split(","), skipped)):
        if i % args.local_every == 0:
            rows.append(_say(run(base, S, "local", LOCAL)))
        rows.append(_say(run(base, S, "e2e", p)))
    rows.append(_say(run(base, S, "local", LOCAL)))


def confirm(base: C.RunConfig, S: int, best: dict, pairs: int) -> dict:
    """local and the fastest e2e configuration in alternation; local/e2e from adjacent pairs."""
    p = Placement("pipe", best["schedule"], best["micro_batches"])
    samples = []
    for k in range(pairs):
        first, second = ("local", "e2e") if k % 2 == 0 else ("e2e", "local")  # same schedule position
        got = {arm: run(base, S, arm, p if arm == "e2e" else LOCAL) for arm in (first, second)}
        samples.append(_say({"local_tok_s": got["local"]["tok_s"], "e2e_tok_s": got["e2e"]["tok_s"],
                             "ratio": got["local"]["tok_s"] / got["e2e"]["tok_s"],
                             "e2e_bubble": got["e2e"]["bubble"], "local_bubble": got["local"]["bubble"],
                             "peak_rss_ratio": got["local"]["peak_rss_bytes"] / got["e2e"]["peak_rss_bytes"],
                             "agree": got["local"]["agree"] and got["e2e"]["agree"]}))
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


# ----------------------------------------------------------------------------- what a GPU run would execute

def ranks_of(lay: Layout, device: str) -> list[dict]:
    """What each rank of a layout holds: its segments (virtual stages of a pipe) and their blocks,
    on one device per rank."""
    backend = "nccl" if device == "cuda" else "gloo"
    return [{"rank": r, "device": f"cuda:{r}" if device == "cuda" else "cpu", "backend": backend,
             "segments": lay.held_by(r), "blocks": [lay.segs[v] for v in lay.held_by(r)]} for r in range(lay.ranks)]


def dry_run(base: C.RunConfig, stages: list[int], schedules: list[str], device: str) -> int:
    """Print, without running, what each configuration would execute on `device`."""
    for S in stages:
        for arm, p in [("e2e", p) for p in configs(S, schedules)] + [("local", LOCAL)]:
            what = f"S={S} {arm} on {p}"
            try:
                lay = layout(base, arm, p, S)
            except ConfigError as e:
                print(f"# {what}: skipped: {e}")
                continue
            name = f"s{S}_{arm}_{str(p).replace(':', '_')}"
            cmd = (f"torchrun --nproc-per-node {S} -m seamkit.seams.torchrun --preset {base.preset} --arm {arm} "
                   f"--placement {p} --set train.device={device} --set data.batch={base.data.batch} "
                   f"--threads {base.train.threads} --budget {base.train.budget_seconds:g} "
                   f"--out runs/bench_dist/{name}.json")
            print(f"# {what}\n{cmd}")
            print(json.dumps({"placement": str(lay.placement), "ranks": lay.ranks, "micro_batches": lay.micro_batches,
                              "rows_per_action": lay.rows, "threads_per_rank": lay.threads,
                              "per_rank": ranks_of(lay, device)}))
    if device == "cuda":
        print("# NCCL needs one GPU per rank: S=2 needs 2 GPUs, S=4 needs 4.")
    return 0


def merged(path: str, result: dict, stages: list[int]) -> dict:
    """`result` over an existing results file: one run per stage count, the others' results kept."""
    prior = json.loads(Path(path).read_text())

    def keep(xs):
        return [x for x in xs if x["stages"] not in stages]
    result["command"] = [c for c in ([prior["command"]] if isinstance(prior["command"], str) else prior["command"])
                         if c != result["command"]] + [result["command"]]
    for k in ("comparison", "rows", "skipped"):
        result[k] = sorted(keep(prior[k]) + result[k], key=lambda x: x["stages"])
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--budget", type=float, default=10.0, help="seconds per run")
    ap.add_argument("--stages", default="2,4", help="comma-separated stage counts (devices of each run)")
    ap.add_argument("--schedules", default=",".join(C.PIPELINE_SCHEDULES), help="comma-separated pipe schedules")
    ap.add_argument("--batch", type=int, default=16, help="data.batch (16: M = 4S divides it at S = 4)")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--local-every", dest="local_every", type=int, default=4, help="a local run every N e2e runs")
    ap.add_argument("--pairs", type=int, default=4, help="alternating local/e2e pairs for the fastest e2e")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", help="write the results here (bench/results/dist.json)")
    ap.add_argument("--note", default="ratios come from alternating adjacent runs",
                    help="what the results file says about the machine (quiet, shared...)")
    ap.add_argument("--dry-run", dest="dry_run", action="store_true", help="print what would run; run nothing")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="--dry-run: the device to describe")
    args = ap.parse_args(argv)
    stages = [int(s) for s in args.stages.split(",")]
    base = C.override(C.preset(args.preset), {**C.parse_overrides(args.overrides), "train.budget_seconds": args.budget,
                                              "train.threads": args.threads, "data.batch": args.batch,
                                              "train.eval_tokens": 1, "train.max_steps": 0})
    if args.dry_run:
        return dry_run(base, stages, args.schedules.split(","), args.device)
    rows, skipped, confirmed = [], [], []
    for S in stages:
        sweep(base, S, args, rows, skipped)
        e2e = [r for r in rows if r["stages"] == S and r["arm"] == "e2e" and r["status"] == "complete"]
        confirmed.append(confirm(base, S, max(e2e, key=lambda r: r["tok_s"]), args.pairs))
        print(table(rows, S))
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in ["bench/dist.py", *(argv or sys.argv[1:])]),
        "machine": {**machine(), "note": args.note},
        "torch": torch.__version__, "git_commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "preset": args.preset, "batch": args.batch, "budget_seconds": args.budget, "threads_per_rank": args.threads,
        "comparison": confirmed, "rows": rows, "skipped": skipped,
    }
    if args.json:
        write_json(args.json, merged(args.json, result, stages) if Path(args.json).exists() else result)
    for c in confirmed:
        print(f"S={c['stages']}: {c['comparison']}: local/e2e {c['local_over_e2e_median']} "
              f"(min {c['local_over_e2e_min']}, max {c['local_over_e2e_max']}), bubble e2e "
              f"{c['e2e_bubble_median']:.3f}, local {c['local_bubble_median']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
