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
What ran is counted in an untimed step of the same window: the rows (`kept`, `skipped`,
`projected`) and the forward + backward FLOPs (FlopCounterMode), beside the FLOPs the plan
promises (`prune.plan_flops`). A window without any target is skipped and counted
(`skipped_windows`). A reference that fails to compile stops the study unless the eager
reference was asked for (`prune.reference=eager`).

Timings interleave the modes, after warm-up (seamkit.pruning.timing says how memory is measured).
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
from seamkit.flops import measured_flops
from seamkit.data.errors import DataError, TokenizerMismatch
from seamkit.data.load import load_corpus
from seamkit.data.windows import make_windows
from seamkit.model import resolve_device
from seamkit.pruning import rules as prune
from seamkit.pruning.compare import (
    DIFFERENCES,
    compare,
    differences_zero,
    stats,
    within,
)
from seamkit.pruning.probes import rule_invariance
from seamkit.pruning.reference import (
    Reference,
    deterministic,
    no_deterministic_kernel,
    strict_determinism,
)
from seamkit.pruning.step import MODES, CheckError, Stepper, mode_loss
from seamkit.pruning.timing import GiB, profiled_peak_bytes, timed_sample
from seamkit.report import provenance, write_report
from seamkit.threads import resolve_threads

TOLERANCE = {"float32": 0.0, "float64": 1e-12}  # float32: bitwise is the claim; float64: the bound of exact arithmetic
DTYPES = {"float32": torch.float32, "float64": torch.float64}
MODE_CONTROL = "prune_exact vs base (both eager)"  # the control that decides whether bitwise mode held


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
    bar: tqdm


def _steps_per_window(samples: int, warmup: int) -> int:
    """The progress bar's steps per window: the reference, both modes compared, the FLOP count,
    and per mode its warm-up, its memory step and its timed samples."""
    return 2 + len(MODES) * (2 + warmup + samples)


def prune_check(cfg: RunConfig, checkpoint_path, out_path, windows: list | None = None,
                progress: bool = True, corpus: str | None = None) -> dict:
    """The pruning study; writes the report to out_path (atomically) and returns it.

    windows: already-built windows (tests); None builds cfg.prune.windows of them from the
    checkpoint's corpus, or from `corpus` (another corpus of the checkpoint's tokenizer; the
    report's config names the one read). On Ctrl-C the report written so far has status
    "interrupted".
    """
    checkpoint_path, out_path = Path(checkpoint_path), Path(out_path)
    ck, saved, data_cfg = _load(cfg, checkpoint_path, corpus)
    run_cfg = dataclasses.replace(cfg, model=saved.model, data=dataclasses.replace(
        cfg.data, corpus=data_cfg.corpus, tokenizer=saved.data.tokenizer))
    if saved.model.dropout > 0:
        raise CheckError(f"checkpoint {checkpoint_path}: model.dropout={saved.model.dropout}; exact pruning "
                         f"needs dropout 0 (a dropout mask over fewer positions differs)")
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
    exact, tol = cfg.prune.exact, _tolerance(cfg)
    report = _new_report(cfg, run_cfg, checkpoint_path, ck, reference, device)
    samples, warmup = cfg.prune.samples, cfg.prune.warmup
    bar = tqdm(total=len(windows) * _steps_per_window(samples, warmup), desc="prune-check", unit="step",
               disable=not progress, mininterval=0.5)
    study = Study(report, stepper, reference, control_ref, exact, samples, warmup, device, bar)
    try:
        for wi, window in enumerate(windows):
            _one_window(study, wi, window)
        if not report["checks"]:
            raise CheckError(f"none of the {len(windows)} windows has a target under loss policy "
                             f"{cfg.prune.policy!r}: nothing to check")
        report["status"] = "complete"
    except KeyboardInterrupt:
        report["status"] = "interrupted"
        _finish(report, tol)
        write_report(out_path, report, "pruning")
        raise
    finally:
        bar.close()
    _finish(report, tol)
    write_report(out_path, report, "pruning")
    return report


def _tolerance(cfg: RunConfig) -> float | None:
    """The bound every check must hold; None where none is declared: arithmetic in float32 is exact
    up to rounding, so its deltas are reported beside base's, with no bound."""
    return None if cfg.prune.exact == "arithmetic" and cfg.prune.dtype == "float32" else TOLERANCE[cfg.prune.dtype]


