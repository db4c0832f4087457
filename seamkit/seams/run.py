"""`seamkit train`: one e2e arm for the budget, its checkpoint and its summary.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from seamkit.config import Placement, RunConfig, override
from seamkit.interrupts import interrupts
from seamkit.lock import held
from seamkit.loop import ProgressBars, fanout
from seamkit.report import provenance, write_json
from seamkit.seams import resume as R
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.threads import resolve_threads
from seamkit.tracking import check as check_trackers
from seamkit.tracking import tracked


def train_run(cfg: RunConfig, out_dir, callback: Callable[[dict], None] | None = None,
              progress: bool = True, resume: bool = False) -> dict:
    """Train e2e for the budget; writes out_dir/checkpoint.pt and out_dir/summary.json; returns the summary.

    `resume`: continue the run that out_dir/checkpoint.pt stopped (`seams.resume`). One run writes
    `out_dir` at a time (`seamkit.lock`). Ctrl-C or SIGTERM stops between steps (a second one at
    once), so the checkpoint it leaves can be resumed. `train.log_to`: the curves also go to
    out_dir/runs/<out_dir's name>/e2e-seed<N> (`seamkit.tracking`).
    `summary["wall_clock_dependent"]`: the clock set an LR or ended the run (`seamkit.loop`), so
    the same command ends on another checkpoint; False: the checkpoint is a function of the config.
    """
    out_dir = Path(out_dir)
    check_trackers(cfg)  # train.log_to without its package: one line before anything starts
    with held(out_dir / ".lock", f"run {out_dir}"), interrupts() as it, \
            tracked(cfg, out_dir / "runs", out_dir.resolve().name, resume) as tracker:
        return _train(cfg, out_dir, fanout(tracker, callback), progress, resume, it)


def _train(cfg: RunConfig, out_dir: Path, callback, progress: bool, resume: bool, it) -> dict:
    ckpt = None
    if resume:
        path = R.check_run(out_dir)
        status = R.peek(path, cfg, "e2e")
        if status in R.ENDED:
            raise R.ResumeError(f"nothing to resume in {out_dir}: its run ended {status}")
        ckpt = R.load_arm(path, cfg, "e2e")
    if cfg.train.threads == 0:  # chosen once; a resumed run keeps the count it started with
        started = ckpt["run_config"].train.threads if ckpt is not None else 0
        cfg = override(cfg, {"train.threads": started or resolve_threads(0)})
    R.clean_run(out_dir)
    cb = fanout(callback, ProgressBars() if progress else None)
    spec = ArmSpec("e2e", cfg, Placement("single"), 1, str(out_dir / "checkpoint.pt"), resume=resume,
                   own_process=False)
    it.enter("training", urgent=False)
    r = run_arm(spec, emit=cb, stop=it)
    summary = {
        "status": r.status, "steps": r.steps, "tokens": r.tokens, "elapsed_s": r.elapsed_s,
        "tokens_per_s": r.tokens_per_s, "val_loss": r.final_loss, "val_ppl": r.final_ppl,
        "failed_step": r.failed_step, "checkpoint": r.checkpoint, "peak_vram_bytes": r.peak_vram_bytes,
        "batch": cfg.data.batch, "budget_seconds": cfg.train.budget_seconds,
        "epochs": r.epochs, "repeat_warning": r.repeat_warning,
        # the clock set an LR or ended the run (seamkit.loop): the same command ends on other weights
        "wall_clock_dependent": r.wall_clock_dependent,
        **{k: getattr(r, k) for k in ("loss_curve", "loss_curve_steps", "loss_curve_elapsed_s", "loss_curve_tokens")},
        **provenance(cfg),
    }
    if r.status == "interrupted":
        summary["interrupted"] = {"phase": it.interrupted_in or it.phase, "signal": it.name or "SIGINT"}
    write_json(out_dir / "summary.json", summary)
    return summary
