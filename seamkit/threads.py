"""How many torch threads a CPU run uses: `train.threads`, or 0 for a count chosen at start.

On a machine shared with a busy process, two OpenMP threads on two cores fall to about a
quarter of their quiet speed: every parallel region waits for the thread that shares its core
(bench/results/seams_threads.json). One thread beside the busy process keeps a whole core.
So `train.threads = 0` counts the cores other processes keep busy, from /proc/stat over a short
sample minus this process's own CPU time, and leaves those out: all cores on a quiet machine,
one fewer per busy neighbour, at least one.

The count is chosen once, when a run starts (`seamkit train`, `seamkit seams`, `prune-check`
and the notebooks through them), and written into its config: both arms of a study get the same
count (their comparison stays fair), and a run's bits do not depend on load that comes and goes
during it. A resumed run keeps the count it started with. Set `train.threads` (`--threads`), or
$SEAMKIT_THREADS for every run, to fix it; OMP_NUM_THREADS, where set, is left to torch.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

SAMPLE_S = 0.3  # how long the other processes' CPU use is sampled
BUSY_CORE = 0.5  # another process's use, in cores, that takes a core away


def _busy_ticks() -> int | None:
    """Busy clock ticks of all CPUs since boot (/proc/stat's first line, idle and iowait left out)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4]


def _own_ticks() -> int | None:
    """This process's user + system clock ticks, all its threads (/proc/self/stat)."""
    try:
        stat = Path("/proc/self/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)


def others_busy_cores(seconds: float = SAMPLE_S) -> float | None:
    """Cores kept busy by other processes over the next `seconds`; None where /proc is missing."""
    b0, o0, t0 = _busy_ticks(), _own_ticks(), time.monotonic()
    if b0 is None or o0 is None:
        return None
    time.sleep(seconds)
    b1, o1, t1 = _busy_ticks(), _own_ticks(), time.monotonic()
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((b1 - b0) - (o1 - o0)) / hz / (t1 - t0))


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def auto_threads(cores: int | None = None, others: float | None = None) -> int:
    """All cores but those other processes keep busy (rounded at BUSY_CORE), at least one."""
    cores = cores or usable_cores()
    others = others_busy_cores() if others is None else others
    if others is None:
        return torch.get_num_threads()
    return max(1, cores - int(others + (1 - BUSY_CORE)))


def openmp_wait() -> str:
    """How idle OpenMP threads wait in this process and those it starts: OMP_WAIT_POLICY
    (`passive`, `active`) where set, else `default` (libgomp spins a while, then sleeps), with
    GOMP_SPINCOUNT where set. OpenMP reads both once, when torch loads (seamkit/__init__.py)."""
    policy = os.environ.get("OMP_WAIT_POLICY", "").strip().lower() or "default"
    spin = os.environ.get("GOMP_SPINCOUNT", "").strip()
    return f"{policy}, spincount {spin}" if spin else policy


ENV = "SEAMKIT_THREADS"  # a default thread count for every entry point (the tests set 1)


def resolve_threads(threads: int, quiet: bool = False) -> int:
    """`train.threads` as a count: itself when > 0; else $SEAMKIT_THREADS; else torch's count where
    OMP_NUM_THREADS was set; else `auto_threads()` (said on stderr when it leaves cores out)."""
    if threads > 0:
        return threads
    if os.environ.get(ENV):
        try:
            n = int(os.environ[ENV])
        except ValueError:
            n = 0
        if n < 1:
            from seamkit.config import ConfigError
            raise ConfigError(f"{ENV}={os.environ[ENV]!r}: expected a positive number of threads")
        return n
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    n, cores = auto_threads(), usable_cores()
    if n < cores and not quiet:
        print(f"seamkit: other processes keep {cores - n} of {cores} cores busy: {n} torch thread(s) "
              f"(--threads N to choose)", file=sys.stderr)
    return n
