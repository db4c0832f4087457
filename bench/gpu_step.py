"""The parts of the prepared GPU check (bench/gpu_check.sh runs each in a process of its own,
under a time limit, and each writes its JSON as soon as it is done, so a cut-off run keeps the
parts before it). On the CPU every part runs too, at a small preset: the dry run that keeps the
script from rotting (tests/test_gpu_check.py).

- peaks: the best bf16 GEMM rate (float32 on the CPU) of a (tokens x dim) by (dim x N) product
  at N = 4096, 8192, 8193, 8256 (an aux head's 8,193 classes against the 64-aligned 8,256), and
  the square matmul peak the study's MFU divides by (`seamkit.flops.matmul_peak`).
- e2e: the e2e arm through the budget loop (`run_arm`, single placement), eager and compiled:
  ms a step, tokens/s, MFU (FLOPs per token counted on one training step, over the measured
  peak), peak VRAM, kernels per step (the profiler's device kernels in one step; aten ops on the
  CPU), the loop's host waits per step (`torch.cuda.set_sync_debug_mode`), the compile seconds;
  and the LM loss alone, the plain logits path against the chunked one: ms and peak memory.
- local: the local arm (aux_head) at 8,193 classes (padded to 8,256 by the loss), the same
  unpadded (the loss's alignment off), 8,256 and 1,024 classes; and `seams.local_backward=once`.
- pruned: the unpruned and the pruned step from the pruning study (its windows, random weights
  with one step of AdamW state) in float32, TF32 and bf16 autocast: ms, speed-up, FLOP ceiling,
  kernels per step.
- determinism: two e2e runs of `--steps` steps, compared weight by weight (run once with
  `--set train.deterministic=true`, once without: each in a fresh process, as cuBLAS reads its
  workspace setting once).

    python bench/gpu_step.py e2e --preset seed --out reports/gpu_check/e2e.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seamkit import accel  # noqa: E402
from seamkit import config as C  # noqa: E402
from seamkit import losses  # noqa: E402
from seamkit.data.load import load_corpus  # noqa: E402
from seamkit.flops import matmul_peak, measured_flops, mfu, spec_peak  # noqa: E402
from seamkit.model import GPT, autocast, lm_loss  # noqa: E402
from seamkit.report import atomic_write_text, provenance  # noqa: E402
from seamkit.seams.arm import ArmSpec, run_arm  # noqa: E402
from seamkit.seams.chain import Chain  # noqa: E402
from seamkit.seams.per_token import arm_costs  # noqa: E402
from seamkit.seams.placement import arm_segments  # noqa: E402

PARTS = ("peaks", "e2e", "local", "pruned", "determinism")


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int = 5) -> float:
    """Median seconds of fn() over `repeats` calls after one untimed."""
    fn()
    out = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def kernels(fn, device) -> int:
    """Device kernels one fn() launches (CUDA), or aten ops it dispatches (CPU)."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        sync(device)
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::"))


def peak_memory(fn, device) -> int | None:
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - before


@contextlib.contextmanager
def counted_syncs(device, into: dict):
    """Host waits on the device while inside (CUDA's sync debug mode warns on each)."""
    if device.type != "cuda":
        into["syncs"] = None
        yield
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    into["syncs"] = sum(1 for w in seen if "synchroniz" in str(w.message))


# ----------------------------------------------------------------------------- parts

def peaks(cfg, device, args) -> dict:
    rows, dim = cfg.data.batch * cfg.model.seq, cfg.model.dim
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    h = torch.randn(rows, dim, device=device, dtype=dtype)
    out = {"rows": rows, "dim": dim, "dtype": str(dtype), "gemm": {}}
    for n in (4096, 8192, 8193, 8256):
        w = torch.randn(n, dim, device=device, dtype=dtype)
        s = timed(lambda: h @ w.T, device, repeats=10)
        out["gemm"][str(n)] = {"seconds": s, "flops_per_s": 2 * rows * dim * n / s}
    out["square"] = matmul_peak(device)
    return out


