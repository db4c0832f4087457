"""What both studies share about optimization: the optimizer (AdamW, or Muon with AdamW) and the LR schedule.

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


def make_optimizer(module: nn.Module, tc: TrainConfig, segments: list[list] | None = None, nesterov: float = 0.0):
    """`train.optimizer`'s optimizer over `module`'s parameters: AdamW (`adamw`), or Muon on the
    blocks' weight matrices and AdamW on the rest (`muon`, `MuonAdamW`). `segments`: the
    parameters as parts (each segment's), each in groups of its own tagged `segment` (the index),
    so a part can run at an LR of its own (`step_at`'s `lr_scale`). `nesterov` > 0 (AdamW only):
    NAdamW, AdamW with Nesterov momentum, at that beta1 (`seams.nesterov_momentum`).

    AdamW decays matrices (dim >= 2) and not norms and biases (nanoGPT's rule), with the fused
    kernel (one vectorized pass per tensor) where the parameters' device has one: on CPU torch's
    default is a per-tensor loop of small ops, about 10x slower (0.25 s against 0.025 s a step on
    the 39M parameters of a Qwen-vocabulary embedding and head). Both update each tensor on its
    own (AdamW elementwise, Muon one matrix at a time), so neither depends on how the parameters
    are grouped or split into stages: every placement trains what one process trains.
    """
    params = list(module.parameters())
    parts = [params] if segments is None else segments
    if tc.optimizer == "muon":
        hidden = hidden_matrices(module)
        if hidden:
            split = [[p for p in part if any(p is h for h in hidden)] for part in parts]
            rest = [[p for p in part if all(p is not h for h in hidden)] for part in parts]
            return MuonAdamW(split, _adamw(rest, tc, segments is not None), tc, segments is not None)
    return _adamw(parts, tc, segments is not None, nesterov)


def _adamw(parts: list[list], tc: TrainConfig, tagged: bool, nesterov: float = 0.0) -> torch.optim.Optimizer:
    """AdamW over `parts` (lists of parameters): a decay and a no-decay group each, tagged with
    their part's index as `segment` where `tagged`. `nesterov` > 0: torch's NAdam with decoupled
    weight decay (NAdamW) at beta1 = `nesterov` instead, as Ajanthan et al. (ICML 2025) train the
    stages of an asynchronous pipeline (its foreach kernel: NAdam has no fused one)."""
    params = [p for part in parts for p in part]
    fused = bool(params) and all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params)
    groups = []
    for k, part in enumerate(parts):
        tag = {"segment": k} if tagged else {}
        groups += [{"params": [p for p in part if p.dim() >= 2], "weight_decay": tc.weight_decay, **tag},
                   {"params": [p for p in part if p.dim() < 2], "weight_decay": 0.0, **tag}]
    if nesterov > 0:
        return torch.optim.NAdam(groups, lr=tc.lr, betas=(nesterov, tc.beta2), decoupled_weight_decay=True)
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), fused=fused or None)


def hidden_matrices(module: nn.Module) -> list[nn.Parameter]:
    """The weight matrices of the linear layers inside transformer blocks (`model.Block`): what
    Muon trains. The embedding, the LM head, norms, biases and the aux heads' classifiers are not."""
    from seamkit.model import Block
    out, seen = [], set()
    for m in module.modules():
        if isinstance(m, Block):
            for lin in m.modules():
                if isinstance(lin, nn.Linear) and id(lin.weight) not in seen:
                    seen.add(id(lin.weight))
                    out.append(lin.weight)
    return out


class MuonAdamW:
    """Muon over `hidden` and an AdamW over the rest, stepped as one optimizer: one list of
    param groups (Muon's first, each with `lr_ratio`, its peak LR over AdamW's, which `step_at`
    scales the schedule's LR by), one state dict holding both."""

    def __init__(self, hidden: list[list], adamw: torch.optim.AdamW, tc: TrainConfig, tagged: bool):
        groups = [{"params": part, "lr_ratio": tc.muon_lr / tc.lr, **({"segment": k} if tagged else {})}
                  for k, part in enumerate(hidden) if part]
        self.muon = torch.optim.Muon(groups, lr=tc.muon_lr, weight_decay=tc.weight_decay, momentum=tc.muon_momentum)
        self.adamw = adamw
        self._parts = (self.muon, self.adamw)

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self):
        return {**self.muon.state, **self.adamw.state}

    @torch.no_grad()
    def step(self, closure=None):
        for part in self._parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self._parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError("not the state of a Muon and AdamW pair (trained with train.optimizer=adamw?)")
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def state_bytes(opts) -> int:
    """Bytes of optimizer state (moments, momentum buffers) the optimizers `opts` hold now."""
    return sum(t.numel() * t.element_size() for o in opts for s in o.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


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


def step_at(opts, lr: float, found_inf: torch.Tensor | None = None) -> None:
    """One step of every optimizer in `opts` at learning rate `lr` (the one place an update sets it;
    a group runs at that times its `lr_ratio`, the optimizer's peak over AdamW's, and its
    `lr_scale`, a correction of its own: both 1 where absent, which is exact). `found_inf`: a
    float32 scalar on the parameters' device; where it is 1 the step leaves every parameter and
    every state tensor as it was (`masked_step`), decided on the device, with no host read."""
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = lr * g.get("lr_ratio", 1.0) * g.get("lr_scale", 1.0)
        if found_inf is None:
            opt.step()
        else:
            masked_step(opt, found_inf)


# what a state tensor holds before an optimizer's first step (torch's Adam family, NAdam, Muon)
_INITIAL_STATE = {"step": 0.0, "mu_product": 1.0}


@torch.no_grad()
def masked_step(opt, found_inf: torch.Tensor) -> None:
    """`opt.step()`, undone on the device where found_inf is 1. Fused AdamW takes the flag itself
    (its kernel skips the update and its step count, as under a GradScaler). Any other optimizer
    (Muon, NAdamW, the foreach AdamW) steps, then every tensor the step could change goes back to
    its copy from before the step where the flag is up: a `torch.where` per tensor, exact either
    way; state that the step created goes back to what the optimizer starts from."""
    if isinstance(opt, MuonAdamW):
        for part in opt._parts:
            masked_step(part, found_inf)
        return
    if isinstance(opt, torch.optim.AdamW) and opt.defaults.get("fused"):
        opt.found_inf = found_inf
        try:
            opt.step()
        finally:
            del opt.found_inf
        return
    params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
    fresh = [p for p in params if not opt.state.get(p)]
    kept = params + [t for p in params if opt.state.get(p) for t in opt.state[p].values() if torch.is_tensor(t)]
    before = [t.clone() for t in kept]
    opt.step()
    up = found_inf > 0
    for t, old in zip(kept, before):
        torch.where(up.to(t.device), old, t, out=t)
    for p in fresh:
        for key, t in opt.state[p].items():
            if torch.is_tensor(t):
                torch.where(up.to(t.device), torch.full_like(t, _INITIAL_STATE.get(key, 0.0)), t, out=t)
