"""What both studies share about optimization: AdamW's parameter groups and the LR schedule.

Two schedules (`train.lr_schedule`), both linear warm-up then cosine decay to `min_lr_frac * lr`:

- "steps": warm-up over `warmup_steps`, cosine over the next `decay_steps` (the same steps for
  every arm, so an arm that steps faster is further down its schedule when its budget ends).
- "budget" (default): the schedule follows *progress* p in [0, 1], the share of the wall-clock
  budget spent, or of `max_steps` when that binds first (`schedule_progress`). The LR warms up
  from the floor to the peak over p in [0, warmup_frac], then follows the cosine to the floor,
  reached at p = 1: each arm anneals exactly when its own budget ends, whatever its step rate
  (budgeted training: Li, Yumer and Ramanan, "Budgeted Training", ICLR 2020).

A loop calls `scheduled_lr(step, elapsed_s, tc)` with its training clock at the start of the
step; `lr_at(step, tc)` and `lr_at_progress(p, tc)` are the two schedules themselves.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from seamkit.config import TrainConfig

FUSED_DEVICES = ("cpu", "cuda")  # where torch's fused AdamW kernel runs


def make_optimizer(module: nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW with decay on matrices (dim >= 2) and none on norms and biases (nanoGPT's rule).

    The fused kernel (one vectorized pass per tensor) where the parameters' device has one: on
    CPU torch's default is a per-tensor loop of small ops, about 10x slower (0.25 s against
    0.025 s a step on the 39M parameters of a Qwen-vocabulary embedding and head). Its update
    is elementwise, so it does not depend on how the parameters are grouped or split into
    stages; every step the kit compares (pruned, reference, pipelined) uses this optimizer.
    """
    params = list(module.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    fused = bool(params) and all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params)
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=tc.lr, betas=(tc.beta1, tc.beta2), fused=fused or None)


def _cosine(t: float, tc: TrainConfig) -> float:
    """lr at t in [0, 1] of the cosine: the peak at 0, the floor at 1."""
    return tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def lr_at(step: int, tc: TrainConfig) -> float:
    """The step schedule: linear warm-up to lr over warmup_steps, then cosine over decay_steps."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    return _cosine(min(1.0, (step - tc.warmup_steps) / max(1, tc.decay_steps)), tc)


def lr_at_progress(progress: float, tc: TrainConfig) -> float:
    """The budget schedule at progress p in [0, 1]: floor -> peak over [0, warmup_frac], cosine to the floor at 1."""
    p = min(1.0, max(0.0, progress))
    w = tc.warmup_frac
    if p < w:
        return tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * p / w)
    return _cosine((p - w) / (1 - w), tc)


def schedule_progress(step: int, elapsed_s: float, tc: TrainConfig) -> float:
    """Share of the run spent at the start of `step`: of the budget, or of max_steps if further along."""
    by_time = elapsed_s / tc.budget_seconds if tc.budget_seconds > 0 else 0.0
    by_steps = step / tc.max_steps if tc.max_steps > 0 else 0.0
    return min(1.0, max(by_time, by_steps))


def clock_sets_lr(step: int, elapsed_s: float, tc: TrainConfig) -> bool:
    """Whether the training clock, not the step count, sets this step's LR: the budget schedule
    with its progress by time ahead of its progress by steps (before the floor at p = 1)."""
    if tc.lr_schedule != "budget" or tc.budget_seconds <= 0:
        return False
    by_time = elapsed_s / tc.budget_seconds
    by_steps = step / tc.max_steps if tc.max_steps > 0 else 0.0
    return by_time > by_steps and by_steps < 1.0


def scheduled_lr(step: int, elapsed_s: float, tc: TrainConfig) -> float:
    """The LR of `step`, which starts `elapsed_s` training seconds into the run, under `tc.lr_schedule`."""
    if tc.lr_schedule == "steps":
        return lr_at(step, tc)
    return lr_at_progress(schedule_progress(step, elapsed_s, tc), tc)


def step_at(opts, lr: float) -> None:
    """One step of every optimizer in `opts` at learning rate `lr` (the one place an update sets it)."""
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
