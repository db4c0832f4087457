"""What a step costs in FLOPs and how much of the device it uses (MFU): the one path for both.

- FLOPs are counted, not assumed: `count_flops` runs a callable under
  `torch.utils.flop_counter.FlopCounterMode` (a matmul of (m, k) by (k, n) counts 2*m*n*k;
  attention as its GEMMs, dense, whatever the mask hides; under grouped-query attention, scores
  for every query head), with formulas added for the CPU flash-attention kernels, which
  flop_counter leaves uncounted. The model's options (swiglu, kv_heads) change only the GEMMs'
  shapes, which the counter reads. `measured_flops` is the forward + backward of a loss.
- The peak is measured, on this machine and in the same run: the best FLOP/s of a square matmul
  (`matmul_peak`, bf16 on CUDA, float32 elsewhere). `spec_peak` is a GPU's data-sheet dense
  bf16 rate, for a second denominator beside it.
- MFU = FLOPs per token x tokens/s / peak FLOP/s (`mfu`): every report and bench takes it from here.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch.utils import flop_counter

MATMUL_SIZE = {"cuda": 4096}  # n of the n x n probe per device type; 1024 on every other type
SPEC_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}  # dense bf16, data sheets


def matmul_peak(device: torch.device, seconds: float = 1.0, n: int | None = None) -> dict:
    """Best FLOP/s of an n x n matmul over about `seconds` (n: MATMUL_SIZE for the device type)."""
    n = n or MATMUL_SIZE.get(device.type, 1024)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
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
        sync()  # CUDA queues the products; the clock must wait for them
        best = max(best, 5 * 2 * n ** 3 / (time.perf_counter() - t))
    return {"flops_per_s": best, "matmul": f"{n}x{n} {str(dtype).removeprefix('torch.')}",
            "threads": torch.get_num_threads(), "seconds": seconds}


def spec_peak(gpu: str | None) -> float | None:
    """The data-sheet dense bf16 FLOP/s of a GPU named like torch.cuda.get_device_name (None if unknown)."""
    return next((v for k, v in SPEC_BF16_FLOPS.items() if gpu and k in gpu), None)


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilization: the FLOP rate training reached over the peak rate."""
    if not peak_flops_per_s > 0:
        raise ValueError(f"MFU needs a positive peak FLOP/s, got {peak_flops_per_s}")
    return flops_per_token * tokens_per_s / peak_flops_per_s


# ----------------------------------------------------------------------------- counting

def _cpu_flash_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(q, k, v)


def _cpu_flash_backward_flops(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, q, k, v)


# flop_counter has no formula for the CPU flash kernels that SDPA runs on CPU; these are its CUDA ones
CPU_ATTENTION_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
                       torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops}


class _NoModules:
    """A stand-in for FlopCounterMode's module tracker that files every FLOP under "Global": its
    hooks cannot follow `torch.autograd.grad` with `inputs` (a late backward of the delayed arm)."""
    parents = {"Global"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def count_flops(fn: Callable[[], object], per_module: bool = True) -> flop_counter.FlopCounterMode:
    """Run fn() under a FlopCounterMode and return the counter: `get_total_flops()` for the
    total, `get_flop_counts()` for the table per module (by class name and by path; with
    `per_module=False` only the total, for code the module tracker cannot follow)."""
    counter = flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
    if not per_module:
        counter.mod_tracker = _NoModules()
    with counter:
        fn()
    return counter


def measured_flops(loss_fn: Callable[[], torch.Tensor]) -> int:
    """FLOPs one forward + backward of loss_fn() ran, counted by FlopCounterMode."""
    return int(count_flops(lambda: loss_fn().backward()).get_total_flops())
