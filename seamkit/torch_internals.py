"""Every use of torch's private internals in seamkit, in one place, each pinned to the signature
it was written against (`EXPECTED`; tests/test_torch_internals.py fails when torch changes one).

- torch.distributed.pipelining's schedules block on point-to-point work through
  `schedules._wait_batch_p2p(work)` and post it through `schedules._batch_p2p(p2p_ops)`: the pipe
  placement times its waits there (`timed_pipeline_waits`), the forecast times one P2P op.
- `schedules._ComputationType` and `_Action` name the actions of a schedule's `pipeline_order`,
  which the forecast replays.
- a PipelineStage runs its backwards through `stage_backward`, `stage_backward_input` and
  `stage_backward_weight`, globals of torch.distributed.pipelining.stage: the forecast calls and
  times them (`timed_stage_backwards`).
- `torch.utils._python_dispatch.TorchDispatchMode` sees every aten op below autograd: what a step
  dispatches is counted through it (`OpCounter`; the pruning study, bench/step.py, tests).
- the profiler's event tree marks memory events with `torch._C._profiler._EventType.Allocation`:
  the CPU's peak of live tensor bytes is read from them (`peak_live_bytes`).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable

import torch
from torch._C import _profiler
from torch.distributed.pipelining import schedules
from torch.distributed.pipelining import stage as _stage
from torch.utils import _python_dispatch

ComputationType = schedules._ComputationType
BACKWARDS = ("stage_backward", "stage_backward_input", "stage_backward_weight")

# what each internal was written against: its parameter names
EXPECTED = {
    "schedules._wait_batch_p2p": ("work",),
    "schedules._batch_p2p": ("p2p_ops", "desc"),
    "schedules._Action": ("stage_index", "computation_type", "microbatch_index", "sub_actions"),
    "stage.stage_backward": ("stage_output", "output_grads", "input_values", "outputs_with_grads_idxs"),
    "stage.stage_backward_input": ("stage_outputs_or_loss", "output_grads", "input_values", "weights"),
    "stage.stage_backward_weight": ("weights", "param_groups", "retain_graph"),
    "schedules._ComputationType": ("FORWARD", "FULL_BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "OVERLAP_F_B"),
    "_python_dispatch.TorchDispatchMode": ("self", "func", "types", "args", "kwargs"),
    "_profiler._EventType": ("Allocation",),
}
OWNERS = {"schedules": schedules, "stage": _stage, "_python_dispatch": _python_dispatch, "_profiler": _profiler}


def found() -> dict[str, tuple]:
    """What this torch has for each name of EXPECTED (its parameter names, fields or members)."""
    out = {}
    for name in EXPECTED:
        owner, attr = name.split(".")
        obj = getattr(OWNERS[owner], attr, None)
        if obj is None:
            out[name] = ()
        elif name.endswith("_Action"):
            out[name] = tuple(obj._fields)
        elif name.endswith(("_ComputationType", "_EventType")):
            out[name] = tuple(m for m in EXPECTED[name] if hasattr(obj, m))
        elif name.endswith("TorchDispatchMode"):
            fn = getattr(obj, "__torch_dispatch__", None)
            out[name] = tuple(inspect.signature(fn).parameters) if fn is not None else ()
        else:
            out[name] = tuple(inspect.signature(obj).parameters)
    return out


TorchDispatchMode = _python_dispatch.TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while entered (`ops`): below autograd, one each kernel an
    accelerator would launch."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def peak_live_bytes(prof) -> int:
    """The peak of live CPU tensor bytes a `torch.profiler.profile(profile_memory=True)` saw: its
    allocation events (+bytes allocated, -bytes freed) cumulated in time order."""
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _profiler._EventType.Allocation and node.typed[1].device.type == "cpu":
            events.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


def profiled_peak_bytes(fn) -> int:
    """The peak of live CPU tensor bytes fn() allocates (on top of what is alive before it)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return peak_live_bytes(prof)


def batch_p2p(ops: list):
    return schedules._batch_p2p(ops)


def wait_batch_p2p(works: list) -> None:
    schedules._wait_batch_p2p(works)


def stage_backward(*args, **kw):
    return _stage.stage_backward(*args, **kw)


def stage_backward_input(*args, **kw):
    return _stage.stage_backward_input(*args, **kw)


def stage_backward_weight(*args, **kw):
    return _stage.stage_backward_weight(*args, **kw)


@contextlib.contextmanager
def timed_pipeline_waits(wait) -> None:
    """Every wait a pipelining schedule makes on this rank, inside `with wait:` (a Timer): all
    schedules in torch 2.13 block on P2P work through `schedules._wait_batch_p2p`."""
    inner = schedules._wait_batch_p2p

    def timed(work):
        with wait:
            inner(work)
    schedules._wait_batch_p2p = timed
    try:
        yield
    finally:
        schedules._wait_batch_p2p = inner


@contextlib.contextmanager
def timed_stage_backwards(timing: Callable[[Callable], Callable], names=BACKWARDS):
    """The stage's backward functions `names` wrapped by `timing` (the autograd pass of every
    backward a PipelineStage runs) for the duration."""
    saved = {f: getattr(_stage, f) for f in names}
    for f, fn in saved.items():
        setattr(_stage, f, timing(fn))
    try:
        yield
    finally:
        for f, fn in saved.items():
            setattr(_stage, f, fn)
