"""What each arm costs per token, counted rather than assumed.

Parameters are counted on the built arm (the GPT plus, for local `aux_head`, its aux heads).
FLOPs are counted by `seamkit.costs.count_flops` (FlopCounterMode) over one real training step
of each arm (forward, backward and the optimizer's matmuls, aux heads included) on a real batch,
and over its forward alone; the aux heads' share is read from the counter's per-module table
("AuxHead"). The report's MFU is `seamkit.costs.mfu` of these FLOPs per token, the arm's tokens/s
and the matmul peak `seamkit.costs.matmul_peak` measured in the same run.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from seamkit.config import RunConfig
from seamkit.costs import count_flops
from seamkit.data.rows import RowLoader
from seamkit.model import lm_loss, resolve_device
from seamkit.seams.arm import ARMS, Arm, build_arm, train_step
from seamkit.seams.objectives import segment_losses


def _aux_flops(counter: FlopCounterMode) -> int:
    return sum(counter.get_flop_counts().get("AuxHead", {}).values())


def _forward(a: Arm, x_BT: torch.Tensor, y_BT: torch.Tensor) -> None:
    """The arm's losses, forward only: the whole model for e2e, every segment's objective for local."""
    with torch.no_grad():
        if a.name == "e2e":
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
    for arm in ARMS:
        a = build_arm(arm, cfg, corpus)
        fwd = count_flops(lambda: _forward(a, x_BT, y_BT))
        step = count_flops(lambda: train_step(a, x_BT, y_BT, cfg.train.lr, cfg.train.grad_clip))
        heads = sum(p.numel() for p in a.heads.parameters()) if a.heads is not None else 0
        fwd_total = fwd.get_total_flops()
        out[arm] = {
            "params": sum(p.numel() for p in a.model.parameters()), "aux_head_params": heads,
            "flops_per_token": step.get_total_flops() / per_token,
            "forward_flops_per_token": fwd_total / per_token,
            "aux_head_flops_per_token": _aux_flops(step) / per_token,
            "aux_head_forward_share": _aux_flops(fwd) / fwd_total if fwd_total else 0.0,
        }
    return out
