"""The pruning study, `prune-check`: both modes against the reference, window by window, and its report.

From one checkpoint, on held-out windows, a training step (forward, backward, AdamW step) runs
in two modes, `base` (the unpruned step) and `prune_exact` (the pruned step of cfg.prune.exact,
seamkit.pruning.step), and each is compared (seamkit.pruning.compare) with the reference, the
unpruned step compiled with torch.compile (seamkit.pruning.reference). Every step starts from
the checkpoint on copies (`training_continued: false`). The comparison of `prune_exact` with
`base` and the rule tests (seamkit.pruning.probes) are kept in the report as well: they need no
compiler.

`exact=arithmetic` (the default) is exact in arithmetic: float64 within 1e-12, float32 deltas to
the reference reported beside base's own; `exact=bitwise` must match the unpruned step's bits on
this CPU (`bitwise_mode_held`: prune_exact equal to base on every window; the summary names the
windows where it is not). Either way the timed step holds every cost of pruning: the plan, its
indices and masks, and (bitwise) the calibration; nothing is kept from one window to the next,
so `setup_s` is 0.
Timed steps run in `precision` (seamkit.pruning.timing.PRECISIONS: fp32, or bf16 as training
runs on CUDA), recorded in the report (`timing_precision`, and per timing); the compared steps
always run in cfg.prune.dtype without autocast.
What ran is counted in an untimed step of the same window: the rows (`kept`, `skipped`,
`projected`) and the forward + backward FLOPs (FlopCounterMode), beside the FLOPs the plan
promises (`prune.plan_flops`). A window without any target is skipped and counted
(`skipped_windows`). A reference that fails to compile stops the study unless the eager
reference was asked for (`prune.reference=eager`).

Timings interleave the modes, after warm-up (seamkit.pruning.timing says how memory is measured).
What the report holds, its verdicts and the printed table are seamkit.pruning.report's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from seamkit import checkpoint as ckpt_mod
from seamkit.config import RunConfig, tokenizer_vocab
from seamkit.data.errors import DataError, TokenizerMismatch
from seamkit.data.load import load_corpus
from seamkit.data.windows import make_windows
from seamkit.flops import measured_flops
from seamkit.model import resolve_device
from seamkit.pruning import rules as prune
from seamkit.pruning.compare import compare, differences_zero, stats
from seamkit.pruning.probes import rule_invariance
from seamkit.pruning.reference import (
    Reference,
    deterministic,
    no_deterministic_kernel,
    strict_determinism,
)
from seamkit.pruning.report import (
    MODE_CONTROL,
    finish,
    new_report,
    pattern,
    summary_table,
    tolerance,
)
from seamkit.pruning.step import MODES, CheckError, Stepper, mode_loss
from seamkit.pruning.timing import PRECISIONS, GiB, precision as timing_precision, profiled_peak_bytes, timed_sample
from seamkit.report import host_speed, write_report
from seamkit.threads import resolve_threads

__all__ = ["DTYPES", "Study", "load_windows", "pattern", "prune_check", "summary_table", "to_device"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ----------------------------------------------------------------------------- loading

def _load(cfg: RunConfig, checkpoint_path: Path, corpus: str | None = None):
    """The checkpoint, its model config and the data config its windows come from: the
    checkpoint's corpus, or `corpus` (read with the checkpoint's tokenizer)."""
    ck = ckpt_mod.load(checkpoint_path)
    saved: RunConfig = ck["run_config"]
    if saved.data.tokenizer != cfg.data.tokenizer or saved.model.vocab != cfg.model.vocab:
        raise CheckError(
            f"checkpoint {checkpoint_path} was trained with tokenizer {saved.data.tokenizer} and vocab "
            f"{saved.model.vocab}, the config asks for tokenizer {cfg.data.tokenizer} and vocab {cfg.model.vocab}: "
            f"use the checkpoint's preset or --set data.tokenizer=... model.vocab=...")
    if saved.model.vocab < tokenizer_vocab(saved.data.tokenizer):
        raise CheckError(f"checkpoint {checkpoint_path}: vocab {saved.model.vocab} is smaller than its "
                         f"{saved.data.tokenizer} tokenizer")
    data_cfg = dataclasses.replace(saved.data, cache_dir=cfg.data.cache_dir, corpus=corpus or saved.data.corpus)
    return ck, saved, data_cfg


def load_windows(data_cfg, cfg: RunConfig) -> list:
    """The study's windows: whole held-out documents, cfg.data.window_positions each."""
    try:
        corpus = load_corpus(data_cfg)
        return make_windows(corpus, cfg.prune.split, cfg.data.window_positions, cfg.prune.policy,
                            cfg.prune.windows, seed=cfg.train.seed)
    except TokenizerMismatch as e:  # the checkpoint fixes the tokenizer: only another corpus can help
        raise CheckError(f"corpus {data_cfg.corpus} was prepared with tokenizer {e.prepared}, the checkpoint "
                         f"reads {data_cfg.tokenizer}: evaluate it on a corpus of its own tokenizer") from None
    except DataError as e:
        raise CheckError(str(e)) from None


