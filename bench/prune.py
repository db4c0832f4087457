"""Benchmark of the pruned training step, every cost counted (a benchmark, not a test).

For each case: windows of held-out documents, a model with random weights and an AdamW that
holds the moments of one earlier step (as a checkpoint from mid-training does; a fresh AdamW
would time the one-off allocation of its state in every step), and interleaved pairs of steps
(base, prune_exact; the order alternates), each from the same starting state. The pruned step's time and memory hold all of pruning: the plan, its indices
and masks, and in bitwise mode the calibration (seamkit.pruning.step.mode_loss); nothing is set up ahead.

Per window and case:
- speed-up: the median over interleaved pairs of prune_exact words/s over base words/s;
- memory: peak live tensor bytes of one profiled step (parameters and optimizer state
  included), prune_exact over base;
- FLOPs: forward + backward of each mode counted with FlopCounterMode (what ran), the plan's
  FLOPs (prune.plan_flops), and the ceiling they imply: base FLOPs / pruned FLOPs measured (the
  pruned attention as it runs, every pair of its padded tiles). FlopCounterMode counts matmuls
  and attention only; the memory-bound work over rows x vocab
  (log-softmax, its backward, the zero-filled logit gradient) shrinks with the rows too, so at a
  large vocabulary the speed-up can pass the FLOP ceiling;
- where the time goes: one profiled (untimed) step per mode, self CPU seconds in the ops the
  FLOP counter counts (GEMMs, attention) and in all others; base over pruned for each;
- exactness: the largest difference of loss, gradients, update and state, prune_exact vs base;
- aten ops dispatched per step, base and prune_exact (plan included): each a kernel launch on an
  accelerator, where launches rather than FLOPs can bound a small step.

Precision (`--precision`, comma-separated, each a row of the table): `fp32`, float32 as stored
(TF32 off), and `bf16`, bf16 autocast as training runs on CUDA (TF32 for the float32 matmuls left
there). Timings, memory, the time split and the op counts run in the row's precision; the
exactness and the FLOPs are those of the float32 step.

Allocator conditions (`--allocator`, each in its own process): `default`, glibc as it comes,
which returns large freed buffers to the kernel, so every step page-faults its fresh (rows x
vocab) buffers again; `cached`, glibc told to keep freed memory (MALLOC_MMAP_THRESHOLD_ and
friends), the strongest base: at a Qwen vocabulary the base step's page faults cost about half
its time, and pruning saves them too.

Targets, for fp32 timings: cpu preset, completion and random:0.5, >= 1.00x on every window and a
median speed-up >= 85% of the measured-FLOP ceiling; Qwen vocabulary, dim 128, 4 blocks,
random:0.5, >= 1.6x and >= 85% of the measured-FLOP ceiling; peak memory lower than base
everywhere.

    python bench/prune.py --threads 1 --out bench/results/prune.json     # the three target cases
    python bench/prune.py --cases big-random --pairs 3 --exact bitwise
    python bench/prune.py --device cuda --cases seed-completion,seed-random --precision fp32,bf16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seamkit import config as C  # noqa: E402
from seamkit.flops import measured_flops  # noqa: E402
from seamkit.model import GPT  # noqa: E402
from seamkit.pruning import rules as prune  # noqa: E402
from seamkit.pruning.compare import DIFFERENCES, compare, differences_zero  # noqa: E402
from seamkit.pruning.step import MODES, Stepper, mode_loss  # noqa: E402
from seamkit.pruning.study import load_windows, to_device  # noqa: E402
from seamkit.pruning.timing import (  # noqa: E402
    PRECISIONS,
    GiB,
    dispatched_ops,
    precision,
    profiled_peak_bytes,
    timed_sample,
)
from seamkit.report import atomic_write_text, git_commit, machine  # noqa: E402

BIG = {"data.tokenizer": "qwen", "model.vocab": 151936, "model.n_blocks": 4}
CASES = {
    "cpu-completion": ("cpu", {"prune.policy": "completion"}),
    "cpu-random": ("cpu", {"prune.policy": "random:0.5"}),
    "big-completion": ("cpu", {"prune.policy": "completion", **BIG}),
    "big-random": ("cpu", {"prune.policy": "random:0.5", **BIG}),
    "seed-completion": ("seed", {"prune.policy": "completion"}),  # GPU only
    "seed-random": ("seed", {"prune.policy": "random:0.5"}),  # GPU only
}
TARGETS = {"cpu-completion": {"min_speedup_every_window": 1.0, "min_share_of_flop_ceiling": 0.85},
           "cpu-random": {"min_speedup_every_window": 1.0, "min_share_of_flop_ceiling": 0.85},
           "big-random": {"min_speedup": 1.6, "min_share_of_flop_ceiling": 0.85}}  # of fp32 timings


def max_delta(d: dict) -> float:
    return max(d[k] for k in DIFFERENCES)


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward")  # what FlopCounterMode counts


def time_split(stepper, fn, precision_name: str) -> dict:
    """One profiled step (untimed): seconds in the ops FlopCounterMode counts (GEMMs, attention)
    and in everything else (softmax, elementwise, fills, copies, the optimizer), self CPU time."""
    from torch.profiler import ProfilerActivity, profile
    stepper.reset()
    with precision(precision_name, torch.device("cpu")), profile(activities=[ProfilerActivity.CPU]) as prof:
        stepper.run(fn)
    ops = prof.key_averages()
    gemm = sum(e.self_cpu_time_total for e in ops if e.key in GEMM_OPS) / 1e6
    return {"gemm_s": gemm, "other_s": sum(e.self_cpu_time_total for e in ops) / 1e6 - gemm,
            "top_other": sorted(((e.key, round(e.self_cpu_time_total / 1e6, 4)) for e in ops if e.key not in GEMM_OPS),
                                key=lambda kv: -kv[1])[:6]}


def run_window(stepper, cfg, w, wi: int, pairs: int, exact: str, device, prec: str) -> dict:
    fns = {m: mode_loss(m, w, exact) for m in MODES}
    got = {m: stepper.step(fns[m]) for m in MODES}  # warm-up, and the exactness of this window
    delta = compare(got["base"], got["prune_exact"])
    flops = {}
    for m in MODES:
        stepper.reset()
        flops[m] = measured_flops(lambda: fns[m](stepper.model))
    planned = prune.plan_flops(cfg.model, prune.plan(w))
    ops = {m: dispatched_ops(stepper, fns[m], prec) for m in MODES}
    peak = {m: (timed_sample(stepper, fns[m], w.words, device, prec)["allocated_GiB"] * GiB
                if device.type == "cuda" else profiled_peak_bytes(stepper, fns[m], prec)) for m in MODES}
    samples = {m: [] for m in MODES}
    for k in range(pairs):
        order = MODES if k % 2 == 0 else MODES[::-1]
        for m in order:
            samples[m].append(timed_sample(stepper, fns[m], w.words, device, prec)["seconds"])
    # profiled after the timed pairs, so a caching allocator's heap has grown as in the timed steps
    split = {m: time_split(stepper, fns[m], prec) for m in MODES} if device.type == "cpu" else None
    speedups = [b / p for b, p in zip(samples["base"], samples["prune_exact"])]
    p = prune.plan(w)
    return {"window": wi, "positions": p.positions, "live": len(p.live), "targets": len(p.target),
            "words": int(w.words), "precision": prec, "seconds": samples, "speedup": statistics.median(speedups),
            "ops": ops, "ops_ratio": ops["prune_exact"] / ops["base"],
            "speedups": speedups, "peak_bytes": peak, "memory_ratio": peak["prune_exact"] / peak["base"],
            "flops": {"base": flops["base"], "prune_exact": flops["prune_exact"], "plan_base": planned["base"],
                      "plan_pruned": planned["pruned"], "ceiling": flops["base"] / flops["prune_exact"],
                      "plan_ceiling": planned["base"] / planned["pruned"]},
            "time_split": split, "gemm_time_ratio": split and split["base"]["gemm_s"] / split["prune_exact"]["gemm_s"],
            "other_time_ratio": split and split["base"]["other_s"] / split["prune_exact"]["other_s"],
            "max_delta_vs_base": max_delta(delta), "bitwise_vs_base": differences_zero(delta)}


def run_case(name: str, windows: int, pairs: int, exact: str, device: torch.device, prec: str, seed: int = 0) -> dict:
    preset, overrides = CASES[name]
    cfg = C.override(C.preset(preset), {**overrides, "prune.windows": windows})
    ws = load_windows(cfg.data, cfg)
    torch.manual_seed(seed)
    weights = GPT(cfg.model).state_dict()
    stepper = Stepper(cfg.model, weights, None, cfg, torch.float32, device)
    first = next((w for w in ws if bool(w.loss_mask.any())), None)
    if first is not None:  # a step from the middle of training: AdamW's moments exist, as in a checkpoint
        stepper.step(mode_loss("base", to_device(first, device), exact))
        stepper = Stepper(cfg.model, weights, stepper.opt.state_dict(), cfg, torch.float32, device)
    rows, skipped = [], 0
    for wi, w in enumerate(ws):
        if not bool(w.loss_mask.any()):
            skipped += 1
            continue
        r = run_window(stepper, cfg, to_device(w, device), wi, pairs, exact, device, prec)
        rows.append(r)
        print(f"  {name} window {wi}: N={r['positions']} live={r['live']} targets={r['targets']} "
              f"speed-up {r['speedup']:.3f} (FLOP ceiling {r['flops']['ceiling']:.3f}) memory {r['memory_ratio']:.3f} "
              f"max delta vs base {r['max_delta_vs_base']:.1e}, ops {r['ops']['base']} -> {r['ops']['prune_exact']} "
              f"({prec})", flush=True)
        if r["time_split"]:
            b, q = r["time_split"]["base"], r["time_split"]["prune_exact"]
            print(f"    profiled step: GEMMs+attention {b['gemm_s']:.3f} -> {q['gemm_s']:.3f} s "
                  f"({r['gemm_time_ratio']:.2f}x), other ops {b['other_s']:.3f} -> {q['other_s']:.3f} s "
                  f"({r['other_time_ratio']:.2f}x); base's largest other: {b['top_other'][:3]}", flush=True)
    speed = statistics.median(s for r in rows for s in r["speedups"])
    ceiling = statistics.median(r["flops"]["ceiling"] for r in rows)
    out = {"case": name, "preset": preset, "overrides": overrides, "exact": exact, "precision": prec, "windows": rows,
           "windows_skipped": skipped, "pairs": pairs, "speedup": speed,
           "min_window_speedup": min(r["speedup"] for r in rows), "flop_ceiling": ceiling,
           "share_of_ceiling": (speed - 1) / (ceiling - 1) if ceiling > 1 else None,
           "speed_over_ceiling": speed / ceiling,
           "memory_ratio_max": max(r["memory_ratio"] for r in rows),
           "ops": {m: statistics.median(r["ops"][m] for r in rows) for m in MODES},
           "ops_ratio": statistics.median(r["ops_ratio"] for r in rows),
           "gemm_time_ratio": rows[0]["time_split"] and statistics.median(r["gemm_time_ratio"] for r in rows),
           "other_time_ratio": rows[0]["time_split"] and statistics.median(r["other_time_ratio"] for r in rows),
           "plan_le_measured_saving": all(r["flops"]["base"] - r["flops"]["prune_exact"] >=
                                          r["flops"]["plan_base"] - r["flops"]["plan_pruned"] for r in rows)}
    t = TARGETS.get(name, {}) if prec == "fp32" else {}
    met = out["memory_ratio_max"] < 1.0
    if "min_speedup_every_window" in t:
        met &= out["min_window_speedup"] >= t["min_speedup_every_window"]
    if "min_speedup" in t:
        met &= speed >= t["min_speedup"]
    if "min_share_of_flop_ceiling" in t:
        met &= out["speed_over_ceiling"] >= t["min_share_of_flop_ceiling"]
    out["targets"], out["targets_met"] = t, bool(met)
    return out


def table(rows: list[dict]) -> str:
    out = ["| case | exact | precision | windows | speed-up (median) | slowest window | FLOP ceiling (measured) "
           "| speed-up / ceiling | GEMM time ratio | other-op time ratio | ops per step, base -> pruned "
           "| memory ratio (max) | targets |", "|" + "---|" * 13]
    for r in rows:
        split = (f"{r['gemm_time_ratio']:.2f} | {r['other_time_ratio']:.2f}" if r.get("gemm_time_ratio") else "- | -")
        ops = f"{r['ops']['base']:.0f} -> {r['ops']['prune_exact']:.0f} ({r['ops_ratio']:.2f}x)"
        out.append(f"| {r['case']} | {r['exact']} | {r['precision']} | {len(r['windows'])} | {r['speedup']:.3f} | "
                   f"{r['min_window_speedup']:.3f} | {r['flop_ceiling']:.3f} | {r['speed_over_ceiling']:.2f} | "
                   f"{split} | {ops} | {r['memory_ratio_max']:.3f} | {'met' if r['targets_met'] else 'MISSED'} "
                   f"{r['targets'] or ''} |")
    return "\n".join(out)


# glibc keeps freed memory mapped (no munmap, no page faults on the next step's fresh buffers);
# read by glibc at process start, so a condition runs in its own process
ALLOCATORS = {"default": {}, "cached": {"MALLOC_MMAP_THRESHOLD_": str(1 << 34), "MALLOC_TRIM_THRESHOLD_": str(1 << 34),
                                        "MALLOC_TOP_PAD_": str(1 << 30)}}


def run_allocators(names: list[str], argv: list[str]) -> dict:
    """The bench once per allocator condition, each in a fresh process with its environment."""
    out = {}
    for name in names:
        with tempfile.TemporaryDirectory() as d:
            env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
            cmd = [sys.executable, __file__, *argv, "--allocator", name, "--out", str(Path(d) / "r.json")]
            rc = subprocess.run(cmd, env={**env, **ALLOCATORS[name]}).returncode
            path = Path(d) / "r.json"
            if not path.exists():
                raise SystemExit(f"bench/prune.py --allocator {name} failed (exit {rc})")
            out[name] = json.loads(path.read_text())
            out[name]["command"] = out[name]["command"].replace(d, "DIR")  # a temporary folder names no machine
    return out


def strip_args(argv: list[str], drop: tuple) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in drop:
            skip = True
        elif not any(a.startswith(d + "=") for d in drop):
            out.append(a)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="cpu-completion,cpu-random,big-random")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=15, help="interleaved pairs per window")
    ap.add_argument("--pairs-big", type=int, default=7, help="pairs per window of the big-vocabulary cases")
    ap.add_argument("--exact", default="arithmetic", choices=prune.EXACT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32",
                    help=f"comma-separated precisions of the timed steps, each its own rows: {', '.join(PRECISIONS)}")
    ap.add_argument("--out", default="")
    ap.add_argument("--note", default="figures are ratios of interleaved pairs",
                    help="what the results file says about the machine (quiet, shared...)")
    ap.add_argument("--allocator", default="default,cached",
                    help="comma-separated glibc allocator conditions (ALLOCATORS), each in its own process")
    args = ap.parse_args(argv)
    argv = list(argv if argv is not None else sys.argv[1:])
    names = args.allocator.split(",")
    if len(names) > 1:
        t0 = time.time()
        results = run_allocators(names, strip_args(argv, ("--allocator", "--out")))
        for name, r in results.items():
            print(f"allocator {name} ({ALLOCATORS[name] or 'glibc defaults'}):\n{r['table']}")
        if args.out:
            first = results[names[0]]
            result = {"command": shlex.join(["python", "bench/prune.py", *argv]), "date": first["date"],
                      "machine": first["machine"], "torch_version": first["torch_version"],
                      "git_commit": first["git_commit"],
                      "seconds": round(time.time() - t0, 1), "allocators": ALLOCATORS,
                      "targets_met": all(r["targets_met"] for r in results.values()),
                      "table": "\n\n".join(f"allocator {n}:\n{r['table']}" for n, r in results.items()),
                      "conditions": results}
            atomic_write_text(Path(args.out), json.dumps(result, indent=1) + "\n")
        return 0 if all(r["targets_met"] for r in results.values()) else 1
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    t0 = time.time()
    precisions = args.precision.split(",")
    if not set(precisions) <= set(PRECISIONS):
        ap.error(f"--precision: choose from {', '.join(PRECISIONS)}")
    rows = [run_case(name, args.windows, args.pairs_big if name.startswith("big") else args.pairs, args.exact, device,
                     prec) for name in args.cases.split(",") for prec in precisions]
    print(table(rows))
    print(f"({time.time() - t0:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} threads)")
    if args.out:
        result = {"command": shlex.join(["python", "bench/prune.py", *argv]), "allocator": names[0],
                  "allocator_env": ALLOCATORS[names[0]], "targets_met": all(r["targets_met"] for r in rows),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "machine": {**machine(), "device": str(device), "note": args.note},
                  "torch_version": torch.__version__, "git_commit": git_commit(), "seconds": round(time.time() - t0, 1),
                  "table": table(rows), "cases": rows}
        atomic_write_text(Path(args.out), json.dumps(result, indent=1) + "\n")
    return 0 if all(r["targets_met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