def _arm(cfg, arm: str, corpus, steps: int, device) -> dict:
    """An arm through the budget loop for `steps` steps: what it reports, and its host waits."""
    got = {}
    c = C.override(cfg, {"train.max_steps": steps, "train.budget_seconds": 0.0, "train.curve_points": 2})
    with counted_syncs(device, got):
        r = run_arm(ArmSpec(arm, c, C.Placement("single"), 1, None, own_process=False), corpus=corpus)
    return {"status": r.status, "steps": r.steps, "tokens_per_s": r.tokens_per_s,
            "ms_per_step": 1000 * r.elapsed_s / max(1, r.steps), "peak_vram_bytes": r.peak_vram_bytes,
            "compile_s": r.compile_s, "loop_syncs": got["syncs"],
            "loop_syncs_per_step": None if got["syncs"] is None else got["syncs"] / max(1, r.steps)}


def _step_kernels(cfg, arm: str, corpus, device) -> int:
    segs = arm_segments(cfg, arm)
    ch = Chain(cfg, arm, segs, range(len(segs)), device, corpus)
    accel.warm_up(ch)
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, cfg.model.vocab, (cfg.data.batch, cfg.model.seq), generator=g).to(device)
            for _ in range(2))
    ch.step(x, y, cfg.train.lr)
    return kernels(lambda: ch.step(x, y, cfg.train.lr), device)


def _with_mfu(row: dict, flops_per_token: float, peak: float, device) -> dict:
    """MFU against the peak measured here and, for a GPU with a known data sheet, against its rate."""
    sheet = spec_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return {**row, "flops_per_token": flops_per_token, "mfu": mfu(flops_per_token, row["tokens_per_s"], peak),
            "mfu_data_sheet": mfu(flops_per_token, row["tokens_per_s"], sheet) if sheet else None}


def e2e(cfg, device, args) -> dict:
    corpus = load_corpus(cfg.data)
    peak = matmul_peak(device)["flops_per_s"]
    fpt = arm_costs(C.override(cfg, {"seams.arms": "e2e,local"}), corpus)["e2e"]["flops_per_token"]
    out = {"matmul_peak_flops_per_s": peak, "variants": {}}
    if device.type == "cpu":  # the dry run: dynamo's capture without inductor's C++ build
        import functools

        from seamkit.seams import chain
        chain.compile_model = functools.partial(accel.compile_model, backend="aot_eager")
    for name, compile_ in (("eager", "off"), ("compiled", "on")):
        c = C.override(cfg, {"train.compile": compile_})
        row = _arm(c, "e2e", corpus, args.steps, device)
        row["kernels_per_step"] = _step_kernels(c, "e2e", corpus, device)
        out["variants"][name] = _with_mfu(row, fpt, peak, device)
        write(args, out)
    out["loss"] = _loss_paths(cfg, device)
    return out


def _loss_paths(cfg, device) -> dict:
    """The LM loss and its backward on a (batch, seq, dim) input: full logits, then the chunked path."""
    torch.manual_seed(0)
    model = GPT(cfg.model).to(device)
    h = torch.randn(cfg.data.batch, cfg.model.seq, cfg.model.dim, device=device).requires_grad_()
    y = torch.randint(0, cfg.model.vocab, (cfg.data.batch, cfg.model.seq), device=device)
    paths = {"full_logits": lambda: lm_loss(model.head(model.norm(h)), y), "chunked": lambda: model.loss(h, y)}
    out = {}
    for name, fn in paths.items():
        def step():
            with autocast(device, cfg.train.dtype):
                loss = fn()
            loss.backward()
        out[name] = {"ms": 1000 * timed(step, device), "peak_bytes": peak_memory(step, device)}
    return out


def local(cfg, device, args) -> dict:
    corpus = load_corpus(cfg.data)
    peak = matmul_peak(device)["flops_per_s"]
    out = {"matmul_peak_flops_per_s": peak, "variants": {}}
    variants = [("8193_padded", 8192, 64, "each"), ("8193_unpadded", 8192, 1, "each"), ("8256", 8255, 64, "each"),
                ("1024", 1023, 64, "each"), ("8193_padded_backward_once", 8192, 64, "once")]
    for name, k, align, backward in variants:
        c = C.override(cfg, {"seams.aux_classes": k, "seams.local_backward": backward})
        losses.CUDA_ALIGN = align
        try:
            fpt = arm_costs(c, corpus)["local"]["flops_per_token"]
            row = _arm(c, "local", corpus, args.steps, device)
            row["kernels_per_step"] = _step_kernels(c, "local", corpus, device)
        finally:
            losses.CUDA_ALIGN = 64
        out["variants"][name] = {"classes": min(k, cfg.model.vocab) + 1, "align": align, "local_backward": backward,
                                 **_with_mfu(row, fpt, peak, device)}
        write(args, out)
    return out


