"""Benchmark of the pruned training step, every cost counted (a benchmark, not a test).

For each case: windows of held-out documents, a model with random weights and an AdamW that
holds the moments of one earlier step (as a checkpoint from mid-training does; a fresh AdamW
would time the one-off allocation of its state in every step), and interleaved pairs of steps
(base, prune_exact; the order alternates), each from the same starting state. The pruned step's time and memory hold all of pruning: the plan, its indices
and masks, and in bitwise mode the calibration (check.mode_loss); nothing is set up ahead.

Per window and case:
- speed-up: the median over interleaved pairs of prune_exact words/s over base words/s;
- memory: peak live tensor bytes of one profiled step (parameters and optimizer state
  included), prune_exact over base;
- FLOPs: forward + backward of each mode counted with FlopCounterMode (what ran), the plan's
  FLOPs (prune.plan_flops), and the ceiling they imply: base FLOPs / pruned FLOPs measured.
  FlopCounterMode counts matmuls and attention only; the memory-bound work over rows x vocab
  (log-softmax, its backward, the zero-filled logit gradient) shrinks with the rows too, so at a
  large vocabulary the speed-up can pass the FLOP ceiling;
- exactness: the largest difference of loss, gradients, update and state, prune_exact vs base.

Targets (issue #10): cpu preset, completion and random:0.5, >= 1.00x on every window; Qwen
vocabulary, dim 128, 4 blocks, random:0.5, >= 1.6x and >= 85% of the measured-FLOP ceiling;
peak memory lower than base everywhere.

    python bench/prune.py --threads 1 --out bench/results/prune.json     # the three issue cases
    python bench/prune.py --cases big-random --pairs 3 --exact bitwise
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seamkit import check, prune  # noqa: E402
from seamkit import config as C  # noqa: E402
from seamkit.model import GPT  # noqa: E402
from seamkit.report import atomic_write_text  # noqa: E402

BIG = {"data.tokenizer": "qwen", "model.vocab": 151936, "model.n_blocks": 4}
CASES = {
    "cpu-completion": ("cpu", {"prune.policy": "completion"}),
    "cpu-random": ("cpu", {"prune.policy": "random:0.5"}),
    "big-completion": ("cpu", {"prune.policy": "completion", **BIG}),
    "big-random": ("cpu", {"prune.policy": "random:0.5", **BIG}),
    "seed-completion": ("seed", {"prune.policy": "completion"}),  # GPU only
    "seed-random": ("seed", {"prune.policy": "random:0.5"}),  # GPU only
}
TARGETS = {"cpu-completion": {"min_speedup_every_window": 1.0}, "cpu-random": {"min_speedup_every_window": 1.0},
           "big-random": {"min_speedup": 1.6, "min_share_of_flop_ceiling": 0.85}}


def max_delta(d: dict) -> float:
    return max(d[k] for k in ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max"))


def run_window(stepper, cfg, w, wi: int, pairs: int, exact: str, device) -> dict:
    fns = {m: check.mode_loss(m, w, exact) for m in check.MODES}
    got = {m: stepper.step(fns[m]) for m in check.MODES}  # warm-up, and the exactness of this window
    delta = check.compare(got["base"], got["prune_exact"])
    flops = {}
    for m in check.MODES:
        stepper.reset()
        flops[m] = prune.measured_flops(lambda: fns[m](stepper.model))
    planned = prune.plan_flops(cfg.model, prune.plan(w))
    peak = {m: (check.timed_sample(stepper, fns[m], w.words, device)["allocated_GiB"] * check.GiB
                if device.type == "cuda" else check.profiled_peak_bytes(stepper, fns[m])) for m in check.MODES}
    samples = {m: [] for m in check.MODES}
    for k in range(pairs):
        order = check.MODES if k % 2 == 0 else check.MODES[::-1]
        for m in order:
            samples[m].append(check.timed_sample(stepper, fns[m], w.words, device)["seconds"])
    speedups = [b / p for b, p in zip(samples["base"], samples["prune_exact"])]
    p = prune.plan(w)
    return {"window": wi, "positions": p.positions, "live": len(p.live), "targets": len(p.target),
            "words": int(w.words), "seconds": samples, "speedup": statistics.median(speedups),
            "speedups": speedups, "peak_bytes": peak, "memory_ratio": peak["prune_exact"] / peak["base"],
            "flops": {"base": flops["base"], "prune_exact": flops["prune_exact"], "plan_base": planned["base"],
                      "plan_pruned": planned["pruned"], "ceiling": flops["base"] / flops["prune_exact"],
                      "plan_ceiling": planned["base"] / planned["pruned"]},
            "max_delta_vs_base": max_delta(delta), "bitwise_vs_base": check.differences_zero(delta)}


def run_case(name: str, windows: int, pairs: int, exact: str, device: torch.device, seed: int = 0) -> dict:
    preset, overrides = CASES[name]
    cfg = C.override(C.preset(preset), {**overrides, "prune.windows": windows})
    ws = check.load_windows(cfg.data, cfg)
    torch.manual_seed(seed)
    weights = GPT(cfg.model).state_dict()
    stepper = check.Stepper(cfg.model, weights, None, cfg, torch.float32, device)
    first = next((w for w in ws if bool(w.loss_mask.any())), None)
    if first is not None:  # a step from the middle of training: AdamW's moments exist, as in a checkpoint
        stepper.step(check.mode_loss("base", check._move(first, device), exact))
        stepper = check.Stepper(cfg.model, weights, stepper.opt.state_dict(), cfg, torch.float32, device)
    rows, skipped = [], 0
    for wi, w in enumerate(ws):
        if not bool(w.loss_mask.any()):
            skipped += 1
            continue
        r = run_window(stepper, cfg, check._move(w, device), wi, pairs, exact, device)
        rows.append(r)
        print(f"  {name} window {wi}: N={r['positions']} live={r['live']} targets={r['targets']} "
              f"speed-up {r['speedup']:.3f} (FLOP ceiling {r['flops']['ceiling']:.3f}) memory {r['memory_ratio']:.3f} "
              f"max delta vs base {r['max_delta_vs_base']:.1e}", flush=True)
    speed = statistics.median(s for r in rows for s in r["speedups"])
    ceiling = statistics.median(r["flops"]["ceiling"] for r in rows)
    out = {"case": name, "preset": preset, "overrides": overrides, "exact": exact, "windows": rows,
           "windows_skipped": skipped, "pairs": pairs, "speedup": speed,
           "min_window_speedup": min(r["speedup"] for r in rows), "flop_ceiling": ceiling,
           "share_of_ceiling": (speed - 1) / (ceiling - 1) if ceiling > 1 else None,
           "speed_over_ceiling": speed / ceiling,
           "memory_ratio_max": max(r["memory_ratio"] for r in rows),
           "plan_le_measured_saving": all(r["flops"]["base"] - r["flops"]["prune_exact"] >=
                                          r["flops"]["plan_base"] - r["flops"]["plan_pruned"] for r in rows)}
    t = TARGETS.get(name, {})
    met = out["memory_ratio_max"] < 1.0
    if "min_speedup_every_window" in t:
        met &= out["min_window_speedup"] >= t["min_speedup_every_window"]
    if "min_speedup" in t:
        met &= speed >= t["min_speedup"] and out["speed_over_ceiling"] >= t["min_share_of_flop_ceiling"]
    out["targets"], out["targets_met"] = t, bool(met)
    return out


def table(rows: list[dict]) -> str:
    out = ["| case | exact | windows | speed-up (median) | slowest window | FLOP ceiling (measured) | speed-up / ceiling "
           "| memory ratio (max) | targets |", "|" + "---|" * 9]
    for r in rows:
        out.append(f"| {r['case']} | {r['exact']} | {len(r['windows'])} | {r['speedup']:.3f} | "
                   f"{r['min_window_speedup']:.3f} | {r['flop_ceiling']:.3f} | {r['speed_over_ceiling']:.2f} | "
                   f"{r['memory_ratio_max']:.3f} | {'met' if r['targets_met'] else 'MISSED'} {r['targets'] or ''} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="cpu-completion,cpu-random,big-random")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=15, help="interleaved pairs per window")
    ap.add_argument("--pairs-big", type=int, default=7, help="pairs per window of the big-vocabulary cases")
    ap.add_argument("--exact", default="arithmetic", choices=prune.EXACT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="")
    ap.add_argument("--note", default="figures are ratios of interleaved pairs",
                    help="what the results file says about the machine (quiet, shared...)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    t0 = time.time()
    rows = [run_case(name, args.windows, args.pairs_big if name.startswith("big") else args.pairs, args.exact, device)
            for name in args.cases.split(",")]
    print(table(rows))
    print(f"({time.time() - t0:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} threads)")
    if args.out:
        result = {"command": "python bench/prune.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "machine": {"platform": platform.platform(), "processor": platform.processor(),
                              "cores": os.cpu_count(), "threads": torch.get_num_threads(), "device": str(device),
                              "note": args.note},
                  "torch_version": torch.__version__, "seconds": round(time.time() - t0, 1),
                  "table": table(rows), "cases": rows}
        atomic_write_text(Path(args.out), json.dumps(result, indent=1) + "\n")
    return 0 if all(r["targets_met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
