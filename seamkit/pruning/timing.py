"""How long a step takes, how much memory it holds and how many ops it dispatches, timed as in training.

`timed_sample` times one step from the checkpoint: seconds, words/s and, on CUDA, the
allocator's peaks (reset per sample); on CPU the process's peak resident set (VmHWM, reset
through /proc/self/clear_refs before the step). `profiled_peak_bytes` is the CPU's allocated
figure: the peak of live tensor bytes in an untimed profiled step (the profiler's allocation
events), on top of the parameters and optimizer state alive before it (`static_bytes`).
`precision` is the arithmetic a timed step runs in (`PRECISIONS`); `dispatched_ops` counts the
aten ops a step dispatches, each a kernel launch on an accelerator.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time

import torch

from seamkit.memory import peak_rss_bytes, reset_peak_memory
from seamkit.pruning.step import Stepper
from seamkit.torch_internals import OpCounter, peak_live_bytes

GiB = 2 ** 30
PRECISIONS = ("fp32", "bf16")  # fp32: as stored, TF32 off; bf16: autocast, as training runs on CUDA


@contextlib.contextmanager
def precision(name: str, device: torch.device):
    """The arithmetic of a timed step. fp32: float32 throughout, TF32 off. bf16: bf16 autocast on
    the device (the trainers' `model.autocast` on CUDA), with TF32 for the float32 matmuls autocast
    leaves on CUDA; on CPU it is autocast alone (the CPU trainers run fp32). Exactness is never
    checked under bf16: only timings run in it."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; choose one of {PRECISIONS}")
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    if device.type == "cuda":
        matmul.fp32_precision = "tf32" if name == "bf16" else "ieee"
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=name == "bf16"):
            yield
    finally:
        if device.type == "cuda":
            matmul.fp32_precision = before


def dispatched_ops(stepper: Stepper, loss_fn, precision_name: str = "fp32") -> int:
    """aten ops one step dispatches (forward, backward, optimizer step; the loss function's own
    work, a plan included), counted below autograd: what an accelerator launches."""
    stepper.reset()
    with precision(precision_name, stepper.model.embed.weight.device), OpCounter() as counter:
        stepper.run(loss_fn)
    return counter.ops


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def static_bytes(stepper: Stepper) -> int:
    """Bytes of the tensors alive before a step: parameters and optimizer state."""
    n = sum(p.numel() * p.element_size() for p in stepper.model.parameters())
    for s in stepper.opt.state.values():
        n += sum(v.numel() * v.element_size() for v in s.values() if torch.is_tensor(v))
    return n


@contextlib.contextmanager
def _quiet_fd2():
    """The profiler's C++ side logs its start and stop on file descriptor 2; keep them off the
    progress bar and the summary."""
    try:
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def profiled_peak_bytes(stepper: Stepper, loss_fn, precision_name: str = "fp32") -> int:
    """Peak live tensor bytes of one step on CPU: the profiler's allocation events, cumulated in
    time order, on top of the parameters and optimizer state alive before the step."""
    stepper.reset()
    base = static_bytes(stepper)
    with _quiet_fd2(), precision(precision_name, torch.device("cpu")), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        stepper.run(loss_fn)
    return base + peak_live_bytes(prof)


def timed_sample(stepper: Stepper, loss_fn, words: int, device: torch.device, precision_name: str = "fp32") -> dict:
    """One timed step from the checkpoint in `precision_name`: seconds, words/s and the step's peak memory."""
    stepper.reset()
    gc.collect()
    _sync(device)
    hwm_ok = reset_peak_memory(device)  # CUDA's allocator peaks, and the process's VmHWM
    with precision(precision_name, device):
        t0 = time.perf_counter()
        stepper.run(loss_fn)
        _sync(device)
        seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "words_per_second": words / seconds}
    if device.type == "cuda":
        out["allocated_GiB"] = torch.cuda.max_memory_allocated(device) / GiB
        out["reserved_GiB"] = torch.cuda.max_memory_reserved(device) / GiB
    else:
        out["reserved_GiB"] = (peak_rss_bytes() if hwm_ok else 0) / GiB
    return out