def to_device(window, device):
    """The window with its tensors on `device`."""
    return dataclasses.replace(window, **{f.name: getattr(window, f.name).to(device)
                                          for f in dataclasses.fields(window) if torch.is_tensor(getattr(window, f.name))})


# ----------------------------------------------------------------------------- the study

@dataclass
class Study:
    """What every window of one study shares: the report it fills and what runs its steps."""
    report: dict
    stepper: Stepper
    reference: Reference
    control_ref: Reference | None  # aot_eager, beside a compiled reference; None beside the eager one
    exact: str  # cfg.prune.exact: the pruned step prune_exact runs
    samples: int  # timed samples per window and mode
    warmup: int  # untimed steps per window and mode before them
    device: torch.device
    precision: str  # what the timed steps run in (timing.PRECISIONS)
    bar: tqdm


def _steps_per_window(samples: int, warmup: int) -> int:
    """The progress bar's steps per window: the reference, both modes compared, the FLOP count,
    and per mode its warm-up, its memory step and its timed samples."""
    return 2 + len(MODES) * (2 + warmup + samples)


def prune_check(cfg: RunConfig, checkpoint_path, out_path, windows: list | None = None,
                progress: bool = True, corpus: str | None = None, precision: str | None = None) -> dict:
    """The pruning study; writes the report to out_path (atomically) and returns it.

    windows: already-built windows (tests); None builds cfg.prune.windows of them from the
    checkpoint's corpus, or from `corpus` (another corpus of the checkpoint's tokenizer; the
    report's config names the one read). On Ctrl-C the report written so far has status
    "interrupted".
    """
    precision = precision or cfg.prune.precision
    if precision not in PRECISIONS:
        raise CheckError(f"unknown timing precision {precision!r}; choose one of {PRECISIONS}")
    checkpoint_path, out_path = Path(checkpoint_path), Path(out_path)
    ck, saved, data_cfg = _load(cfg, checkpoint_path, corpus)
    run_cfg = dataclasses.replace(cfg, model=saved.model, data=dataclasses.replace(
        cfg.data, corpus=data_cfg.corpus, tokenizer=saved.data.tokenizer))
    if saved.model.dropout > 0:
        raise CheckError(f"checkpoint {checkpoint_path}: model.dropout={saved.model.dropout}; exact pruning "
                         f"needs dropout 0 (a dropout mask over fewer positions differs)")
    host_speed()  # the report's speed fingerprint, read before the timed steps load the host
    threads = resolve_threads(cfg.train.threads)
    torch.set_num_threads(threads)
    run_cfg = dataclasses.replace(run_cfg, train=dataclasses.replace(run_cfg.train, threads=threads))
    device = resolve_device(cfg.train.device)
    if device.type == "cuda":  # deterministic cuBLAS for the reference; must be set before cuBLAS starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    dtype = DTYPES[cfg.prune.dtype]
    if windows is None:
        windows = load_windows(data_cfg, cfg)
    windows = [to_device(w, device) for w in windows]

    torch.manual_seed(cfg.train.seed)
    try:
        stepper = Stepper(saved.model, ck["model"], ck["optimizer"], cfg, dtype, device)
    except RuntimeError as e:
        raise CheckError(f"checkpoint {checkpoint_path} does not match its model config: "
                         f"{str(e).splitlines()[0]}") from None
    kind = "eager" if cfg.prune.reference == "eager" else "inductor"
    reference = Reference(kind)
    control_ref = Reference("aot_eager") if kind != "eager" else None
    exact, tol = cfg.prune.exact, tolerance(cfg)
    report = new_report(cfg, run_cfg, checkpoint_path, ck, reference, device, strict_determinism(device))
    report["timing_precision"] = precision
    samples, warmup = cfg.prune.samples, cfg.prune.warmup
    bar = tqdm(total=len(windows) * _steps_per_window(samples, warmup), desc="prune-check", unit="step",
               disable=not progress, mininterval=0.5)
    study = Study(report, stepper, reference, control_ref, exact, samples, warmup, device, precision, bar)
    try:
        for wi, window in enumerate(windows):
            _one_window(study, wi, window)
        if not report["checks"]:
            raise CheckError(f"none of the {len(windows)} windows has a target under loss policy "
                             f"{cfg.prune.policy!r}: nothing to check")
        report["status"] = "complete"
    except KeyboardInterrupt:
        report["status"] = "interrupted"
        finish(report, tol)
        write_report(out_path, report, "pruning")
        raise
    finally:
        bar.close()
    finish(report, tol)
    write_report(out_path, report, "pruning")
    return report