def _new_report(cfg: RunConfig, run_cfg: RunConfig, checkpoint_path: Path, ck: dict, reference: Reference,
                device: torch.device) -> dict:
    """The report before any window has run: what is checked, against what, and how it is measured."""
    exact = cfg.prune.exact
    return {
        "status": "running",
        "checkpoint": ckpt_mod.ref(checkpoint_path, ck["id"]),
        "training_continued": False,
        "reference": reference.description,
        "reference_kind": reference.backend,
        "exact": exact,
        "exact_meaning": ("bitwise: prune_exact must equal base bit for bit (seamkit.pruning.bitwise)" if exact == "bitwise"
                          else "arithmetic: every op pruned; float64 within 1e-12 of the reference, float32 deltas "
                               "reported beside base's own (seamkit.pruning.rules)"),
        "setup_s": 0.0,
        "setup": "none: the plan, its indices and masks (and in bitwise mode the calibration) run inside every "
                 "timed pruned step; nothing is reused across windows",
        "skipped_windows": [], "windows_skipped": 0,
        "checks": [], "timings": [],
        **provenance(),
        "config": run_cfg.to_dict(),  # the model and its data from the checkpoint, the rest from the command
        "loss_policy": cfg.prune.policy,
        "dtype": cfg.prune.dtype,
        "device": str(device),
        "runtime": "eager: both modes run eagerly, the reference is compiled",
        "determinism": ("strict: torch.use_deterministic_algorithms(True) around every compared step (CUDA's "
                        "memory-efficient attention backward then runs without key splits); timed steps as in "
                        "training" if strict_determinism(device) else
                        "eager steps with the kernels of training (deterministic on CPU); the compiled reference "
                        "with deterministic algorithms, warn-only"),
        "optimizer": ("AdamW state from the checkpoint" if ck["optimizer"] is not None else
                      "fresh AdamW state: the checkpoint has no optimizer state"),
        "optimizer_hyperparameters": {"lr": cfg.train.lr, "betas": [cfg.train.beta1, cfg.train.beta2],
                                      "weight_decay": cfg.train.weight_decay, "grad_clip": "none in the checked step"},
        "tolerances": {"bitwise": 0.0, "declared": _tolerance(cfg), "dtype": cfg.prune.dtype, "exact": exact},
        "memory_method": ("cuda: torch.cuda max_memory_allocated/reserved, reset per sample" if device.type == "cuda"
                          else "cpu: allocated_GiB = parameters + optimizer state + the profiler's peak of live "
                               "tensor bytes in an untimed step of the same window and mode; reserved_GiB = the "
                               "process's peak resident set (VmHWM, reset per sample) during the timed step"),
        "controls": [], "rules": [], "windows": [],
        "flops_method": "torch.utils.flop_counter.FlopCounterMode over one untimed forward + backward per window "
                        "and mode (GEMMs and attention, dense); plan: prune.plan_flops, the same formulas",
        "bitwise": False, "within_tolerance": False,
    }


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
    timing = {m: {"window": wi, "mode": m, "words": words, "positions": int(window.positions),
                  "documents": int(window.documents), "samples": [],
                  "stats": stats(results[m], m, window, ran[m])} for m in MODES}
    fns = {m: mode_loss(m, window, s.exact) for m in MODES}
    flops = {}
    for m in MODES:  # what each step ran, counted
        stepper.reset()
        flops[m] = measured_flops(lambda: fns[m](stepper.model))
    bar.update(1)
    allocated = {}
    for m in MODES:
        bar.set_postfix_str(f"window {wi}: warm-up {m}")
        for _ in range(s.warmup):
            stepper.reset()
            stepper.run(fns[m])
            bar.update(1)
        if device.type != "cuda":
            allocated[m] = profiled_peak_bytes(stepper, fns[m]) / GiB
        bar.update(1)
    for k in range(s.samples):
        order = MODES if k % 2 == 0 else MODES[::-1]  # interleaved, alternating who goes first
        for m in order:
            bar.set_postfix_str(f"window {wi}: sample {k} {m}")
            sample = timed_sample(stepper, fns[m], words, device)
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


# ----------------------------------------------------------------------------- the report

def pattern(window, p: prune.Plan, n_blocks: int, wi: int) -> dict:
    """One window's pruning pattern for the plots: per position 0 dropped (rule A), 1 context
    (live, not a target: every block, but only keys and values in the last), 2 target."""
    kind = torch.zeros(p.positions, dtype=torch.long)
    kind[p.live.cpu()] = 1
    kind[p.target.cpu()] = 2
    return {"window": wi, "n_blocks": n_blocks, "positions": p.positions, "kind": kind.tolist(),
            "doc": window.doc.cpu().tolist()}


