"""Benchmark of the exact pruned training step (a benchmark, not a test).

For each case: windows of held-out documents, a model with random weights and a fresh
AdamW, and interleaved pairs of steps (base, prune_exact, the order alternating), each from
the same starting state. Reported per case, as medians over all pairs of all windows:

- speed-up: prune_exact words/s over base words/s of the same pair;
- memory: peak live tensor bytes of one profiled step (parameters and optimizer state
  included), prune_exact over base;
- bound (rules): the FLOP ratio base / pruned if every FLOP the rules make unnecessary were
  skipped, attention as the dense kernel runs it; bound (exact): the same for the FLOPs this
  implementation runs to stay bit exact (attention backward over all N rows; forward over
  the key blocks each query's document spans, see prune.attention_calls; weight-gradient
  GEMMs over all N rows where their token blocks could not be calibrated). GEMM and
  attention FLOPs only; the softmax over the vocabulary and other memory-bound work scale
  like the LM head's rows and are not counted.
- target: where the larger bound allows a gain of 20% or more, speed-up - 1 >= 0.7 (bound - 1).

    python bench/prune.py                      # the three issue cases, 2 windows, 5 pairs each
    python bench/prune.py --cases big-random --pairs 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seamkit import check, prune  # noqa: E402
from seamkit import config as C  # noqa: E402
from seamkit.model import GPT  # noqa: E402

CASES = {
    "cpu-completion": ("cpu", {"prune.policy": "completion"}),
    "cpu-random": ("cpu", {"prune.policy": "random:0.5"}),
    "big-completion": ("cpu", {"prune.policy": "completion", "data.tokenizer": "qwen", "model.vocab": 151936,
                               "model.n_blocks": 4}),
    "big-random": ("cpu", {"prune.policy": "random:0.5", "data.tokenizer": "qwen", "model.vocab": 151936,
                           "model.n_blocks": 4}),
    "seed-completion": ("seed", {"prune.policy": "completion"}),  # GPU only
    "seed-random": ("seed", {"prune.policy": "random:0.5"}),  # GPU only
}


def flops(cfg: C.RunConfig, p: prune.Plan, kind: str) -> float:
    """GEMM and attention FLOPs of one training step (forward + backward).

    kind: "base" (the unpruned step), "rules" (every FLOP the rules leave), "exact" (what
    seamkit.prune runs). A linear layer costs 2*rows*in*out forward and twice that backward;
    the dense attention kernel 4*q*k*dim forward and 10*q*k*dim backward (recomputed scores,
    dV, dP, dQ, dK).
    """
    m = cfg.model
    D, Mh, V, L = m.dim, m.mlp_mult * m.dim, m.vocab, m.n_blocks
    N, n, t = p.positions, len(p.live), len(p.target)
    block_w = 3 * D * D + D * D + Mh * D + D * Mh

    def lin(rows_fwd, rows_wgrad, width):
        return 2 * width * (2 * rows_fwd + rows_wgrad)  # forward + input grad, weight grad

    def blocked(name, out_f, in_f):
        return p.blocks.get((name, out_f, in_f)) is not None

    if kind == "base":
        return L * (lin(N, N, block_w) + 14 * N * N * D) + lin(N, N, D * V)
    if kind == "rules":
        first = (L - 1) * (lin(n, n, block_w) + 14 * n * n * D)
        last = lin(n, n, 2 * D * D) + lin(t, t, D * D + D * D + 2 * Mh * D) + 14 * t * n * D
        return first + last + lin(t, t, D * V)
    wl = {k: (n if blocked("live", *k) else N) for k in [(3 * D, D), (D, D), (Mh, D), (D, Mh)]}
    wt = {k: (t if blocked("target", *k) else N) for k in [(D, D), (Mh, D), (D, Mh), (V, D)]}

    def attn_fwd(name, rows):  # the calls' query rows over their key ranges, or every row over every key
        calls = p.blocks.get(("attention", name))
        return 4 * D * (sum(len(r) * (k1 - k0) for r, k0, k1 in calls) if calls is not None else N * N)

    first = (L - 1) * (sum(lin(n, wl[(o, i)], o * i) for o, i in wl) + attn_fwd("live", p.live) + 10 * N * N * D)
    last = (lin(n, wl[(3 * D, D)], 2 * D * D) + lin(t, wl[(3 * D, D)], D * D) + lin(t, wt[(D, D)], D * D)
            + lin(t, wt[(Mh, D)], Mh * D) + lin(t, wt[(D, Mh)], D * Mh) + attn_fwd("target", p.target)
            + 10 * N * N * D)
    return first + last + lin(t, wt[(V, D)], D * V)


def run_case(name: str, windows: int, pairs: int, device: torch.device, seed: int = 0) -> dict:
    preset, overrides = CASES[name]
    cfg = C.override(C.preset(preset), {**overrides, "prune.windows": windows})
    data_cfg = cfg.data
    ws = check.load_windows(data_cfg, cfg)
    torch.manual_seed(seed)
    model = GPT(cfg.model)
    stepper = check.Stepper(cfg.model, model.state_dict(), None, cfg, torch.float32, device)
    del model
    speedups, mem_ratios, bounds_rules, bounds_exact, wps = [], [], [], [], {m: [] for m in check.MODES}
    exact = True
    for wi, w in enumerate(ws):
        w = check._move(w, device)
        p = prune.calibrate(stepper.model, prune.plan(w))
        fns = {m: check.mode_loss(m, w, p) for m in check.MODES}
        got = {m: stepper.step(fns[m]) for m in check.MODES}  # warm-up, and the exactness of this window
        d = check.compare(got["base"], got["prune_exact"])
        exact &= check.differences_zero(d)
        peak = {}
        for m in check.MODES:
            if device.type == "cuda":
                peak[m] = check.timed_sample(stepper, fns[m], w.words, device)["allocated_GiB"]
            else:
                peak[m] = check.profiled_peak_bytes(stepper, fns[m])
        mem_ratios.append(peak["prune_exact"] / peak["base"])
        f_base = flops(cfg, p, "base")
        bounds_rules.append(f_base / flops(cfg, p, "rules"))
        bounds_exact.append(f_base / flops(cfg, p, "exact"))
        for k in range(pairs):
            order = check.MODES if k % 2 == 0 else check.MODES[::-1]
            s = {m: check.timed_sample(stepper, fns[m], w.words, device) for m in order}
            for m in check.MODES:
                wps[m].append(s[m]["words_per_second"])
            speedups.append(s["prune_exact"]["words_per_second"] / s["base"]["words_per_second"])
        print(f"  {name} window {wi}: N={p.positions} live={len(p.live)} targets={len(p.target)} "
              f"speed-up {statistics.median(speedups[-pairs:]):.3f} memory {mem_ratios[-1]:.3f} "
              f"bound {bounds_rules[-1]:.3f}/{bounds_exact[-1]:.3f} exact={check.differences_zero(d)}", flush=True)
    speed = statistics.median(speedups)
    bound = max(statistics.median(bounds_rules), statistics.median(bounds_exact))
    target = None if bound < 1.2 else speed - 1 >= 0.7 * (bound - 1)
    return {"case": name, "windows": len(ws), "pairs": pairs, "speedup": speed,
            "base_wps": statistics.median(wps["base"]), "prune_wps": statistics.median(wps["prune_exact"]),
            "memory_ratio": statistics.median(mem_ratios), "bound_rules": statistics.median(bounds_rules),
            "bound_exact": statistics.median(bounds_exact), "target_70pct": target,
            "bitwise_vs_base": exact, "threads": torch.get_num_threads(), "device": str(device)}


def table(rows: list[dict]) -> str:
    out = ["| case | base words/s | prune words/s | speed-up | bound (rules) | bound (exact) | 70% target | "
           "memory ratio | bitwise vs base |", "|" + "---|" * 9]
    for r in rows:
        tgt = "n/a (<1.2)" if r["target_70pct"] is None else ("met" if r["target_70pct"] else "MISSED")
        out.append(f"| {r['case']} | {r['base_wps']:.0f} | {r['prune_wps']:.0f} | {r['speedup']:.3f} | "
                   f"{r['bound_rules']:.3f} | {r['bound_exact']:.3f} | {tgt} | {r['memory_ratio']:.3f} | "
                   f"{r['bitwise_vs_base']} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="cpu-completion,cpu-random,big-completion,big-random")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    t0 = time.time()
    for name in args.cases.split(","):
        rows.append(run_case(name, args.windows, args.pairs, device))
    print(table(rows))
    print(f"({time.time() - t0:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} threads)")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
