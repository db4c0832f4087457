"""What the ranks that tests/seams/test_launch.py and test_processes.py start run (`launch.run_ranks`'s
fn): a spawned rank imports the module its function lives in, and this one imports little."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from seamkit.config import ConfigError


def sleep_forever(rank: int, world: int, events, store, folder: str) -> None:
    """Say this rank is up (a file named for it in `folder`), then sleep."""
    (Path(folder) / str(rank)).touch()
    time.sleep(600)


def a_tensor(rank: int, world: int, events, store) -> dict:
    """A return value holding tensors, as an arm's result and a forecast's timings do."""
    return {"rank": rank, "t": torch.arange(4, dtype=torch.float64) * (rank + 1)}


def raise_on_rank_1(rank: int, world: int, events, store) -> None:
    if rank == 1:
        raise ConfigError("seams.objective=x: a line a user can act on")
    dist.barrier()  # rank 0 waits for a peer that is gone


def arms_in_turn(rank: int, world: int, events, store, cases: list) -> list:
    """Each case, an (ArmSpec, stop after this many of rank 0's step-boundary words or None), run in
    turn on this one pair of ranks; rank 0's ArmResults."""
    from seamkit.seams.arm import run_arm
    out = []
    for spec, stop_after in cases:
        words = iter(range(1 << 30))
        stop = (lambda: next(words) >= stop_after) if stop_after is not None else (lambda: False)
        out.append(run_arm(spec, rank, world, stop=stop))
    return out


def signal_state(rank: int, world: int, events, store) -> dict:
    """How this rank stands to SIGINT and SIGTERM: which of them it blocks, and its SIGINT handler."""
    import signal
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return {"blocked": sorted(s.name for s in (signal.SIGINT, signal.SIGTERM) if s in blocked),
            "sigint": getattr(signal.getsignal(signal.SIGINT), "__name__", str(signal.getsignal(signal.SIGINT)))}
