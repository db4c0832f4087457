"""The seams report of a pipeline run, from what every rank returned for each arm.

`seams.report.build_report`'s keys, plus: the stages, the backend, the e2e schedule and its micro-
batches (the comparison names them), the placement of the e2e segments, `measured_bytes` per
arm (counted, against the analytic bytes of that arm's crossings; `bytes` stays the traffic of
every seam, one segment a device, and `bytes_per_step_crossings` is what local's rank crossings
carry here), `per_rank` compute, wait and
unaccounted time, `bubble` (the wait share of all ranks' time), memory per rank (peak and growth
over the arm's own start), and for a failed arm the rank and step that failed.
"""

from __future__ import annotations

import torch

from seamkit import config as C
from seamkit.config import RunConfig
from seamkit.seams.cuts import traffic_bytes, traffic_ratios
from seamkit.seams.pipeline.delayed import expected_traffic
from seamkit.seams.pipeline.plan import WIRE_DTYPES, Plan, arm_objective
from seamkit.seams.pipeline.wire import measured_bytes
from seamkit.seams.report import build_report, placement_block
from seamkit.seams.result import ArmResult, curve


def arm_result(arm: str, cfg: RunConfig, plan: Plan, ranks: list[dict], kind: str | None = None) -> ArmResult:
    """One arm's result from its ranks (`kind`: what they ran, seams.placement; default the arm's
    own pipeline run). Memory is the largest rank's (what one device must hold), its growth the
    largest growth over a rank's own start."""
    per_step = cfg.data.batch * cfg.model.seq
    kind = kind or ("pipe" if arm == "e2e" else "stages")
    # the rank holding the LM head reports the curve and the held-out loss (data parallel: rank 0)
    lossr = ranks[0] if kind == "dp" else ranks[(plan.owner if kind == "pipe" else plan.local_owner)[-1]]
    statuses = [r["status"] for r in ranks]
    status = "interrupted" if "interrupted" in statuses else "failed" if "failed" in statuses else "complete"
    elapsed = max(r["elapsed_s"] for r in ranks)  # all ranks start together (a barrier)
    steps = lossr["steps"]
    culprit = next((r for r in ranks if r["failed_here"]), None)

    def largest(key):
        vals = [r[key] for r in ranks if r[key] is not None]
        return max(vals) if vals else None
    return ArmResult(
        arm=arm, status=status, steps=steps, tokens=steps * per_step, elapsed_s=elapsed,
        tokens_per_s=steps * per_step / elapsed if elapsed > 0 else 0.0,
        final_loss=lossr["final_loss"], final_loss_stderr=lossr["final_loss_stderr"],
        eval_tokens=lossr["eval_tokens"],
        **{k: largest(k) for k in ("peak_vram_bytes", "vram_growth_bytes", "peak_rss_bytes", "rss_start_bytes",
                                   "rss_growth_bytes")},
        lr_final=lossr["lr_final"], max_step_s=max(r["max_step_s"] for r in ranks),
        failed_step=culprit["failed_step"] if culprit else None, failed_rank=culprit["rank"] if culprit else None,
        objective=arm_objective(arm, cfg),
        segments=[list(range(cfg.model.n_blocks))] if arm == "e2e" else plan.segs, **curve(lossr["points"]),
        # rank 0 alone sees the clock end the run; any rank's clock may set its LR
        wall_clock_dependent=any(r["wall_clock_dependent"] for r in ranks))


def delayed_wire(cfg: RunConfig, plan: Plan, ranks: list[dict], act: int) -> dict:
    """The delayed arm's traffic: activations forward every step, gradients back from the step
    each crossing's first one comes (`delayed.expected_traffic`); sent must equal received."""
    steps = ranks[0]["wire_steps"]
    sent = {k: 0 for k in ("activation", "gradient")}
    got = dict(sent)
    for r in ranks:
        for c in r["traffic"]:
            if c["kind"] in sent:
                (sent if c["direction"] == "sent" else got)[c["kind"]] += c["bytes"]
    expected = expected_traffic(plan, cfg.seams.delay, steps)
    analytic = {k: sum(e[k] for e in expected.values()) * act for k in sent}
    return {"kind": "activations and gradients, late", "bytes_per_step": (sent["activation"] + sent["gradient"]) / steps
            if steps else 0, "analytic_bytes_per_step": 2 * len(plan.local_crossings()) * act,
            "crossings": len(plan.local_crossings()), "agrees": sent == got == analytic}


def act_bytes(cfg: RunConfig, plan: Plan) -> int:
    """The bytes of one step's h_BTC at the wire dtype."""
    return cfg.data.batch * cfg.model.seq * cfg.model.dim * \
        torch.empty((), dtype=WIRE_DTYPES[plan.wire_dtype]).element_size()


def arm_measured(arm: str, cfg: RunConfig, plan: Plan, ranks: list[dict]) -> dict:
    """`wire.measured_bytes` over the crossings of the e2e or local arm's stages."""
    if arm == "e2e":
        return measured_bytes(arm, ranks, plan.crossings(), plan.owner, act_bytes(cfg, plan), plan.micro_batches)
    # only the seams between ranks reach the wire; a seam inside a rank is a detach
    return measured_bytes(arm, ranks, plan.local_crossings(), plan.local_owner, act_bytes(cfg, plan), 1)


