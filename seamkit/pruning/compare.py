"""How two training steps differ, and what a step ran.

`compare` gives the pruning report's four differences between two `StepResult`s (loss,
gradients, parameters after the update, optimizer state, each the largest absolute difference)
and the parameters whose gradient is None on one side only; `differences_zero` and `within`
judge them. `stats` is a step's entry in the report: its loss and gradient norm, and the rows
and attention pairs it computed.
"""

from __future__ import annotations

import math
import sys

import torch

from seamkit.pruning import rules as prune
from seamkit.pruning.step import StepResult

DIFFERENCES = ("loss_delta", "gradient_max", "parameter_update_max", "optimizer_state_max")


def _maxabs(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def _finite(x: float) -> float:
    """JSON has no inf or NaN: a difference that is not finite is reported as the largest float."""
    return x if math.isfinite(x) else sys.float_info.max


def compare(ref: StepResult, got: StepResult) -> dict:
    """The four differences and the parameters whose gradient is None on one side only."""
    names = sorted(set(ref.grads) | set(got.grads))
    none_diff = [n for n in names if (ref.grads.get(n) is None) != (got.grads.get(n) is None)]
    gmax = max((_maxabs(ref.grads[n], got.grads[n]) for n in names
                if ref.grads.get(n) is not None and got.grads.get(n) is not None), default=0.0)
    pmax = max((_maxabs(ref.params[n], got.params[n]) for n in names), default=0.0)
    smax = 0.0
    for n in sorted(set(ref.state) | set(got.state)):
        a, b = ref.state.get(n, {}), got.state.get(n, {})
        for k in sorted(set(a) | set(b)):
            smax = max(smax, _maxabs(a[k], b[k]) if k in a and k in b else math.inf)
    loss = abs(float(got.loss.double()) - float(ref.loss.double()))
    return {"loss_delta": _finite(loss), "gradient_none_difference": none_diff, "gradient_max": _finite(gmax),
            "parameter_update_max": _finite(pmax), "optimizer_state_max": _finite(smax)}


def differences_zero(d: dict) -> bool:
    return not d["gradient_none_difference"] and all(d[k] == 0.0 for k in DIFFERENCES)


def within(d: dict, tol: float) -> bool:
    return not d["gradient_none_difference"] and all(d[k] <= tol for k in DIFFERENCES)


def gradnorm(r: StepResult) -> float:
    """Global L2 norm of the gradients, in float64."""
    return float(math.sqrt(sum(float(g.double().pow(2).sum()) for g in r.grads.values() if g is not None)))


def stats(r: StepResult, mode: str, window, ran: dict) -> dict:
    """The report's stats from what the step ran (`ran`, filled by the pruned step), plus
    `dropped` (rule A) and `targets` (|T|). In base the pruner is off: kept = skipped = 0, and
    `projected` counts the pairs the window's document-causal mask lets the attention score."""
    N, t = int(window.positions), int(window.loss_mask.sum())
    if mode == "base":
        kept = skipped = dropped = 0
        projected = prune.projected_pairs(window.pos)
    else:
        kept, skipped, dropped, projected = ran["kept"], N - ran["kept"], N - ran["live"], ran["projected"]
    return {"nll": float(r.loss), "gradnorm": gradnorm(r), "skipped": skipped, "kept": kept,
            "projected": projected, "dropped": dropped, "targets": t}
