"""The rules tested bitwise in the unpruned step, independently of the pruned step's kernels.

Rule A: changing the token ids at the positions it drops must leave the step's bits unchanged
(`token_probe`). Rule B: changing the last block's query-side inputs (its queries and its MLP
input) at the live positions outside T must too (`query_side_probe`). `rule_invariance` runs
both on one window.
"""

from __future__ import annotations

import dataclasses

import torch

from seamkit.pruning import rules as prune
from seamkit.pruning.compare import compare
from seamkit.pruning.step import Stepper, StepResult

QUERY_SIDE = ("queries", "mlp_input")  # where the rule-B probe changes the last block


def rule_invariance(stepper: Stepper, window, p: prune.Plan) -> dict:
    """Kernel-independent tests of the rules, in the unpruned step.

    A: the token ids at the positions rule A drops are changed (`token_probe`). B: the last
    block's query-side inputs are changed at the live positions outside T, the context rows
    the pruned step keeps only for keys and values (`query_side_probe`). Each gives the four
    differences against the same unpruned step left unchanged; both must be exactly zero.
    `positions` says how many positions each probe touched (0: the window cannot test it).
    """
    N = window.idx.shape[0]
    dropped = torch.ones(N, dtype=torch.bool, device=window.idx.device)
    dropped[p.live] = False
    context = ~dropped
    context[p.target] = False
    return {"A_dropped_tokens_changed": {**token_probe(stepper, window, dropped), "positions": int(dropped.sum())},
            "B_query_side_outside_T_changed": {**query_side_probe(stepper, window, context),
                                               "positions": int(context.sum())}}


def token_probe(stepper: Stepper, window, rows: torch.Tensor) -> dict:
    """The four differences between the unpruned step and the same step with the token ids at
    `rows` (bool (N,)) changed."""
    changed = dataclasses.replace(window, idx=torch.where(rows, (window.idx + 1) % stepper.model.cfg.vocab,
                                                          window.idx))
    return compare(stepper.step(lambda m: prune.base_loss(m, window)),
                   stepper.step(lambda m: prune.base_loss(m, changed)))


def query_side_probe(stepper: Stepper, window, rows: torch.Tensor, parts=QUERY_SIDE) -> dict:
    """The four differences between the unpruned step with 0.0 and with 1.0 added at `rows` to the
    last block's queries and MLP input (`parts`). The baseline runs with the same hooks adding 0.0: a
    hook adds autograd nodes, and the order in which gradient contributions are summed follows the graph."""
    return compare(*(query_side_step(stepper, window, rows, delta, parts) for delta in (0.0, 1.0)))


def query_side_step(stepper: Stepper, window, rows: torch.Tensor, delta: float, parts=QUERY_SIDE) -> StepResult:
    """The unpruned step with `delta` added, at `rows`, to the last block's queries and to the
    input of its MLP's norm (hooks), as `parts` says."""
    block, C = stepper.model.blocks[-1], stepper.model.cfg.dim

    def queries(mod, args, y):
        y = y.clone()
        y[:, rows, :C] += delta
        return y

    def mlp_input(mod, args):
        x = args[0].clone()
        x[:, rows] += delta
        return (x,)

    hooks = ([block.attn.qkv.register_forward_hook(queries)] if "queries" in parts else []) + \
        ([block.norm2.register_forward_pre_hook(mlp_input)] if "mlp_input" in parts else [])
    try:
        return stepper.step(lambda m: prune.base_loss(m, window))
    finally:
        for h in hooks:
            h.remove()
