"""The end of every training step, on every placement: the global-norm clip, the update, and
what a non-finite loss does (no update).

A step on several ranks clips by the norm one process would compute: each rank writes the norm
of every gradient it holds into a vector at that parameter's place in the arm's order, the
vector is summed over the ranks (one writer per slot, zeros elsewhere: the sum is exact), and the
total is the norm of the norms that are there, as `clip_grad_norm_` takes it, parameters without
a gradient left out. One process runs the same code with nothing to sum.
"""

from __future__ import annotations

import math

import torch

from seamkit.optim import step_at


def norms_at(vec: torch.Tensor, slots: list[int], params: list, has_at: int | None = None) -> None:
    """The norm of each parameter's gradient at its slot in `vec`; with `has_at`, a 1 at
    vec[has_at + slot] for each that has one (the rest have none: the clip leaves them out)."""
    got = [i for i, p in enumerate(params) if p.grad is not None]
    if got:
        norms = torch._foreach_norm([params[i].grad for i in got], 2.0)
        for i, g in zip(got, norms):
            vec[slots[i]] = g
            if has_at is not None:
                vec[has_at + slots[i]] = 1.0


def global_norm(norms: torch.Tensor, has: torch.Tensor | None = None) -> torch.Tensor:
    """`clip_grad_norm_`'s total from per-tensor norms (in the arm's order), those without a gradient left out."""
    return torch.linalg.vector_norm(norms if has is None else norms[has > 0], 2.0)


def clip(params, max_norm: float, total: torch.Tensor) -> None:
    """Scale the gradients of `params` as `clip_grad_norm_` does with this total (0 disables)."""
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)


def clip_each(groups: list[list], max_norm: float) -> None:
    """Each group clipped by its own norm (segments that learn on their own)."""
    if max_norm > 0:
        for group in groups:
            torch.nn.utils.clip_grad_norm_(group, max_norm)


def apply(opts: list, lr: float) -> None:
    """One update of every optimizer at `lr`, then the gradients go."""
    step_at(opts, lr)
    skip(opts)


def skip(opts: list) -> None:
    """No update: a non-finite loss leaves the weights as they were."""
    for opt in opts:
        opt.zero_grad(set_to_none=True)


def finite(values) -> bool:
    return all(math.isfinite(v) for v in values)
