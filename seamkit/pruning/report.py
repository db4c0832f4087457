"""The pruning study's report: what it holds before any window runs (`new_report`), a window's
pruning pattern for the plots (`pattern`), the verdicts drawn from its checks (`finish`) and the
table `prune-check` prints (`summary_table`). seamkit.pruning.study fills it, window by window."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from seamkit import checkpoint as ckpt_mod
from seamkit.config import RunConfig
from seamkit.pruning import rules as prune
from seamkit.pruning.compare import DIFFERENCES, within
from seamkit.report import provenance

TOLERANCE = {"float32": 0.0, "float64": 1e-12}  # float32: bitwise is the claim; float64: the bound of exact arithmetic
MODE_CONTROL = "prune_exact vs base (both eager)"  # the control that decides whether bitwise mode held


def tolerance(cfg: RunConfig) -> float | None:
    """The bound every check must hold; None where none is declared: arithmetic in float32 is exact
    up to rounding, so its deltas are reported beside base's, with no bound."""
    return None if cfg.prune.exact == "arithmetic" and cfg.prune.dtype == "float32" else TOLERANCE[cfg.prune.dtype]


def new_report(cfg: RunConfig, run_cfg: RunConfig, checkpoint_path: Path, ck: dict, reference,
               device: torch.device, strict: bool) -> dict:
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
                        "training" if strict else
                        "eager steps with the kernels of training (deterministic on CPU); the compiled reference "
                        "with deterministic algorithms, warn-only"),
        "optimizer": ("AdamW state from the checkpoint" if ck["optimizer"] is not None else
                      "fresh AdamW state: the checkpoint has no optimizer state"),
        "optimizer_hyperparameters": {"lr": cfg.train.lr, "betas": [cfg.train.beta1, cfg.train.beta2],
                                      "weight_decay": cfg.train.weight_decay, "grad_clip": "none in the checked step"},
        "tolerances": {"bitwise": 0.0, "declared": tolerance(cfg), "dtype": cfg.prune.dtype, "exact": exact},
        "memory_method": ("cuda: torch.cuda max_memory_allocated/reserved, reset per sample" if device.type == "cuda"
                          else "cpu: allocated_GiB = parameters + optimizer state + the profiler's peak of live "
                               "tensor bytes in an untimed step of the same window and mode; reserved_GiB = the "
                               "process's peak resident set (VmHWM, reset per sample) during the timed step"),
        "controls": [], "rules": [], "windows": [],
        "flops_method": "torch.utils.flop_counter.FlopCounterMode over one untimed forward + backward per window "
                        "and mode (GEMMs and attention, dense); plan: prune.plan_flops, the same formulas",
        "bitwise": False, "within_tolerance": False,
    }


def pattern(window, p: prune.Plan, n_blocks: int, wi: int) -> dict:
    """One window's pruning pattern for the plots: per position 0 dropped (rule A), 1 context
    (live, not a target: every block, but only keys and values in the last), 2 target."""
    kind = torch.zeros(p.positions, dtype=torch.long)
    kind[p.live.cpu()] = 1
    kind[p.target.cpu()] = 2
    return {"window": wi, "n_blocks": n_blocks, "positions": p.positions, "kind": kind.tolist(),
            "doc": window.doc.cpu().tolist()}


def finish(report: dict, tol: float | None) -> None:
    """The verdicts, from the checks and controls so far (a report interrupted part way gets them too)."""
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
