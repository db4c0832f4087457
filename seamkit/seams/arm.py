"""The e2e and local arms: how each is built, what one step does, and one arm's run for its budget
on the shared loop (`seamkit.loop`). The study that interleaves the arms, repeats seeds and
writes the report is `seams.study`; the arms' processes and their turns are `seams.processes`.

The reference's method (docs/reference.md): both arms start from the same weights
(`torch.manual_seed(train.seed)` right before `GPT(...)`), read the same batches in the same
order (`RowLoader` with the same seed), and train with AdamW for `train.budget_seconds` of
training clock or `train.max_steps` steps, whichever comes first. The LR schedule
(`optim.scheduled_lr`) follows the share of the budget spent by default, so each arm anneals
exactly when its own budget ends. Evaluation, checkpoints, snapshots, turn-taking and
callbacks run off the clock.

- e2e: plain backprop through the whole model, one global-norm gradient clip.
- local: `objectives.segment_losses` detaches h_BTC at every seam; each segment's loss is
  backpropagated as soon as its forward is done (which frees that segment's activations: the
  memory local saves) and reaches only what the segment owns (`cuts.segment_params`, plus its
  private module in `heads`). Clipping is per segment, over what it owns; the last segment's
  group holds the final norm and LM head, which under `shared_head` also carry every other
  segment's gradient.
  With no seams this is e2e, bit for bit.
- delayed (`seams.delayed`, not one of the study's ARMS): backprop whose gradients cross each
  seam `seams.delay` steps late, simulated exactly; `build_arm` and `train_step` hand it to that
  module, and its in-flight state rides in the checkpoint's `extra` ("delayed").
- Weight decay applies to matrices only (`optim.make_optimizer`). The GPT and the aux heads have
  separate AdamW instances, so a checkpoint's `optimizer` is the GPT's alone; the aux heads,
  their optimizer state and the class map ride in the checkpoint's `extra`.

Held-out loss: the mean LM loss over `held_out(corpus, cfg)` (the val split, `train.eval_tokens`
tokens in whole batches, the whole split when it is smaller), with its standard error over the
batches. Memory (`memory.Baseline`): the peak over training and its growth over the RSS (or
CUDA allocation) training started from; RSS is the arm's own only when it runs in a process of
its own (`own_process`). An arm ends `complete`, `failed` (a non-finite training loss:
`failed_step`, and no update from that step), `interrupted` (Ctrl-C or `stop()`: it stops
between steps and still checkpoints and reports) or, in a report, `not_run`.
Every checkpoint carries the loop's state (`budget_loop`'s `loop_state`), so an arm stopped
any way can continue where it was (`seams.resume`, `--resume`). The study adds "seed" to every event when it repeats seeds.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from seamkit import checkpoint
from seamkit.config import ConfigError, RunConfig
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader, epochs, repeat_warning
from seamkit.loop import Clock, budget_loop, evaluate_model, held_out
from seamkit.memory import Baseline
from seamkit.model import GPT, autocast, lm_loss, param_dtype, resolve_device
from seamkit.optim import make_optimizer, step_at
from seamkit.seams.cuts import parse_seams, segment_params, segments
from seamkit.seams.delayed import DelayedArm, build_delayed, delayed_step
from seamkit.seams.delayed import load_state_dict as load_delayed
from seamkit.seams.delayed import state_dict as delayed_state
from seamkit.seams.objectives import (
    class_map,
    make_aux_blocks,
    make_aux_heads,
    make_own_heads,
    segment_losses,
)
from seamkit.seams.result import ArmResult, curve
from seamkit.seams.resume import restore_arm

ARMS = ("e2e", "local")
PRIVATE = ("aux_head", "aux_block", "own_head")  # local objectives whose non-final segments own a module (`Arm.heads`)


@dataclass
class Arm:
    """Everything one arm trains, built by `build_arm`."""
    name: str  # "e2e" or "local"
    model: GPT
    opt: torch.optim.Optimizer  # the GPT's parameters only
    heads: nn.ModuleList | None  # local + aux_head, aux_block, own_head: one private module per non-final segment
    head_opt: torch.optim.Optimizer | None
    segs: list[list[int]]  # blocks of each segment; e2e: one segment
    groups: list[list[torch.nn.Parameter]]  # what each segment clips together
    classes: torch.Tensor | None  # aux_head, aux_block: token id -> class
    objective: str | None  # local objective; None for e2e
    device: torch.device
    dtype_name: str

    def autocast(self):
        return autocast(self.device, self.dtype_name)


def token_counts(corpus, split: str, vocab: int) -> np.ndarray:
    """How often each token id occurs in a split (in memory or token files: the corpus counts)."""
    return corpus.token_counts(split, vocab)


def build_arm(arm: str, cfg: RunConfig, corpus) -> Arm | DelayedArm:
    if arm == "delayed":  # seams.delayed: its own step and its in-flight state
        return build_delayed(cfg, corpus)
    if arm not in ARMS:
        raise ConfigError(f"unknown arm {arm!r}; choose one of {ARMS + ('delayed',)}")
    device, dtype = resolve_device(cfg.train.device), param_dtype(cfg.train.dtype)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model).to(device=device, dtype=dtype)
    if cfg.train.compile:  # compiled on the first step, inside the budget (meant for CUDA)
        from seamkit.accel import compile_model
        compile_model(model)
    local = arm == "local"
    segs = segments(parse_seams(cfg.seams.seams, cfg.model.n_blocks) if local else [], cfg.model.n_blocks)
    groups = [[p for _, p in owned] for owned in segment_params(model, segs)]
    heads = head_opt = classes = None
    objective = cfg.seams.objective
    if local and objective in PRIVATE and len(segs) > 1:
        n, k, seed = len(segs) - 1, cfg.seams.aux_classes, cfg.train.seed
        heads = (make_aux_heads(cfg.model, n, k, seed) if objective == "aux_head" else
                 make_aux_blocks(cfg.model, n, k, seed) if objective == "aux_block" else make_own_heads(model, n))
        heads = heads.to(device=device, dtype=dtype)
        head_opt = make_optimizer(heads, cfg.train)
        if objective != "own_head":  # own_head reads the vocabulary itself
            classes = class_map(token_counts(corpus, "train", cfg.model.vocab), cfg.seams.aux_classes).to(device)
        for k, head in enumerate(heads):
            groups[k] += list(head.parameters())
    return Arm(name=arm, model=model, opt=make_optimizer(model, cfg.train), heads=heads, head_opt=head_opt,
               segs=segs, groups=groups, classes=classes, objective=cfg.seams.objective if local else None,
               device=device, dtype_name=cfg.train.dtype)


def train_step(a: Arm | DelayedArm, x_BT: torch.Tensor, y_BT: torch.Tensor, lr: float, grad_clip: float) -> list[float]:
    """One optimizer step; returns each segment's training loss (e2e: one; delayed: `delayed_step`'s).

    A non-finite loss leaves the weights as they were (no update) for the caller to stop on.
    """
    if a.name == "delayed":
        return delayed_step(a, x_BT, y_BT, lr, grad_clip)
    if a.name == "e2e":
        with a.autocast():
            loss = lm_loss(a.model(x_BT), y_BT)
        loss.backward()
        losses = [loss.detach()]
    else:
        losses = []
        for loss in segment_losses(a.model, x_BT, y_BT, a.segs, a.objective, a.heads, a.classes,
                                   autocast=a.autocast):
            loss.backward()  # now, before the next segment runs: frees this segment's activations
            losses.append(loss.detach())
    values = torch.stack(losses).tolist()
    opts = [o for o in (a.opt, a.head_opt) if o is not None]
    if all(math.isfinite(v) for v in values):
        if grad_clip > 0:
            for group in a.groups:
                torch.nn.utils.clip_grad_norm_(group, grad_clip)
        step_at(opts, lr)
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    return values


def evaluate(a: Arm, batches) -> float:
    """Mean held-out LM loss of an arm's model as it stands."""
    return evaluate_model(a.model, batches, a.autocast)[0]