def arm_wire(arm: str, kind: str, cfg: RunConfig, plan: Plan, ranks: list[dict]) -> dict:
    """What one multi-process arm put on the wire per step (measured), beside the analytic bytes,
    and the share of its ranks' time spent waiting (the bubble)."""
    wait = sum(r["wait_s"] for r in ranks) / max(1e-12, sum(r["elapsed_s"] for r in ranks))
    if kind == "dp":
        a = ranks[0]["allreduce"]
        return {"kind": "allreduce", "bytes_per_step": a["bytes_per_step"],
                "analytic_bytes_per_step": a["analytic_bytes_per_step"], "allreduce_s": a["seconds"],
                "wait_share": wait}
    if arm == "delayed":
        return delayed_wire(cfg, plan, ranks, act_bytes(cfg, plan)) | {"wait_share": wait}
    m = arm_measured(arm, cfg, plan, ranks)
    return {"kind": "activations and gradients" if arm == "e2e" else "activations", "bytes_per_step": m["per_step"],
            "analytic_bytes_per_step": m["analytic_per_step"], "crossings": m["crossings"],
            "agrees": m["agrees"] and m["sent_equals_received"], "wait_share": wait}


def assemble(cfg: RunConfig, plan: Plan, parts: dict, backend: str, isolation: str,
             failure: dict | None = None, results: dict | None = None) -> dict:
    """The report. `parts`: arm -> the ranks' results; `failure`: a rank that raised or died
    ({"arm", "rank", "step", "error"}), which makes its arm `failed` without per-rank results;
    `results`: each arm's `arm_result` of its parts, where the caller has them already."""
    seams_cfg = C.override(cfg, {"seams.seams": ",".join(map(str, plan.seams)) or "none",
                                 "seams.stages": plan.stages})
    if results is None:
        results = {arm: arm_result(arm, cfg, plan, ranks) for arm, ranks in parts.items()}
    interrupted = any(r.status == "interrupted" for r in results.values())
    report = build_report(seams_cfg, results, interrupted=interrupted)
    if failure is not None:
        a = report["arms"][failure["arm"]]
        a.update(status="failed", failed_rank=failure["rank"], failed_step=failure["step"], error=failure["error"])
        report["status"] = "failed"
    wire_bytes = torch.empty((), dtype=WIRE_DTYPES[plan.wire_dtype]).element_size()
    B, m = cfg.data.batch, cfg.model
    b = traffic_bytes(m, B, len(plan.seams), act_bytes=wire_bytes)
    report["bytes"] = b
    report.update(traffic_ratios(b))
    act = act_bytes(cfg, plan)
    measured = {arm: arm_measured(arm, cfg, plan, ranks) for arm, ranks in parts.items()}
    chosen = {"e2e": f"pipe:{plan.schedule}:{plan.micro_batches}", "local": "stages"}
    report["placement"] = placement_block(plan.stages, chosen, {a: {n: None} for a, n in chosen.items()},
                                       "named: the arms on real stages, one after the other")
    report.update({
        "stages": plan.stages,
        "backend": backend,
        "wire_dtype": plan.wire_dtype,
        "wire_bytes_per_value": wire_bytes,
        "bytes_reference_bf16": traffic_bytes(m, B, len(plan.seams)),
        # `bytes` counts every seam (one segment a device); this placement's crossings carry this much
        "bytes_per_step_crossings": {"local": len(plan.local_crossings()) * act,
                                     "local_crossings": plan.local_crossings()},
        "micro_batches": plan.micro_batches,
        "queue": plan.queue,
        "pipeline_schedule": {"e2e": plan.schedule, "micro_batches": plan.micro_batches, "virtual_stages": plan.virtual,
                     "e2e_segments": plan.e2e_segs, "e2e_owner": plan.owner, "crossings": len(plan.crossings()),
                     "local": f"async, at most {plan.queue} steps of sends in flight"},
        "comparison": f"local vs e2e {plan.schedule} with {plan.micro_batches} micro-batches on {plan.stages} stages",
        "arm_isolation": isolation,
        "measured_bytes": measured,
        "measured_matches_analytic": bool(measured) and all(x["agrees"] and x["sent_equals_received"]
                                                            for x in measured.values()),
        "per_rank": {arm: [{k: v for k, v in r.items() if k != "points"} | {
            "wait_share": r["wait_s"] / r["elapsed_s"] if r["elapsed_s"] > 0 else 0.0} for r in ranks]
            for arm, ranks in parts.items()},
        "bubble": {arm: sum(r["wait_s"] for r in ranks) / max(1e-12, sum(r["elapsed_s"] for r in ranks))
                   for arm, ranks in parts.items()},
    })
    return report


def summary(report: dict) -> str:
    """Lines to print under `seams.report.summary_table`: the schedule, measured bytes and bubbles."""
    s, lines = report["pipeline_schedule"], []
    for arm, m in report["measured_bytes"].items():
        what = f"e2e {s['e2e']}, {s['micro_batches']} micro-batches" if arm == "e2e" else "local"
        lines.append(f"{what}: measured {m['per_step']:,} B/step over {m['crossings']} crossing(s), analytic "
                     f"{m['analytic_per_step']:,}; bubble {report['bubble'][arm]:.3f}")
    lines.append(f"measured bytes agree with the analytic ones: {report['measured_matches_analytic']}")
    return "\n".join(lines)
