"""What each arm costs per token, counted rather than assumed.

Parameters are counted on the built arm (the GPT plus, for local `aux_head`, its aux heads).
FLOPs come from `torch.utils.flop_counter.FlopCounterMode` over one real training step of each
arm (forward, backward and the optimizer's matmuls, aux heads included) on a real batch, and
over its forward alone; the aux heads' share is read from the counter's per-module table
("AuxHead"). MFU = FLOPs per token x tokens/s / a matmul peak measured on this machine in the
same run (`matmul_peak`), so it says how much of what this device does for a plain matmul the
arm turned into training.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from seamkit.config import RunConfig
from seamkit.data.corpus import RowLoader
from seamkit.model import lm_loss, resolve_device
from seamkit.seams.arm import ARMS, build_arm, train_step
from seamkit.seams.objectives import segment_losses


def matmul_peak(device: torch.device, seconds: float = 1.0) -> dict:
    """Best FLOP/s of a square matmul over about `seconds` (float32 1024^2 on CPU, bf16 4096^2 on CUDA)."""
    n, dtype = (4096, torch.bfloat16) if device.type == "cuda" else (1024, torch.float32)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        for _ in range(5):
            a @ b
        sync()
        best = max(best, 5 * 2 * n ** 3 / (time.perf_counter() - t))
    return {"flops_per_s": best, "matmul": f"{n}x{n} {str(dtype).removeprefix('torch.')}",
            "threads": torch.get_num_threads(), "seconds": seconds}


def _aux_flops(counter: FlopCounterMode) -> int:
    return sum(counter.get_flop_counts().get("AuxHead", {}).values())


def arm_costs(cfg: RunConfig, corpus) -> dict:
    """{arm: params, aux_head_params, flops_per_token (one training step), forward_flops_per_token,
    aux_head_flops_per_token, aux_head_forward_share} from one step on a fresh copy of each arm."""
    per_token = cfg.data.batch * cfg.model.seq
    x_BT, y_BT = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed,
                           device=resolve_device(cfg.train.device)).next()
    out = {}
    for arm in ARMS:
        a = build_arm(arm, cfg, corpus)
        with FlopCounterMode(display=False) as fwd, torch.no_grad():
            if arm == "e2e":
                with a.autocast():
                    lm_loss(a.model(x_BT), y_BT)
            else:
                for _ in segment_losses(a.model, x_BT, y_BT, a.segs, a.objective, a.heads, a.classes,
                                        autocast=a.autocast):
                    pass
        with FlopCounterMode(display=False) as step:
            train_step(a, x_BT, y_BT, cfg.train.lr, cfg.train.grad_clip)
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
