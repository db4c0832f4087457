"""What each arm costs per token, counted rather than assumed.

Parameters are counted on the built arm (the GPT plus, for local `aux_head`, `aux_block` and
`own_head` and for delayed with a local loss, the private modules of its segments, all counted as
`aux_head_params`). FLOPs are counted by `seamkit.flops.count_flops` (FlopCounterMode) over one
real training step of each arm's chain (forward, backward and the optimizer's matmuls, private
modules included) on a real batch, and over its forward alone; the private modules' share is
read from the counter's per-module table (their class names: "AuxHead", "AuxBlock"). The delayed
arm's step is one with its pipeline full, counted at delay 1 whatever its delay (`_counted`). The
report's MFU is `seamkit.flops.mfu` of these FLOPs per token, the arm's tokens/s and the matmul
peak `seamkit.flops.matmul_peak` measured in the same run.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from seamkit.config import RunConfig, override
from seamkit.data.rows import RowLoader
from seamkit.flops import count_flops
from seamkit.model import resolve_device
from seamkit.optim import state_bytes, step_at
from seamkit.seams.chain import Chain
from seamkit.seams.placement import arm_segments


def _aux_flops(counter: FlopCounterMode, ch: Chain) -> int:
    """FLOPs the arm's private modules ran: the counter's rows of their class names."""
    table = counter.get_flop_counts()
    names = {type(m).__name__ for m in ch.heads.values()}
    return sum(sum(table.get(n, {}).values()) for n in names)


@torch.no_grad()
def _forward(ch: Chain, x_BT: torch.Tensor, y_BT: torch.Tensor) -> None:
    """The arm's losses, forward only: every segment's local objective for local; the LM loss for
    e2e and delayed (its private modules count in the step)."""
    h = None
    with ch.autocast():
        for k in ch.mine:
            h = ch.run(k, x_BT if k == 0 else None, h)
            if k == ch.last or ch.policy.arm == "local":
                ch.loss(k, h, y_BT)


def _counted(cfg: RunConfig, arm: str) -> RunConfig:
    """The config `arm`'s step is counted under. Once a delayed arm's pipeline is full, each step
    runs every segment's forward and one late backward of each, whatever the delay d >= 1: d only
    says which batch a backward is for, and FLOPs follow the shapes. So its step is counted at
    d=1, whose pipeline fills in S-1 steps rather than d*(S-1) (the count is the same)."""
    if arm == "delayed" and cfg.seams.delay > 1:
        return override(cfg, {"seams.delay": 1})
    return cfg


def arm_costs(cfg: RunConfig, corpus) -> dict:
    """{arm: params, aux_head_params, flops_per_token (one training step, its update included),
    forward_flops_per_token, aux_head_flops_per_token, aux_head_forward_share,
    optimizer_flops_per_token (the update alone), optimizer_state_bytes} from one step on a fresh
    copy of each arm."""
    per_token = cfg.data.batch * cfg.model.seq
    device = resolve_device(cfg.train.device)
    x_BT, y_BT = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed, device=device).next()
    out = {}
    for arm in cfg.seams.arm_names:
        segs = arm_segments(cfg, arm)
        ch = Chain(_counted(cfg, arm), arm, segs, range(len(segs)), device, corpus)
        if ch.policy.crosses:  # a step once the pipeline is full: every segment's late backward runs in it
            for _ in range(ch.policy.delay * (len(segs) - 1)):
                ch.step(x_BT, y_BT, cfg.train.lr)
        fwd = count_flops(lambda: _forward(ch, x_BT, y_BT))
        step = count_flops(lambda: ch.step(x_BT, y_BT, cfg.train.lr), per_module=arm != "delayed")
        fwd_total = fwd.get_total_flops()
        for q in (q for o in ch.opts for g in o.param_groups for q in g["params"]):
            q.grad = torch.ones_like(q)
        update = count_flops(lambda: step_at(ch.opts, cfg.train.lr), per_module=False)
        out[arm] = {
            "params": sum(p.numel() for p in ch.model.parameters()),
            "aux_head_params": sum(p.numel() for p in ch.heads.parameters()),
            "flops_per_token": step.get_total_flops() / per_token,
            "forward_flops_per_token": fwd_total / per_token,
            "aux_head_flops_per_token": _aux_flops(step, ch) / per_token,
            "aux_head_forward_share": _aux_flops(fwd, ch) / fwd_total if fwd_total else 0.0,
            # the update's own (in the step's too): Muon's orthogonalization, none for AdamW's elementwise one
            "optimizer_flops_per_token": update.get_total_flops() / per_token,
            "optimizer_state_bytes": state_bytes(ch.opts),
        }
        if arm == "delayed" and len(ch.heads):  # its step's FLOPs have no per-module table
            out[arm]["aux_head_flops_per_token"] = out.get("local", {}).get("aux_head_flops_per_token")
    return out