def checkpoint_path(out_path, arm: str, repeat: int = 0) -> Path:
    """Where the seams study leaves an arm's checkpoint: <dir>/checkpoints/<stem>_<arm>.pt
    (repeat k > 0 of a repeated study: <stem>_<arm>_r<k>.pt)."""
    out_path = Path(out_path)
    suffix = f"_r{repeat}" if repeat else ""
    return out_path.parent / "checkpoints" / f"{out_path.stem}_{arm}{suffix}.pt"


def run_arm(arm: str, cfg: RunConfig, corpus=None, callback: Callable[[dict], None] | None = None,
            checkpoint_path: str | os.PathLike | None = None, own_process: bool = False,
            stop: Callable[[], bool] = lambda: False, gate: Callable[[Clock, int], None] | None = None,
            after_step: Callable[[Arm, int, float], None] | None = None, resume_from: dict | None = None,
            save_extra: Callable[[], dict] | None = None) -> ArmResult:
    """Train one arm for the budget, evaluate it, checkpoint it; returns its metrics (unrounded).

    `own_process`: this process runs nothing else, so its peak RSS is the arm's (else the RSS
    keys are None). `stop`: polled every step; True ends the arm as interrupted. `gate` and
    `after_step` as for `budget_loop` (after_step also gets the arm). `resume_from`: a loaded
    checkpoint of this arm (`resume.load_arm`) to continue from: weights, both optimizers, RNG,
    data position and the loop's state. `save_extra()`: more plain data for every checkpoint's
    `extra` (the study's slices and snapshots).
    """
    tc = cfg.train
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    corpus = corpus if corpus is not None else load_corpus(cfg.data)
    a = build_arm(arm, cfg, corpus)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, tc.seed, device=a.device)
    batches = held_out(corpus, cfg, device=a.device)
    if resume_from is not None:
        restore_arm(resume_from, a, loader)
        if arm == "delayed":
            load_delayed(a, resume_from["extra"]["delayed"])
    callback = callback or (lambda event: None)
    callback({"kind": "start", "arm": arm, "budget_seconds": tc.budget_seconds, "max_steps": tc.max_steps,
              "tokens_per_step": cfg.data.batch * cfg.model.seq, "segments": a.segs, "objective": a.objective})

    def save(step: int, loop_state: dict | None = None, status: str = "running") -> str | None:
        if checkpoint_path is None:
            return None
        extra = {"arm": arm, "status": status, "resume": loop_state, **(save_extra() if save_extra else {}),
                 "objective": a.objective, "segments": a.segs, "classes": a.classes,
                 "aux_heads": a.heads.state_dict() if a.heads is not None else None,
                 "aux_optimizer": a.head_opt.state_dict() if a.head_opt is not None else None,
                 **({"delayed": delayed_state(a)} if arm == "delayed" else {})}  # its gradients in flight
        ckpt_id = checkpoint.save(checkpoint_path, a.model, a.opt, cfg, step=step,
                                  data_state=loader.state_dict(), extra=extra)
        return checkpoint.ref(checkpoint_path, ckpt_id)

    sync = (lambda: torch.cuda.synchronize(a.device)) if a.device.type == "cuda" else (lambda: None)
    memory = Baseline.start(a.device)
    clock = Clock(sync)

    def emit(event: dict) -> None:
        with clock.paused():
            callback({"arm": arm, **event})

    run = budget_loop(lambda x_BT, y_BT, lr: train_step(a, x_BT, y_BT, lr, tc.grad_clip), loader, tc, clock, emit, stop=stop, save=save, gate=gate,
                      after_step=(lambda steps, t: after_step(a, steps, t)) if after_step else None,
                      resume=resume_from["extra"]["resume"] if resume_from is not None else None)
    mem = memory.measure()
    if not own_process:
        mem.update(peak_rss_bytes=None, rss_start_bytes=None, rss_growth_bytes=None)
    final_loss = final_stderr = None
    if run["status"] == "complete":
        try:
            final_loss, final_stderr = evaluate_model(a.model, batches, a.autocast)
        except KeyboardInterrupt:
            run["status"] = "interrupted"
    if final_loss is not None and not math.isfinite(final_loss):
        final_loss = final_stderr = None
    ref = save(run["steps"], run.pop("resume"), run["status"])
    tokens = run["steps"] * cfg.data.batch * cfg.model.seq
    repeated = repeat_warning(arm, tokens, corpus)
    if repeated:
        print(f"seamkit: warning: {repeated}", file=sys.stderr)
    result = ArmResult(
        arm=arm, status=run["status"], steps=run["steps"], tokens=tokens, elapsed_s=run["elapsed_s"],
        tokens_per_s=tokens / run["elapsed_s"] if run["elapsed_s"] > 0 else 0.0,
        final_loss=final_loss, final_loss_stderr=final_stderr, eval_tokens=len(batches) * cfg.data.batch * cfg.model.seq,
        **mem, lr_final=run["lr_final"], max_step_s=run["max_step_s"], failed_step=run["failed_step"],
        objective=a.objective, segments=a.segs, **curve(run["points"]), epochs=epochs(tokens, corpus),
        repeat_warning=repeated, checkpoint=ref, checkpoint_path=str(checkpoint_path) if checkpoint_path else None,
        wall_clock_dependent=run["wall_clock_dependent"])
    callback({"kind": "end", "arm": arm, "status": run["status"], "result": result})
    return result