PRECISIONS = ("float32", "tf32", "bf16")


@contextlib.contextmanager
def precision(name: str, device):
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = name == "tf32"
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=name == "bf16"):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def pruned(cfg, device, args) -> dict:
    from seamkit.pruning.step import Stepper, mode_loss
    from seamkit.pruning.study import load_windows, to_device
    windows = [to_device(w, device) for w in load_windows(cfg.data, C.override(cfg, {"prune.windows": args.windows}))
               if bool(w.loss_mask.any())]
    torch.manual_seed(0)
    stepper = Stepper(cfg.model, GPT(cfg.model).state_dict(), None, cfg, torch.float32, device)
    out = {"windows": len(windows), "precisions": {}}
    for name in PRECISIONS if device.type == "cuda" else ("float32", "bf16"):
        rows = []
        for w in windows:
            fns = {m: mode_loss(m, w, "arithmetic") for m in ("base", "prune_exact")}
            row = {}
            with precision(name, device):
                for m, fn in fns.items():
                    def step(fn=fn):
                        stepper.reset()
                        stepper.run(fn)
                    row[f"{m}_ms"] = 1000 * timed(step, device, repeats=args.pairs)
                    row[f"{m}_kernels"] = kernels(step, device)
                    stepper.reset()
                    row[f"{m}_flops"] = measured_flops(lambda fn=fn: fn(stepper.model))
            row["speedup"] = row["base_ms"] / row["prune_exact_ms"]
            row["flop_ceiling"] = row["base_flops"] / row["prune_exact_flops"]
            rows.append(row)
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        out["precisions"][name] = {"median": med, "share_of_ceiling": med["speedup"] / med["flop_ceiling"],
                                   "windows": rows}
        write(args, out)
    return out


def determinism(cfg, device, args) -> dict:
    from seamkit.accel import deterministic
    if cfg.train.deterministic:
        deterministic(device)
    corpus = load_corpus(cfg.data)
    weights = []
    for _ in range(2):
        c = C.override(cfg, {"train.max_steps": args.steps, "train.budget_seconds": 0.0, "train.compile": "off"})
        segs = arm_segments(c, "e2e")
        ch = Chain(c, "e2e", segs, range(len(segs)), device, corpus)
        from seamkit.data.rows import RowLoader
        loader = RowLoader(corpus, "train", c.data.batch, c.model.seq, c.train.seed, device=device)
        for _ in range(args.steps):
            ch.step(*loader.next(), c.train.lr)
        weights.append({n: p.detach().cpu().clone() for n, p in ch.model.named_parameters()})
    differ = [n for n in weights[0] if not torch.equal(weights[0][n], weights[1][n])]
    return {"deterministic": cfg.train.deterministic, "steps": args.steps, "bitwise_equal": not differ,
            "tensors_differing": len(differ), "of": len(weights[0]),
            "max_abs_difference": max((float((weights[0][n] - weights[1][n]).abs().max()) for n in differ), default=0.0)}


def write(args, body: dict) -> None:
    """The part's JSON so far (atomically: a cut-off run leaves the last whole write)."""
    atomic_write_text(Path(args.out), json.dumps({"part": args.part, "preset": args.preset, "device": args.device,
                                                  **body, **provenance()}, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=PARTS)
    ap.add_argument("--preset", default="seed")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=30, help="steps an arm trains for its figures")
    ap.add_argument("--windows", type=int, default=2, help="pruning windows")
    ap.add_argument("--pairs", type=int, default=3, help="timed steps per window, mode and precision")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    sets = dict(s.split("=", 1) for s in args.set)
    cfg = C.override(C.preset(args.preset), {"train.device": args.device, **sets})
    device = torch.device(args.device)
    t0 = time.time()
    body = globals()[args.part](cfg, device, args)
    body["seconds"] = round(time.time() - t0, 1)
    write(args, body)
    print(json.dumps({"part": args.part, "seconds": body["seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
