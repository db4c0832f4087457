"""One training step before and after a change, in one run: aten ops dispatched, peak memory, speed.

Each side is a source tree (`--before`: a commit, checked out into a temporary git worktree;
after: this checkout) measured in processes of its own that import only that tree's seamkit,
through the calls both trees share (a segment chain's step and loss, the pruning study's step).

Per preset (`--presets`, default cpu and seed; the seed preset is one step on the CPU):
- ops: aten ops dispatched in one step after a warm-up one (a TorchDispatchMode count), for the
  e2e arm, the local arm (aux_head) and, on the pruning study's first window, the unpruned and
  the pruned step (float32, `--exact` arithmetic);
- memory: the peak of live tensor bytes during the step (the profiler's allocation events, on top
  of the parameters and optimizer state already there), and of the LM loss alone: the last
  segment's loss on a (batch, seq, dim) input and its backward, what the head's logits cost; and,
  where the tree has it, the local arm with one backward over every segment's loss
  (`seams.local_backward=once`).
At the cpu preset, speed, interleaved (`--rounds` rounds, the sides alternating, each round a
process per side): e2e and local tokens/s over `--steps` steps, e2e's MFU over one matmul peak
measured here; the pruned step's speed-up over the unpruned one (the median of interleaved
pairs, every cost of pruning inside) beside its FLOP ceiling (unpruned FLOPs over pruned FLOPs,
counted).

Targets: the seed preset's loss peak at most 1/4 of before; the pruned step at most 1.25x the
unpruned step's ops; e2e MFU at the cpu preset at least before's (tokens/s after over before,
paired round by round: the median, beside its range); the pruned step at 0.85 of its FLOP
ceiling at least (the ceiling of the FLOPs it runs, padding included; beside it the share of the
rules' unpadded ceiling, before's).

    python bench/step.py --before 74b92df --out bench/results/step.json
    python bench/step.py --before HEAD~1 --presets cpu --rounds 2     # a quick look
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("e2e", "local")


# ----------------------------------------------------------------------------- inside one tree

# Both trees are measured by this file's own counters, not by either tree's seamkit (the commit
# before a change may not have them): torch's dispatch mode and the profiler's memory events.

def _ops(fn) -> int:
    """aten ops dispatched during fn()."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.n += 1
            return func(*args, **(kwargs or {}))
    with Counter():
        fn()
    return Counter.n


def _peak_bytes(fn) -> int:
    """Peak live tensor bytes allocated during fn() (the profiler's CPU allocation events)."""
    import torch
    from torch._C._profiler import _EventType
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
            events.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


