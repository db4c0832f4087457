"""Timing ranks alone and all at once, on the ranks `seams.launch.run_ranks` starts: what the
sharing factors of runtime.py and shares.py are ratios of.

`turns` times a callable on every rank alone in turn (the others waiting at a barrier), then on
every rank at once, a turn of each repeated after one that warms up, so a drift of the machine
reaches both alike. `timed_into` and `TimedModule` add the seconds of a call, or of a pipeline
stage module's forward, to a counter, so a rank inside torch's pipelining runtime can time its
own compute and none of the runtime's bookkeeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def alone(timed: Callable[[], float]) -> float:
    """`timed()` on each rank in turn, the other waiting at a barrier; this rank's seconds."""
    mine = None
    for turn in range(dist.get_world_size()):
        dist.barrier()
        if dist.get_rank() == turn:
            mine = timed()
    return mine


def turns(timed: Callable[[], float], repeats: int,
          at_once: Callable[[], float] | None = None) -> tuple[list[float], list[float]]:
    """This rank's seconds of `timed()` alone (`alone`) and of `at_once()` (default: `timed`) with
    every rank at once, a turn of each `repeats` times after one that warms up and is not kept;
    every rank calls it at once."""
    by_itself, both = [], []
    for _ in range(repeats + 1):
        by_itself.append(alone(timed))
        dist.barrier()
        both.append((at_once or timed)())
    return by_itself[1:], both[1:]


def timed_into(spent: list, fn: Callable) -> Callable:
    """fn, adding the seconds of each call to spent[0]."""
    def timed(*args, **kw):
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            spent[0] += time.perf_counter() - t
    return timed


class TimedModule(torch.nn.Module):
    """A pipeline stage's module: `seg`, its forward's seconds added to spent[0], nothing of the
    stage's own work."""

    def __init__(self, seg: torch.nn.Module, spent: list):
        super().__init__()
        self.seg, self.spent = seg, spent

    def forward(self, inp):
        return timed_into(self.spent, self.seg)(inp)