def _finish(report: dict, tol: float | None) -> None:
    checks = report["checks"]
    report["bitwise"] = bool(checks) and all(c["bitwise"] for c in checks)
    report["within_tolerance"] = None if tol is None else bool(checks) and all(within(c, tol) for c in checks)
    # what bitwise mode promises: prune_exact equal to base bit for bit on every window (None in
    # arithmetic mode); a compiled reference's own rounding does not enter it either way
    controls = [c for c in report["controls"] if c["compared"] == MODE_CONTROL]
    report["bitwise_mode_held"] = (bool(controls) and all(c["bitwise"] for c in controls)
                                   if report.get("exact") == "bitwise" else None)

def _g(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


def summary_table(report: dict) -> str:
    """Per window and mode: differences, kept/skipped, words/s and memory; then speed-up per window."""
    rows = [f"reference: {report['reference']}",
            f"prune_exact ran the {report.get('exact', 'bitwise')} pruned step; setup_s {report.get('setup_s', 0.0):g}; "
            f"windows skipped (no target): {report.get('windows_skipped', 0)}",
            f"{'win':>3} {'mode':<11} {'loss_d':>8} {'grad_max':>8} {'upd_max':>8} {'state_max':>9} "
            f"{'none':>4} {'kept':>6} {'skip':>6} {'words/s':>9} {'alloc GiB':>9} {'rss GiB':>8}"]
    timings = {(t["window"], t["mode"]): t for t in report.get("timings", [])}
    for c in report.get("checks", []):
        t = timings.get((c["window"], c["mode"]))
        wps = f"{statistics.median(s['words_per_second'] for s in t['samples']):9.1f}" if t and t["samples"] else f"{'-':>9}"
        mem = f"{statistics.median(s['allocated_GiB'] for s in t['samples']):9.3f}" if t and t["samples"] else f"{'-':>9}"
        rss = f"{statistics.median(s['reserved_GiB'] for s in t['samples']):8.3f}" if t and t["samples"] else f"{'-':>8}"
        s = c["stats"]
        rows.append(f"{c['window']:>3} {c['mode']:<11} {_g(c['loss_delta']):>8} {_g(c['gradient_max']):>8} "
                    f"{_g(c['parameter_update_max']):>8} {_g(c['optimizer_state_max']):>9} "
                    f"{len(c['gradient_none_difference']):>4} {s['kept']:>6} {s['skipped']:>6} {wps} {mem} {rss}")
    for w in report.get("windows", []):
        f = w.get("flops")
        flops = "" if f is None else (f", FLOPs base/pruned {f['ceiling']:.3f}x measured ({f['prune_exact']:.3g} "
                                      f"ran, plan {f['plan_pruned']:.3g}; plan ceiling {f['plan_ceiling']:.3f}x)")
        rows.append(f"window {w['window']}: speed-up {w['speedup']:.3f}x, memory ratio {w['memory_ratio']:.3f}, "
                    f"rss ratio {w['reserved_ratio']:.3f}{flops}")
    groups: dict = {}
    for c in report.get("controls", []):
        groups.setdefault(c["compared"], []).append(c)
    for what, cs in groups.items():
        worst = max(max(c[k] for k in DIFFERENCES) for c in cs)
        rows.append(f"control {what}: {'bitwise equal' if all(c['bitwise'] for c in cs) else f'max diff {worst:.1e}'}"
                    f" on {len(cs)} window(s)")
    rules = report.get("rules", [])
    if rules:
        ok = all(v["bitwise"] for r in rules for k, v in r.items() if isinstance(v, dict))
        rows.append(f"rule tests (unpruned step, A and B): {'bitwise equal' if ok else 'DIFFER'}")
    tol, within_tol = report.get("tolerances", {}).get("declared"), report.get("within_tolerance")
    bound = ("no bound declared: float32 arithmetic, deltas above beside base's" if tol is None else
             f"within tolerance {tol}: {str(within_tol).lower()}")
    held = report.get("bitwise_mode_held")
    if held is not None:
        failed = [c["window"] for c in report.get("controls", []) if c["compared"] == MODE_CONTROL and not c["bitwise"]]
        rows.append("bitwise mode held: prune_exact equals base bit for bit on every window" if held else
                    f"bitwise mode did NOT hold on this CPU: prune_exact differs from base on window(s) {failed}")
    rows.append(f"bitwise vs reference: {str(report.get('bitwise', False)).lower()}  "
                f"(dtype {report.get('dtype')}, {bound}), status {report.get('status')}")
    return "\n".join(rows)