class _Counted:
    """Stands in for a corpus where only its token counts are read (the aux heads' class map)."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def token_counts(self, split: str, vocab: int):
        import numpy as np
        return np.arange(vocab, 0, -1)


def _chain(cfg, arm: str):
    import torch
    from seamkit.seams.chain import Chain
    from seamkit.seams.placement import arm_segments
    segs = arm_segments(cfg, arm)
    return Chain(cfg, arm, segs, range(len(segs)), torch.device("cpu"), _Counted(cfg.model.vocab))


def _batch(cfg, seed: int = 0):
    import torch
    g = torch.Generator().manual_seed(seed)
    m, B = cfg.model, cfg.data.batch
    return (torch.randint(0, m.vocab, (B, m.seq), generator=g), torch.randint(0, m.vocab, (B, m.seq), generator=g))


def _arm_figures(cfg, arm: str) -> dict:
    import torch
    ch = _chain(cfg, arm)
    x, y = _batch(cfg)
    ch.step(x, y, cfg.train.lr)  # warm-up: the optimizer's state exists, as mid-training
    ops = _ops(lambda: ch.step(x, y, cfg.train.lr))
    step_peak = _peak_bytes(lambda: ch.step(x, y, cfg.train.lr))
    for p in ch.model.parameters():
        p.grad = None
    B, T, C = cfg.data.batch, cfg.model.seq, cfg.model.dim
    h = torch.randn(B, T, C).requires_grad_()
    loss_peak = _peak_bytes(lambda: ch.loss(ch.last, h, y).backward())
    return {"ops": ops, "step_peak_bytes": step_peak, "loss_peak_bytes": loss_peak}


def _pruned_figures(cfg, pairs: int, timed: bool) -> dict:
    import torch
    from seamkit.flops import measured_flops
    from seamkit.model import GPT
    from seamkit.pruning.step import Stepper, mode_loss
    from seamkit.pruning.study import load_windows
    w = next(w for w in load_windows(cfg.data, cfg) if bool(w.loss_mask.any()))
    torch.manual_seed(0)
    stepper = Stepper(cfg.model, GPT(cfg.model).state_dict(), None, cfg, torch.float32, torch.device("cpu"))
    fns = {m: mode_loss(m, w, "arithmetic") for m in ("base", "prune_exact")}
    stepper.step(fns["base"])  # warm-up
    out = {}
    for m, fn in fns.items():
        stepper.reset()
        out[f"{m}_ops"] = _ops(lambda: stepper.run(fn))
        stepper.reset()
        out[f"{m}_flops"] = measured_flops(lambda: fn(stepper.model))
        stepper.reset()
        out[f"{m}_peak_bytes"] = _peak_bytes(lambda: stepper.run(fn))
    if timed:
        secs = {m: [] for m in fns}
        for k in range(pairs):
            for m in (("base", "prune_exact") if k % 2 == 0 else ("prune_exact", "base")):
                stepper.reset()
                t = time.perf_counter()
                stepper.run(fns[m])
                secs[m].append(time.perf_counter() - t)
        out["speedup"] = statistics.median(b / p for b, p in zip(secs["base"], secs["prune_exact"]))
    out["flop_ceiling"] = out["base_flops"] / out["prune_exact_flops"]
    return out


def _speed(cfg, steps: int) -> dict:
    from seamkit.flops import count_flops
    out = {}
    for arm in ARMS:
        ch = _chain(cfg, arm)
        x, y = _batch(cfg)
        for _ in range(3):
            ch.step(x, y, cfg.train.lr)
        t = time.perf_counter()
        for _ in range(steps):
            ch.step(x, y, cfg.train.lr)
        out[f"{arm}_tokens_per_s"] = steps * x.numel() / (time.perf_counter() - t)
        if arm == "e2e":
            out["e2e_flops_per_token"] = count_flops(lambda: ch.step(x, y, cfg.train.lr)).get_total_flops() / x.numel()
    return out


def worker(args) -> dict:
    sys.path.insert(0, args.tree)
    import torch
    torch.set_num_threads(args.threads)
    from seamkit import config as C
    cfg = C.override(C.preset(args.preset), {"train.device": "cpu", "prune.windows": 1})
    if args.what == "count":
        out = {}
        for arm in ARMS:
            out[arm] = _arm_figures(cfg, arm)
            gc.collect()  # a chain refers to itself (its segment wrappers): free it before the next one's
        if hasattr(cfg.seams, "local_backward"):  # one backward over every local loss: what it costs in memory
            out["local_once"] = _arm_figures(C.override(cfg, {"seams.local_backward": "once"}), "local")
            gc.collect()
        out["pruned"] = _pruned_figures(cfg, 0, timed=False)
        return out
    return {**_speed(cfg, args.steps), "pruned": _pruned_figures(cfg, args.pairs, timed=True)}


# ----------------------------------------------------------------------------- the run

def _run(tree: str, what: str, preset: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--tree", tree, "--what", what, "--preset", preset,
           "--threads", str(args.threads), "--steps", str(args.steps), "--pairs", str(args.pairs)]
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"bench/step.py: {what} at {preset} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _paired(speed: dict, get) -> dict:
    """after / before of one figure, round by round (each round ran both sides back to back)."""
    r = [get(a) / get(b) for b, a in zip(speed["before"], speed["after"])]
    return {"median": statistics.median(r), "min": min(r), "max": max(r), "rounds": r}


def _summary(before: dict, after: dict, speed: dict, peak: float) -> dict:
    med = statistics.median
    s = {}
    for side in ("before", "after"):
        runs = speed[side]
        e2e = [r["e2e_tokens_per_s"] for r in runs]
        pr = [r["pruned"] for r in runs]
        s[side] = {"e2e_tokens_per_s": med(e2e), "local_tokens_per_s": med(r["local_tokens_per_s"] for r in runs),
                   "e2e_mfu": med(e2e) * runs[0]["e2e_flops_per_token"] / peak,
                   "pruned_speedup": med(p["speedup"] for p in pr), "pruned_flop_ceiling": pr[0]["flop_ceiling"],
                   "pruned_share_of_ceiling": med(p["speedup"] for p in pr) / pr[0]["flop_ceiling"]}
    # the pruned step's speed-up over the ceiling of the rules themselves (the unpadded plan: before's)
    s["after"]["pruned_share_of_unpadded_ceiling"] = s["after"]["pruned_speedup"] / s["before"]["pruned_flop_ceiling"]
    s["paired_after_over_before"] = {
        "e2e_tokens_per_s": _paired(speed, lambda r: r["e2e_tokens_per_s"]),
        "local_tokens_per_s": _paired(speed, lambda r: r["local_tokens_per_s"]),
        "pruned_speedup": _paired(speed, lambda r: r["pruned"]["speedup"])}
    targets = {}
    if "seed" in after:
        ratio = after["seed"]["e2e"]["loss_peak_bytes"] / before["seed"]["e2e"]["loss_peak_bytes"]
        targets["seed_loss_peak_after_over_before"] = {"value": ratio, "target": "<= 0.25", "met": ratio <= 0.25}
    for preset in after:
        p = after[preset]["pruned"]
        r = p["prune_exact_ops"] / p["base_ops"]
        targets[f"{preset}_pruned_ops_over_base"] = {"value": r, "target": "<= 1.25", "met": r <= 1.25}
    # the same model's FLOPs a token on both sides: MFU after / before is their tokens/s, paired by round
    mfu = s["paired_after_over_before"]["e2e_tokens_per_s"]
    targets["cpu_e2e_mfu_after_over_before"] = {"value": mfu["median"], "spread": [mfu["min"], mfu["max"]],
                                                "target": ">= 1 (median of paired rounds)", "met": mfu["median"] >= 1.0}
    share = s["after"]["pruned_share_of_ceiling"]
    targets["cpu_pruned_share_of_flop_ceiling"] = {"value": share, "target": ">= 0.85", "met": share >= 0.85}
    return {"speed": s, "targets": targets}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="74b92df", help="the commit the change is measured against")
    ap.add_argument("--presets", default="cpu,seed")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved speed rounds at the cpu preset")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per arm and round")
    ap.add_argument("--pairs", type=int, default=9, help="interleaved pruned/unpruned pairs per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=str(ROOT), help=argparse.SUPPRESS)
    ap.add_argument("--what", default="count", help=argparse.SUPPRESS)
    ap.add_argument("--preset", default="cpu", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    sys.path.insert(0, str(ROOT))
    import torch
    from tqdm import tqdm

    from seamkit.flops import matmul_peak
    from seamkit.report import atomic_write_text, provenance
    from seamkit.seams.calibration import fingerprint
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        old = str(Path(d) / "before")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", old, args.before], check=True)
        try:
            commit = subprocess.run(["git", "-C", old, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
            trees = {"before": old, "after": str(ROOT)}
            presets = args.presets.split(",")
            jobs = [(side, "count", p) for p in presets for side in trees]
            jobs += [(side, "time", "cpu") for r in range(args.rounds)
                     for side in (("before", "after") if r % 2 == 0 else ("after", "before"))]
            counts, speed = {s: {} for s in trees}, {s: [] for s in trees}
            for side, what, preset in tqdm(jobs, desc="bench/step"):
                got = _run(trees[side], what, preset, args)
                if what == "count":
                    counts[side][preset] = got
                else:
                    speed[side].append(got)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", old], check=False)
    torch.set_num_threads(args.threads)
    peak = matmul_peak(torch.device("cpu"))
    result = {"command": shlex.join(["python", "bench/step.py", *(argv if argv is not None else sys.argv[1:])]),
              "before_commit": commit, "seconds": round(time.time() - t0, 1), "fingerprint_flops": fingerprint(),
              "matmul_peak": peak, **provenance(), "counts": counts, "speed_runs": speed,
              **_summary(counts["before"], counts["after"], speed, peak["flops_per_s"])}
    for name, t in result["targets"].items():
        print(f"{name}: {t['value']} (target {t['target']}): {'met' if t['met'] else 'NOT met'}")
    for side in ("before", "after"):
        s = result["speed"][side]
        print(f"{side}: e2e {s['e2e_tokens_per_s']:,.0f} tok/s (MFU {s['e2e_mfu']:.1%}), local "
              f"{s['local_tokens_per_s']:,.0f} tok/s, pruned {s['pruned_speedup']:.2f}x of ceiling "
              f"{s['pruned_flop_ceiling']:.2f}x")
    for name, r in result["speed"]["paired_after_over_before"].items():
        print(f"after/before {name}: median {r['median']:.3f} (rounds {r['min']:.3f}-{r['max']:.3f})")
    for preset in counts["after"]:
        for arm in ARMS:
            b, a = counts["before"][preset][arm], counts["after"][preset][arm]
            print(f"{preset} {arm}: ops {b['ops']} -> {a['ops']}, step peak {b['step_peak_bytes'] / 2**20:.0f} -> "
                  f"{a['step_peak_bytes'] / 2**20:.0f} MiB, loss peak {b['loss_peak_bytes'] / 2**20:.1f} -> "
                  f"{a['loss_peak_bytes'] / 2**20:.1f} MiB")
        if "local_once" in counts["after"][preset]:
            a = counts["after"][preset]["local_once"]
            print(f"{preset} local, one backward: ops {a['ops']}, step peak {a['step_peak_bytes'] / 2**20:.0f} MiB")
        b, a = counts["before"][preset]["pruned"], counts["after"][preset]["pruned"]
        print(f"{preset} pruned/base ops: {b['prune_exact_ops']}/{b['base_ops']} -> {a['prune_exact_ops']}/{a['base_ops']}")
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=1) + "\n")
    return 0 if all(t["met"] for t in result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
