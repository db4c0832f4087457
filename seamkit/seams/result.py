"""`ArmResult`: what one arm's run returns on every placement, unrounded.

One process (`arm.run_arm`), the study's mean over seeds (`report.mean_result`) and a pipeline
run's ranks (`pipeline.assemble.arm_result`) all build this one type, and the report's arm block
(`report.report_arm`) is read from it alone, so a key means the same thing on every placement.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field


@dataclass
class ArmResult:
    arm: str  # "e2e" or "local"
    status: str  # complete | failed (a non-finite loss) | interrupted (Ctrl-C, stop())
    steps: int  # optimizer steps taken
    tokens: int  # steps * batch * seq
    elapsed_s: float  # training clock: turns, evaluation and checkpoints excluded
    tokens_per_s: float
    final_loss: float | None  # mean held-out LM loss after training (None unless complete)
    final_loss_stderr: float | None  # its standard error over the held-out batches
    eval_tokens: int  # tokens the held-out loss was measured on
    # memory: the peak, and the growth over what training started from (CUDA's allocator on a GPU,
    # the process's RSS on CPU; RSS is None where the arm shared its process with something else)
    peak_vram_bytes: int | None
    vram_growth_bytes: int | None
    peak_rss_bytes: int | None
    rss_start_bytes: int | None
    rss_growth_bytes: int | None
    lr_final: float | None  # the LR of the last step
    max_step_s: float  # the longest step
    failed_step: int | None  # the step whose loss was non-finite
    objective: str | None  # local objective; None for e2e
    segments: list  # blocks of each segment (e2e: one)
    # the loss curve: one point per mark (see seamkit.loop), the step's training loss before its update
    loss_curve: list = field(default_factory=list)
    loss_curve_steps: list = field(default_factory=list)
    loss_curve_elapsed_s: list = field(default_factory=list)
    loss_curve_tokens: list = field(default_factory=list)
    loss_curve_lr: list = field(default_factory=list)
    loss_curve_segments: list = field(default_factory=list)  # every segment's loss at each point
    loss_curve_std: list | None = None  # across seeds, in a mean over seeds
    epochs: float | None = None  # passes over the training split
    repeat_warning: str | None = None
    checkpoint: str | None = None  # "path#id" of the last checkpoint
    # the clock set an LR or ended the run (seamkit.loop): the same command ends on other weights
    wall_clock_dependent: bool | None = None
    checkpoint_path: str | None = None
    failed_rank: int | None = None  # pipeline stages: the rank whose segment failed
    placement: str | None = None  # where it ran (seams.placement): single, dp, pipe:SCHEDULE:M, stages
    # a multi-process arm's measured traffic per step: activations and gradients across its
    # crossings (pipe, stages) or the gradient allreduce (dp), and its ranks' wait share
    wire: dict | None = None
    slices: list | dict | None = None  # interleaved study: tokens/s of each turn (a summary in a mean)
    snapshots: list | None = None  # interleaved study: weights kept for the equal-token view
    compile_s: float | None = None  # compiling and warming up before the clock started (None: not compiled)

    @property
    def final_ppl(self) -> float | None:
        return math.exp(self.final_loss) if self.final_loss is not None else None

    @property
    def memory(self) -> tuple[int | None, int | None]:
        """(peak, growth over the arm's baseline): CUDA's allocator on a GPU, the process's RSS on CPU."""
        if self.peak_vram_bytes is not None:
            return self.peak_vram_bytes, self.vram_growth_bytes
        return self.peak_rss_bytes, self.rss_growth_bytes

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ArmResult":
        """From `to_dict()` or an earlier seamkit's arm dict: keys that are no fields (`final_ppl`,
        derived here) are dropped."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def curve(points: list[dict]) -> dict:
    """The loss-curve fields of an ArmResult from the loop's points."""
    return {"loss_curve": [p["loss"] for p in points], "loss_curve_steps": [p["step"] for p in points],
            "loss_curve_elapsed_s": [p["elapsed_s"] for p in points],
            "loss_curve_tokens": [p["tokens"] for p in points], "loss_curve_lr": [p["lr"] for p in points],
            "loss_curve_segments": [p["segment_losses"] for p in points]}


# ----------------------------------------------------------------------------- from the ranks

def from_ranks(cfg, lay, ranks: list[dict]) -> ArmResult:
    """One arm's result from what each of its ranks returned (`ranks.RankLoop.result`). Memory is
    the largest rank's (what one device must hold), its growth the largest over a rank's own start;
    the rank holding the LM head gives the curve and the held-out loss."""
    from seamkit.seams.placement import arm_segments
    from seamkit.seams.policy import policy
    per_step = cfg.data.batch * cfg.model.seq
    lossr = ranks[lay.loss_rank]
    statuses = [r["status"] for r in ranks]
    status = "interrupted" if "interrupted" in statuses else "failed" if "failed" in statuses else "complete"
    elapsed = max(r["elapsed_s"] for r in ranks)  # all ranks start together (one barrier)
    steps = lossr["steps"]
    culprit = next((r for r in ranks if r["failed_here"]), None)

    def largest(key):
        vals = [r[key] for r in ranks if r[key] is not None]
        return max(vals) if vals else None
    pol = policy(lay.arm, cfg.seams)
    return ArmResult(
        arm=lay.arm, status=status, steps=steps, tokens=steps * per_step, elapsed_s=elapsed,
        tokens_per_s=steps * per_step / elapsed if elapsed > 0 else 0.0,
        final_loss=lossr["final_loss"], final_loss_stderr=lossr["final_loss_stderr"], eval_tokens=lossr["eval_tokens"],
        **{k: largest(k) for k in ("peak_vram_bytes", "vram_growth_bytes", "peak_rss_bytes", "rss_start_bytes",
                                   "rss_growth_bytes")},
        lr_final=lossr["lr_final"], max_step_s=max(r["max_step_s"] for r in ranks),
        failed_step=culprit["failed_step"] if culprit else (lossr["failed_step"] if status == "failed" else None),
        failed_rank=culprit["rank"] if culprit and lay.ranks > 1 else None,
        objective=pol.objective, segments=arm_segments(cfg, lay.arm), **curve(lossr["points"]),
        # rank 0 alone sees the clock end the run; any rank's clock may set its LR
        wall_clock_dependent=any(r["wall_clock_dependent"] for r in ranks),
        placement=lay.placement.name, slices=ranks[0].get("slices") or [],
        compile_s=largest("compile_s") if any("compile_s" in r for r in ranks) else None)
