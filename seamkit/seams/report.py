"""The seams report: one seed's arms in the reference's keys (`build_report`), the means and
intervals over seeds (`study_report`), and the plain-text table the CLI prints (`summary_table`).
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from seamkit import flops as FLOPS
from seamkit.config import RunConfig
from seamkit.model import resolve_device
from seamkit.report import gpu_name, provenance
from seamkit.seams.cuts import traffic_bytes, traffic_ratios
from seamkit.seams.objectives import objective_bytes, objective_ratios
from seamkit.seams.result import ArmResult
from seamkit.stats import stats

OBJECTIVE_NAMES = {"aux_head": "greedy per-segment next-token head over the K most frequent tokens (DGL-style)",
                   "detached_head": "the model's own final norm and LM head, weights detached",
                   "shared_head": "the model's own final norm and LM head, shared by every segment",
                   "aux_block": "a private transformer block, then a head over the K most frequent tokens (AugLocal-like)",
                   "own_head": "a private copy of the final norm and LM head per segment, next-token loss"}


WALL_CLOCK_NOTE = ("wall-clock dependent: the training clock set an LR or ended an arm, so the same command "
                   "ends on other weights (set train.max_steps with a budget it never reaches for a repeatable run)")


def _mem(r: dict) -> tuple[int | None, int | None]:
    """(peak, growth over the arm's baseline) of a report's arm block, as `ArmResult.memory`."""
    if r.get("peak_vram_bytes") is not None:
        return r["peak_vram_bytes"], r.get("vram_growth_bytes")
    return r.get("peak_rss_bytes"), r.get("rss_growth_bytes")


def _slices(slices: list[dict]) -> dict | None:
    """The spread of an arm's tokens/s over its turns."""
    tps = [s["tokens_per_s"] for s in slices]
    if not tps:
        return None
    q = statistics.quantiles(tps, n=4) if len(tps) > 1 else [tps[0]] * 3
    return {"n": len(tps), "median_tokens_per_s": statistics.median(tps), "p25": q[0], "p75": q[2],
            "min": min(tps), "max": max(tps), "spread": (max(tps) - min(tps)) / statistics.median(tps)}


def _round(v, n):
    return None if v is None else round(v, n)


def report_arm(arm: str, r: ArmResult | None, costs: dict | None = None, peak: float | None = None) -> dict:
    """An arm's report block: the reference's keys (rounded like it), then ours."""
    if r is None:  # never started (interrupted before it did)
        return {"arm": arm, "steps": 0, "tokens": 0, "elapsed_s": 0.0, "tokens_per_s": 0.0, "final_loss": None,
                "final_ppl": None, "peak_vram_bytes": None, "loss_curve": [], "status": "not_run"}
    out = {
        "arm": arm, "steps": r.steps, "tokens": r.tokens, "elapsed_s": round(r.elapsed_s, 3),
        "tokens_per_s": round(r.tokens_per_s, 1), "final_loss": _round(r.final_loss, 4),
        "final_ppl": _round(r.final_ppl, 2), "peak_vram_bytes": r.peak_vram_bytes,
        "loss_curve": [round(v, 4) for v in r.loss_curve],
        "status": r.status, "failed_step": r.failed_step, "failed_rank": r.failed_rank,
        "final_loss_stderr": _round(r.final_loss_stderr, 5), "eval_tokens": r.eval_tokens, "lr_final": r.lr_final,
        "peak_rss_bytes": r.peak_rss_bytes, "rss_start_bytes": r.rss_start_bytes,
        "rss_growth_bytes": r.rss_growth_bytes, "vram_growth_bytes": r.vram_growth_bytes,
        "max_step_s": _round(r.max_step_s, 4), "loss_curve_steps": r.loss_curve_steps,
        "loss_curve_elapsed_s": [round(v, 3) for v in r.loss_curve_elapsed_s],
        "loss_curve_tokens": r.loss_curve_tokens, "loss_curve_lr": r.loss_curve_lr,
        "loss_curve_segments": [[round(v, 4) for v in seg] for seg in r.loss_curve_segments],
        "objective": r.objective, "segments": r.segments, "checkpoint": r.checkpoint,
        "epochs": _round(r.epochs, 4), "repeat_warning": r.repeat_warning,
        "wall_clock_dependent": r.wall_clock_dependent, "placement": r.placement or "single", "wire": r.wire,
        "compile_s": _round(r.compile_s, 2),
    }
    if r.loss_curve_std is not None:
        out["loss_curve_std"] = [round(v, 4) for v in r.loss_curve_std]
    if isinstance(r.slices, dict):  # a summary already (the means over seeds)
        out["slices"] = r.slices
    elif r.slices:
        out["slices"], out["slices_raw"] = _slices(r.slices), r.slices
    if costs:
        out["costs"] = dict(costs)
        if peak:
            out["costs"]["mfu"] = FLOPS.mfu(costs["flops_per_token"], r.tokens_per_s, peak)
    return out


def repeatable(cfg: RunConfig, device: torch.device) -> dict:
    """Whether a run's kernels repeat bit for bit on its device (the clock can still set an LR:
    `wall_clock_dependent`)."""
    if device.type != "cuda":
        return {"bitwise": True, "why": "the CPU's kernels are deterministic at a fixed thread count: the same "
                                        "config and seed end on the same checkpoint id"}
    if cfg.train.deterministic:
        return {"bitwise": True, "why": "train.deterministic: torch.use_deterministic_algorithms and "
                                        "CUBLAS_WORKSPACE_CONFIG, as set for this run"}
    return {"bitwise": False, "why": "CUDA's default kernels are not deterministic (split-K GEMM reductions, atomics "
                                     "in attention's backward): two runs differ in the last bits and drift apart; "
                                     "train.deterministic=true makes them repeat, slower"}


def _any_flag(flags) -> bool | None:
    """True if any flag is, None when none is known."""
    known = [f for f in flags if f is not None]
    return any(known) if known else None


def _ratio(a, b):
    return round(a / b, 4) if a and b else None  # None when an arm did not run or measure


def build_report(cfg: RunConfig, results: dict, interrupted: bool = False, isolated: bool = True,
                 costs: dict | None = None, peak: dict | None = None) -> dict:
    """One seed's seams report (or, from `study_report`, the means): the reference's keys first, then ours."""
    seams = cfg.seam_blocks
    b = traffic_bytes(cfg.model, cfg.data.batch, len(seams))
    extra = objective_bytes(cfg.model, len(seams), cfg.seams.objective)
    device = resolve_device(cfg.train.device)
    flops = peak["flops_per_s"] if peak else None
    names = cfg.seams.arm_names
    arms = {arm: report_arm(arm, results.get(arm), (costs or {}).get(arm), flops) for arm in names}
    statuses = [a["status"] for a in arms.values()]
    # a failed arm outranks one never run (a launch of one arm, or a study stopped by the failure)
    status = "interrupted" if interrupted or "interrupted" in statuses else \
        "failed" if "failed" in statuses else "interrupted" if "not_run" in statuses else "complete"
    e2e = arms["e2e"]

    def mem(a, growth=False):  # an arm that never stepped measured nothing worth comparing
        if not a["steps"]:
            return None
        return _mem(a)[1 if growth else 0]

    def over_e2e(a):
        return {"tokens_per_s": _ratio(a["tokens_per_s"], e2e["tokens_per_s"]), "peak_memory": _ratio(mem(a), mem(e2e)),
                "memory_growth": _ratio(mem(a, True), mem(e2e, True)),
                "memory_kind": "vram" if e2e["peak_vram_bytes"] is not None else "rss"}
    m = cfg.model
    return {
        "config": {"vocab": m.vocab, "dim": m.dim, "n_blocks": m.n_blocks, "n_heads": m.n_heads, "seq": m.seq,
                   "mlp_mult": m.mlp_mult, "mlp": m.mlp, "mlp_hidden": m.mlp_width, "kv_heads": m.n_kv_heads,
                   "bias": m.bias},  # the block's shape, defaults resolved (model.mlp_width, .n_kv_heads)
        "batch": cfg.data.batch,
        "budget_seconds": float(cfg.train.budget_seconds),
        "device": device.type,
        "gpu": gpu_name(device),
        "bytes": b,
        "arms": arms,
        "traffic_ratio_e2e_over_local": traffic_ratios(b)["traffic_ratio_e2e_over_local"],
        "traffic_ratio_no_allreduce": traffic_ratios(b)["traffic_ratio_no_allreduce"],
        "status": status,
        "preset": cfg.preset,
        "seed": cfg.train.seed,
        "max_steps": cfg.train.max_steps,
        "seams": seams,
        "segments": cfg.seam_segments,
        "objective": cfg.seams.objective,
        "objective_method": OBJECTIVE_NAMES[cfg.seams.objective],
        "objective_bytes": {**extra, **objective_ratios(b, extra)},
        "lr_schedule": cfg.train.lr_schedule,
        "optimizer": cfg.train.optimizer,
        "order": cfg.seams.order if isolated else "sequential, in one process",
        **{f"{a}_over_e2e": over_e2e(arms[a]) for a in names[1:]},
        "matmul_peak": peak,
        "arm_isolation": "process" if isolated else "none",
        "checkpoints": {arm: a.get("checkpoint") for arm, a in arms.items()},
        # the clock set an LR or ended an arm: the same command ends on other checkpoints
        "wall_clock_dependent": _any_flag(a.get("wall_clock_dependent") for a in arms.values()),
        "repeatable": repeatable(cfg, device),
        **provenance(cfg),
    }


def mean_result(rs: list[ArmResult | None]) -> ArmResult | None:
    """One arm's result averaged over seeds (what the reference keys hold; the checkpoint is the
    first seed's): over the complete
    seeds, or over every seed that ran when none completed."""
    ran = [r for r in rs if r is not None]
    done = [r for r in ran if r.status == "complete"] or ran
    if not done:
        return None
    mean = statistics.fmean

    def avg(key, whole=False):  # over the seeds that measured it
        vals = [getattr(r, key) for r in done if getattr(r, key) is not None]
        return None if not vals else round(mean(vals)) if whole else mean(vals)
    out = dataclasses.replace(done[0], **{k: avg(k) for k in ("elapsed_s", "tokens_per_s", "max_step_s",
                                                               "final_loss", "final_loss_stderr", "lr_final",
                                                               "compile_s")},
                              **{k: avg(k, whole=True) for k in ("steps", "tokens", "peak_vram_bytes", "peak_rss_bytes",
                                                                  "rss_start_bytes", "rss_growth_bytes",
                                                                  "vram_growth_bytes")},
                              snapshots=None)
    n = min(len(r.loss_curve) for r in done)
    if n and len(done) > 1:
        for key in ("loss_curve", "loss_curve_elapsed_s", "loss_curve_lr"):
            setattr(out, key, [mean(getattr(r, key)[j] for r in done) for j in range(n)])
        for key in ("loss_curve_tokens", "loss_curve_steps"):
            setattr(out, key, [round(mean(getattr(r, key)[j] for r in done)) for j in range(n)])
        out.loss_curve_segments = [[mean(v) for v in zip(*(r.loss_curve_segments[j] for r in done))]
                                   for j in range(n)]
        out.loss_curve_std = [statistics.stdev(r.loss_curve[j] for r in done) for j in range(n)]
    tps = [s for r in done for s in (r.slices or [])]
    out.slices = _slices(tps) if tps else None
    out.status = next((r.status for r in ran if r.status != "complete"), "complete")
    out.wall_clock_dependent = _any_flag(r.wall_clock_dependent for r in done)
    return out


def study_report(cfg: RunConfig, runs: list[dict], interrupted: bool, isolated: bool, costs: dict,
                 peak: dict | None) -> dict:
    """The whole study: means at the reference keys, every seed in `repeats`, the `aggregate`."""
    names = cfg.seams.arm_names
    means = {arm: mean_result([r["results"].get(arm) for r in runs]) for arm in names}
    report = build_report(cfg, {a: r for a, r in means.items() if r is not None}, interrupted, isolated, costs, peak)
    repeats = []
    for r in runs:
        one = {a: report_arm(a, r["results"].get(a), costs.get(a), peak["flops_per_s"] if peak else None)
               for a in names}
        for a in names:
            one[a].pop("loss_curve_segments", None)
        repeats.append({"seed": r["seed"], "arms": one, **r["views"]})
    # seeds whose arms all completed with a finite held-out loss: the pairs the aggregate compares
    done = [r for r in runs if all(a in r["results"] and r["results"][a].status == "complete"
                                   and r["results"][a].final_loss is not None for a in names)]

    def per(arm, fn):
        return stats([fn(r["results"][arm]) for r in done])
    agg = {arm: {"final_loss": per(arm, lambda x: x.final_loss),
                 "tokens_per_s": per(arm, lambda x: x.tokens_per_s),
                 "peak_memory_bytes": per(arm, lambda x: x.memory[0]),
                 "memory_growth_bytes": per(arm, lambda x: x.memory[1]),
                 "lr_final": per(arm, lambda x: x.lr_final)} for arm in names}

    def e(r):
        return r["results"]["e2e"]

    def ratio(x, y):
        return x / y if x and y else None
    agg["paired"] = {}
    for a in names[1:]:  # every arm against e2e, seed by seed
        def lo(r, a=a):
            return r["results"][a]
        last_gap = [r["views"]["equal_tokens"][-1][f"gap_{a}_minus_e2e"] if r["views"].get("equal_tokens") else None
                    for r in done]
        ttt = [(r["views"].get("time_to_target") or {}).get(f"{a}_over_e2e") for r in done]
        agg["paired"].update({
            f"loss_gap_{a}_minus_e2e": stats([lo(r).final_loss - e(r).final_loss for r in done]),
            f"tokens_per_s_{a}_over_e2e": stats([ratio(lo(r).tokens_per_s, e(r).tokens_per_s) for r in done]),
            f"memory_growth_{a}_over_e2e": stats([ratio(lo(r).memory[1], e(r).memory[1]) for r in done]),
            f"peak_memory_{a}_over_e2e": stats([ratio(lo(r).memory[0], e(r).memory[0]) for r in done]),
            f"equal_tokens_gap_{a}_minus_e2e": stats(last_gap),
            f"time_to_target_{a}_over_e2e": stats(ttt),
        })
    agg["repeats_complete"] = len(done)
    report.update({"repeats_requested": cfg.seams.repeats, "seeds": [r["seed"] for r in runs], "repeats": repeats,
                   "aggregate": agg})
    return report


def _human_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _pm(s: dict | None, fmt: str) -> str:
    """mean, then ± the 95% half-width when there is one."""
    if not s:
        return "-"
    if s.get("ci95"):
        return f"{s['mean']:{fmt}} ± {(s['ci95'][1] - s['ci95'][0]) / 2:{fmt}}"
    return f"{s['mean']:{fmt}}"


def placement_block(devices: int, chosen: dict[str, str], speeds: dict[str, dict], source: str, seconds: float = 0.0,
                    spread: dict | None = None, measured_here: dict | None = None) -> dict:
    """The report's `placement` keys on every placement: the budget, where each arm ran, every
    candidate's speed (None: not measured), where the speeds come from and the calibration's
    seconds, the speeds measured on this host in this run (`measured_here`: every candidate's
    when calibrated now, a committed calibration's re-timed choices, none when named), and each
    other arm's speed where it ran over the fastest e2e candidate's (`local_over_best_e2e`; both
    from the same calibration)."""
    e2e = {n: v for n, v in speeds.get("e2e", {}).items() if v is not None}
    best = max(e2e, key=e2e.get) if e2e else None

    def over_best(arm):
        v = speeds.get(arm, {}).get(chosen.get(arm))
        return v / e2e[best] if best and v else None
    return {"devices": devices, "chosen": dict(chosen), "candidates": speeds, "source": source,
            "calibration_s": seconds, "calibration_spread": spread, "measured_here": measured_here or {},
            "fastest_e2e": best,
            **{f"{a}_over_best_e2e": over_best(a) for a in chosen if a != "e2e"}}


def placement_lines(pl: dict | None) -> list[str]:
    """The hardware budget, each arm's placement and the candidates' speeds, as text lines."""
    if not pl or pl.get("devices", 1) <= 1:
        return []
    lines = ["", f"placement on {pl['devices']} devices: e2e on {pl['chosen']['e2e']}, local on {pl['chosen']['local']} "
                 f"(speeds: {pl['source']}; calibration {pl['calibration_s']:.0f} s, outside the budgets)"]
    for arm, speeds in pl["candidates"].items():
        lines.append(f"  {arm}: " + ", ".join(f"{n} {'-' if v is None else f'{v:,.0f}'}" for n, v in speeds.items())
                     + " tok/s")
    for arm in pl["chosen"]:
        if pl.get(f"{arm}_over_best_e2e") is not None:
            lines.append(f"  {arm} on {pl['chosen'][arm]} over the fastest e2e ({pl['fastest_e2e']}): "
                         f"{pl[f'{arm}_over_best_e2e']:.2f}x")
    return lines


def _equal_token_lines(report: dict, names: list[str]) -> list[str]:
    """The first seed's held-out losses at equal tokens, gaps to e2e, and time to target."""
    reps = report.get("repeats") or []
    lines: list[str] = []
    if reps and reps[0].get("equal_tokens"):
        lines += ["", "held-out loss at equal tokens (seed " + str(reps[0]["seed"]) + "):",
                  "  tokens      " + "".join(f"{a:>10}" for a in names)
                  + "".join(f"{a + '-e2e':>14}" for a in names[1:])]
        for row in reps[0]["equal_tokens"]:
            lines.append(f"  {row['tokens']:>10,}" + "".join(f"{row[a]['loss']:>10.4f}" for a in names)
                         + "".join(f"{row[f'gap_{a}_minus_e2e']:>+14.4f}" for a in names[1:]))
        ttt = reps[0].get("time_to_target")
        if ttt:
            s = ttt["seconds"]
            fmt = (lambda v: "-" if v is None else f"{v:.1f} s")
            lines.append(f"time to held-out loss {ttt['target_loss']:.4f}: "
                         + ", ".join(f"{a} {fmt(s[a])}" for a in names))
    return lines


def summary_table(report: dict) -> str:
    """A plain-text view of a seams report: per arm (means ± 95% half-widths over seeds), the
    equal-token table, time to target, then traffic and the ratios."""
    kind = "vram" if report["arms"]["e2e"]["peak_vram_bytes"] is not None else "rss"
    agg = report.get("aggregate", {})
    n = agg.get("repeats_complete")
    rows = [("arm", "status", "steps", "tokens/s", "final loss", "ppl", "final lr", f"peak {kind}", "growth", "MFU")]
    for arm, a in report["arms"].items():
        ag = agg.get(arm, {})
        peak, growth = _mem(a)
        mfu = (a.get("costs") or {}).get("mfu")
        rows.append((arm, a.get("status", "complete"), f"{a['steps']:,}",
                     _pm(ag.get("tokens_per_s"), ",.0f") if ag.get("tokens_per_s") else f"{a['tokens_per_s']:,.1f}",
                     _pm(ag.get("final_loss"), ".4f") if ag.get("final_loss") else
                     ("-" if a["final_loss"] is None else f"{a['final_loss']:.4f}"),
                     "-" if a["final_ppl"] is None else f"{a['final_ppl']:.2f}",
                     "-" if a.get("lr_final") is None else f"{a['lr_final']:.2e}",
                     _human_bytes(peak), _human_bytes(growth), "-" if mfu is None else f"{mfu:.1%}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    if n is not None:
        lines.append(f"({n} seed{'s' if n != 1 else ''} {report.get('seeds')}; mean ± 95% half-width where n > 1; "
                     f"order {report.get('order')}, LR schedule {report.get('lr_schedule')}, "
                     f"optimizer {report.get('optimizer', 'adamw')})")
    names = list(report["arms"])
    lines += _equal_token_lines(report, names)
    p = agg.get("paired", {})
    for a in names[1:]:
        if p.get(f"loss_gap_{a}_minus_e2e"):
            lines.append(f"paired over seeds: loss gap {a}-e2e {_pm(p[f'loss_gap_{a}_minus_e2e'], '+.4f')}, "
                         f"tokens/s {a}/e2e {_pm(p.get(f'tokens_per_s_{a}_over_e2e'), '.3f')}, "
                         f"memory growth {a}/e2e {_pm(p.get(f'memory_growth_{a}_over_e2e'), '.3f')}")
    lines += placement_lines(report.get("placement"))
    b, ob = report["bytes"], report.get("objective_bytes", {})
    lines.append("")
    lines.append(f"traffic per step ({b['seams']} seams): e2e {_human_bytes(b['e2e_per_step'])} + allreduce "
                 f"{_human_bytes(b['e2e_allreduce_per_step'])}, local {_human_bytes(b['local_per_step'])}"
                 + (f" + {report.get('objective')} head traffic {_human_bytes(ob['extra_per_step'])}"
                    if ob.get("extra_per_step") else ""))
    lines.append(f"traffic e2e/local: {report['traffic_ratio_e2e_over_local']} with allreduce, "
                 f"{report.get('traffic_ratio_no_allreduce', '-')} without")
    for a in names[1:]:
        r = report.get(f"{a}_over_e2e", {})
        if r:
            tps = "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:.2f}x"
            mem = "-" if r.get("peak_memory") is None else f"{r['peak_memory']:.2f}x"
            gro = "-" if r.get("memory_growth") is None else f"{r['memory_growth']:.2f}x"
            lines.append(f"{a}/e2e: tokens/s {tps}, peak {r.get('memory_kind', kind)} {mem}, growth {gro}")
    costs = {a: report["arms"][a].get("costs") for a in report["arms"]}
    if all(costs.values()):
        lines.append("per token: " + ", ".join(
            f"{a} {c['flops_per_token'] / 1e6:.2f} MFLOP/step-token, {c['params'] + c['aux_head_params']:,} params"
            + (f" (aux heads {c['aux_head_params']:,}, {c['aux_head_forward_share']:.0%} of forward FLOPs)"
               if c["aux_head_params"] else "") for a, c in costs.items()))
    if report.get("wall_clock_dependent"):
        lines.append(WALL_CLOCK_NOTE)
    stopped = report.get("interrupted")
    lines.append(f"status: {report.get('status', 'complete')}"
                 + (f" ({stopped['signal']} in {stopped['phase']}; --resume continues it)" if stopped else ""))
    return "\n".join(lines)
