"""One training step of the pruning study, run from a checkpoint without changing it.

A step is forward, backward and AdamW's step. `mode_loss` says what each mode's step computes:
`base` the unpruned step, `prune_exact` the pruned step of cfg.prune.exact (`arithmetic`:
seamkit.pruning.rules; `bitwise`: seamkit.pruning.bitwise). A `Stepper` holds one working model
and optimizer and resets both from the checkpoint's tensors before every step, so every step
starts from the checkpoint (`training_continued: false`); `StepResult` is what a step leaves.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from seamkit.config import RunConfig, SeamkitError
from seamkit.model import GPT
from seamkit.optim import make_optimizer
from seamkit.pruning import bitwise as prune_bitwise
from seamkit.pruning import rules as prune

MODES = ("base", "prune_exact")


class CheckError(SeamkitError, ValueError):
    """A pruning study that cannot run as asked; one line."""


@dataclass
class StepResult:
    """What a step leaves behind, copied out of the working model and optimizer."""
    loss: torch.Tensor  # 0-dim
    grads: dict  # name -> Tensor or None
    params: dict  # name -> Tensor after optimizer.step()
    state: dict  # name -> {state key -> Tensor} after optimizer.step()


class Stepper:
    """A working model and AdamW, reset from the checkpoint's tensors before every step.

    The checkpoint's tensors are copied in, never stepped on. Without optimizer state in the
    checkpoint, every step starts from a fresh AdamW (step 0, zero moments).
    """

    def __init__(self, model_cfg, model_state: dict, opt_state: dict | None, cfg: RunConfig,
                 dtype: torch.dtype, device: torch.device):
        if cfg.train.optimizer != "adamw":
            raise CheckError(f"the pruning study checks AdamW steps; this run asks for train.optimizer="
                             f"{cfg.train.optimizer} (--set train.optimizer=adamw)")
        self.model = GPT(model_cfg).to(device=device, dtype=dtype)
        self.model.load_state_dict(model_state)
        self.model.train()
        t = cfg.train
        self.opt = make_optimizer(self.model, t)  # the trainers' AdamW: decay on matrices only
        if opt_state is not None:
            try:
                self.opt.load_state_dict(copy.deepcopy(opt_state))
            except (ValueError, KeyError) as e:
                raise CheckError(f"checkpoint optimizer state does not fit optim.make_optimizer's AdamW ({e})") from None
            for group, fresh in zip(self.opt.param_groups, make_optimizer(self.model, t).param_groups):
                # the checkpoint gives the state; the hyperparameters are the command's (cfg.train)
                group.update(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=fresh["weight_decay"])
        self.names = {p: n for n, p in self.model.named_parameters()}
        self.params0 = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.state0 = {p: {k: v.clone() for k, v in s.items()} for p, s in self.opt.state.items()}

    def reset(self) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self.params0[n])
                p.grad = None
        self.opt.state.clear()
        for p, s in self.state0.items():
            self.opt.state[p] = {k: v.clone() for k, v in s.items()}

    def run(self, loss_fn) -> torch.Tensor:
        """Forward, backward and optimizer step (the timed work); returns the loss."""
        loss = loss_fn(self.model)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def result(self, loss: torch.Tensor) -> StepResult:
        m = self.model
        return StepResult(
            loss=loss.clone(),
            grads={n: (None if p.grad is None else p.grad.detach().clone()) for n, p in m.named_parameters()},
            params={n: p.detach().clone() for n, p in m.named_parameters()},
            state={self.names[p]: {k: (v.clone() if torch.is_tensor(v) else torch.tensor(v))
                                   for k, v in s.items()} for p, s in self.opt.state.items()})

    def step(self, loss_fn) -> StepResult:
        self.reset()
        return self.result(self.run(loss_fn))


def mode_loss(mode: str, window, exact: str = "arithmetic", ran: dict | None = None):
    """The loss function a mode's step runs, model -> loss, every cost of pruning inside it: the
    plan and its indices, and in bitwise mode the calibration. ran: filled with what ran."""
    if mode == "base":
        return lambda model: prune.base_loss(model, window)
    if mode != "prune_exact":
        raise CheckError(f"unknown mode {mode!r}; modes are {MODES}")
    if exact == "bitwise":
        return lambda model: prune_bitwise.bitwise_loss(model, window, ran)
    if exact == "arithmetic":
        return lambda model: prune.pruned_loss(model, prune.plan(window), ran)
    raise CheckError(f"unknown exactness {exact!r}; choose one of {prune.EXACT}")
