"""What each arm costs per token, counted rather than assumed.

Parameters are counted on the built arm (the GPT plus, for local `aux_head`, `aux_block` and
`own_head`, the private modules of its segments, all counted as `aux_head_params`).
FLOPs are counted by `seamkit.costs.count_flops` (FlopCounterMode) over one real training step
of each arm (forward, backward and the optimizer's matmuls, aux modules included) on a real batch,
and over its forward alone; the aux modules' share is read from the counter's per-module table
(their class names: "AuxHead", "AuxBlock"). The report's MFU is `seamkit.costs.mfu` of these
FLOPs per token, the arm's tokens/s and the matmul peak `seamkit.costs.matmul_peak` measured in the same run.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from seamkit.config import RunConfig, study_arms
from seamkit.costs import count_flops
from seamkit.data.rows import RowLoader
from seamkit.model import lm_loss, resolve_device
from seamkit.seams.arm import Arm, build_arm, train_step
from seamkit.seams.objectives import segment_losses


def _aux_flops(counter: FlopCounterMode, a: Arm) -> int:
    """FLOPs the arm's private modules ran: the counter's rows of their class names."""
    table = counter.get_flop_counts()
    names = {type(m).__name__ for m in a.heads} if a.heads is not None else set()
    return sum(sum(table.get(n, {}).values()) for n in names)


def _forward(a: Arm, x_BT: torch.Tensor, y_BT: torch.Tensor) -> None:
    """The arm's losses, forward only: the whole model for e2e, every segment's objective for local."""
    with torch.no_grad():
        if a.name in ("e2e", "delayed"):  # delayed: e2e's forward (its aux heads count in the step)
            with a.autocast():
                lm_loss(a.model(x_BT), y_BT)
        else:
            for _ in segment_losses(a.model, x_BT, y_BT, a.segs, a.objective, a.heads, a.classes,
                                    autocast=a.autocast):
                pass


def arm_costs(cfg: RunConfig, corpus) -> dict:
    """{arm: params, aux_head_params, flops_per_token (one training step), forward_flops_per_token,
    aux_head_flops_per_token, aux_head_forward_share} from one step on a fresh copy of each arm."""
    per_token = cfg.data.batch * cfg.model.seq
    x_BT, y_BT = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed,
                           device=resolve_device(cfg.train.device)).next()
    out = {}
    for arm in study_arms(cfg.seams.arms):
        a = build_arm(arm, cfg, corpus)
        if arm == "delayed":  # a step once the pipeline is full: every segment's late backward runs in it
            for _ in range(cfg.seams.delay * (len(a.segs) - 1)):
                train_step(a, x_BT, y_BT, cfg.train.lr, cfg.train.grad_clip)
        fwd = count_flops(lambda: _forward(a, x_BT, y_BT))
        step = count_flops(lambda: train_step(a, x_BT, y_BT, cfg.train.lr, cfg.train.grad_clip),
                           per_module=arm != "delayed")
        heads = sum(p.numel() for p in a.heads.parameters()) if a.heads is not None else 0
        fwd_total = fwd.get_total_flops()
        out[arm] = {
            "params": sum(p.numel() for p in a.model.parameters()), "aux_head_params": heads,
            "flops_per_token": step.get_total_flops() / per_token,
            "forward_flops_per_token": fwd_total / per_token,
            "aux_head_flops_per_token": _aux_flops(step, a) / per_token,
            "aux_head_forward_share": _aux_flops(fwd, a) / fwd_total if fwd_total else 0.0,
        }
        if arm == "delayed" and a.heads is not None:  # its step's FLOPs have no per-module table
            out[arm]["aux_head_flops_per_token"] = out.get("local", {}).get("aux_head_flops_per_token")
    return out