# ----------------------------------------------------------------------------- one window

def _one_window(s: Study, wi: int, window) -> None:
    report = s.report
    if not bool(window.loss_mask.any()):  # its loss is undefined: skipped and counted, not fatal
        report["skipped_windows"].append({"window": wi, "reason": "no target in its loss mask",
                                          "positions": int(window.positions)})
        report["windows_skipped"] = len(report["skipped_windows"])
        s.bar.update(_steps_per_window(s.samples, s.warmup))
        return
    try:
        p = prune.plan(window)  # for the rule tests, the pattern and the plan's FLOPs; the timed step plans again
    except prune.PruneError as e:
        raise CheckError(f"window {wi}: {e}") from None
    results, ran = _compared_steps(s, wi, window, p)
    if "pattern" not in report:
        report["pattern"] = pattern(window, p, s.stepper.model.cfg.n_blocks, wi)
    _timed_steps(s, wi, window, p, results, ran)


def _compared_steps(s: Study, wi: int, window, p: prune.Plan):
    """The window's steps whose bits are compared, strict-deterministic where `strict_determinism`
    says so. An op with no deterministic kernel there: the window runs again warn-only, and the
    report's `determinism` names the op (its bits may then vary run to run)."""
    report, strict = s.report, strict_determinism(s.device)
    if not strict or not report["determinism"].startswith("strict"):
        with deterministic(False) if strict else contextlib.nullcontext():
            return _exactness(s, wi, window, p)
    marks = {k: len(report[k]) for k in ("checks", "controls", "rules")}
    try:
        with deterministic(True):
            return _exactness(s, wi, window, p)
    except RuntimeError as e:
        if not no_deterministic_kernel(e):
            raise
        for k, n in marks.items():  # the window's partial entries, dropped before it runs again
            del report[k][n:]
        first = (str(e).strip().splitlines() or ["?"])[0][:200]
        report["determinism"] = f"warn-only (an op has no deterministic kernel: {first})"
        print(f"prune-check: {report['determinism']}; bitwise results on this device may vary run to run",
              file=sys.stderr)
        with deterministic(False):
            return _exactness(s, wi, window, p)


def _exactness(s: Study, wi: int, window, p: prune.Plan):
    """The reference, both modes and their controls, and the rule tests of one window."""
    report, stepper, bar = s.report, s.stepper, s.bar
    bar.set_postfix_str(f"window {wi}: reference")
    ref = s.reference.step(stepper, window)
    bar.update(1)
    results, ran = {}, {m: {} for m in MODES}
    for mode in MODES:
        bar.set_postfix_str(f"window {wi}: check {mode}")
        results[mode] = stepper.step(mode_loss(mode, window, s.exact, ran[mode]))
        d = compare(ref, results[mode])
        report["checks"].append({"window": wi, "mode": mode, **d, "stats": stats(results[mode], mode, window, ran[mode]),
                                 "bitwise": differences_zero(d)})
        bar.update(1)
    control = compare(results["base"], results["prune_exact"])
    report["controls"].append({"window": wi, "compared": MODE_CONTROL, **control,
                               "bitwise": differences_zero(control)})
    if s.control_ref is not None:
        bar.set_postfix_str(f"window {wi}: aot_eager reference")
        ref2 = s.control_ref.step(stepper, window)
        for mode in MODES:
            d = compare(ref2, results[mode])
            report["controls"].append({"window": wi, "compared": f"{mode} vs {s.control_ref.description}", **d,
                                       "bitwise": differences_zero(d)})
    bar.set_postfix_str(f"window {wi}: rules")
    rules = rule_invariance(stepper, window, p)
    report["rules"].append({"window": wi, **{k: {**v, "bitwise": differences_zero(v)} for k, v in rules.items()}})
    return results, ran


def _timed_steps(s: Study, wi: int, window, p: prune.Plan, results: dict, ran: dict) -> None:
    """FLOPs counted, warm-up, memory and interleaved timed samples of both modes, as in training
    (no deterministic algorithms)."""
    stepper, bar, device = s.stepper, s.bar, s.device
    words = int(window.words)
    timing = {m: {"window": wi, "mode": m, "precision": s.precision, "words": words,
                  "positions": int(window.positions), "documents": int(window.documents), "samples": [],
                  "stats": stats(results[m], m, window, ran[m])} for m in MODES}
    fns = {m: mode_loss(m, window, s.exact) for m in MODES}
    flops = {}
    for m in MODES:  # what each step ran, counted
        stepper.reset()
        flops[m] = measured_flops(lambda m=m: fns[m](stepper.model))
    bar.update(1)
    allocated = {}
    for m in MODES:
        bar.set_postfix_str(f"window {wi}: warm-up {m}")
        for _ in range(s.warmup):
            stepper.reset()
            with timing_precision(s.precision, device):
                stepper.run(fns[m])
            bar.update(1)
        if device.type != "cuda":
            allocated[m] = profiled_peak_bytes(stepper, fns[m], s.precision) / GiB
        bar.update(1)
    for k in range(s.samples):
        order = MODES if k % 2 == 0 else MODES[::-1]  # interleaved, alternating who goes first
        for m in order:
            bar.set_postfix_str(f"window {wi}: sample {k} {m}")
            sample = timed_sample(stepper, fns[m], words, device, s.precision)
            if m in allocated:
                sample = {"seconds": sample["seconds"], "words_per_second": sample["words_per_second"],
                          "allocated_GiB": allocated[m], "reserved_GiB": sample["reserved_GiB"]}
            timing[m]["samples"].append(sample)
            bar.update(1)
    s.report["timings"].extend(timing[m] for m in MODES)
    b, q = timing["base"]["samples"], timing["prune_exact"]["samples"]
    planned = prune.plan_flops(stepper.model.cfg, p)
    s.report["windows"].append({
        "window": wi, "words": words, "positions": int(window.positions), "documents": int(window.documents),
        "speedup": statistics.median(y["words_per_second"] / x["words_per_second"] for x, y in zip(b, q)),
        "memory_ratio": statistics.median(y["allocated_GiB"] / x["allocated_GiB"] for x, y in zip(b, q)),
        "reserved_ratio": statistics.median(y["reserved_GiB"] / x["reserved_GiB"] if x["reserved_GiB"] else 1.0
                                            for x, y in zip(b, q)),
        "flops": {"base": flops["base"], "prune_exact": flops["prune_exact"], "plan_base": planned["base"],
                  "plan_pruned": planned["pruned"], "ceiling": flops["base"] / flops["prune_exact"],
                  "plan_ceiling": planned["base"] / planned["pruned"]},
    })


