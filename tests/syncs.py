"""What would make a GPU's host wait, counted on the CPU (tests/test_readout.py).

On a GPU the host waits for the device whenever it reads a device value: a tensor's scalar
(`.item()`, `bool`, `float`, `int`: aten's `_local_scalar_dense`), `.tolist()`, `.numpy()`, and
the ops whose output size depends on values (`nonzero`, `masked_select`, `unique`, boolean-mask
indexing); and wherever it synchronizes (`readout.sync_device`, the one place the kit does).
`HostReads` counts all of these in the process it is entered in; the host buffers the kit reads
by design (`readout.HOST`: the step reports' copies, the ranks' control words) do not count.
What it cannot see on the CPU: a `.to("cpu")` of a tensor already on the CPU is no copy here
(bench/gpu_check.sh runs under `torch.cuda.set_sync_debug_mode` for that).
"""

from __future__ import annotations

import os
from collections import Counter

import torch

from seamkit import readout
from seamkit.torch_internals import TorchDispatchMode

aten = torch.ops.aten
VALUE_OPS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.unique_consecutive,
             aten._unique2, aten.unique_dim, aten.repeat_interleave}
PLANT_ENV = "SEAMKIT_TEST_PLANT_ITEM"  # set: the chain's step reads its loss on the host (a planted fault)


class HostReads(TorchDispatchMode):
    """Counts host reads of device values and device waits while entered (module docstring)."""

    def __init__(self):
        super().__init__()
        self.count: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in VALUE_OPS and not _host(args):
            self.count[str(func.overloadpacket)] += 1
        elif func.overloadpacket is aten.index and any(t is not None and t.dtype == torch.bool for t in args[1]):
            self.count["boolean index"] += 1
        return func(*args, **kwargs)

    def take(self) -> dict:
        out = dict(self.count)
        self.count.clear()
        return out

    def __enter__(self):
        self.saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
        self.sync = readout.sync_device
        count = self.count

        def wrap(name, fn):
            def read(t, *a, **kw):
                if not readout.is_host(t):
                    count[name] += 1
                return fn(t, *a, **kw)
            return read
        for name, fn in self.saved.items():
            setattr(torch.Tensor, name, wrap(name, fn))

        def sync(device):
            count["sync_device"] += 1
            self.sync(device)
        readout.sync_device = sync
        return super().__enter__()

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(torch.Tensor, name, fn)
        readout.sync_device = self.sync
        return super().__exit__(*exc)


def _host(args) -> bool:
    return bool(args) and isinstance(args[0], torch.Tensor) and readout.is_host(args[0])


def counted_steps(fn):
    """Run `fn()` (an arm) with every `RankLoop._steps` call counted: {"first": what the first step
    read (a torch pipeline schedule sets itself up there), "reads": what every later one and the
    loop around them read, "steps": steps launched}. With PLANT_ENV set, each chain step also reads
    its loss on the host."""
    from seamkit import loop
    from seamkit.seams import chain, ranks
    steps, loop_steps, chain_step, ran = [0], ranks.RankLoop._steps, chain.Chain.step, loop.BudgetLoop.ran
    reads, first = HostReads(), {}

    def counted(self):
        with reads:
            loop_steps(self)
        steps[0] += self.loop.launched

    def ran_counted(self, step, t0):
        ran(self, step, t0)
        if step == 0:
            first.update(reads.take())

    def planted(self, *a, **kw):
        report = chain_step(self, *a, **kw)
        report.losses.sum().item()  # the planted fault: a host read inside the step
        return report
    ranks.RankLoop._steps, loop.BudgetLoop.ran = counted, ran_counted
    if os.environ.get(PLANT_ENV):
        chain.Chain.step = planted
    try:
        fn()
    finally:
        ranks.RankLoop._steps, chain.Chain.step, loop.BudgetLoop.ran = loop_steps, chain_step, ran
    return {"first": first, "reads": reads.take(), "steps": steps[0]}


def counted_rank(rank: int, world: int, events, store, cases: list) -> dict:
    """One rank of `launch.run_ranks`: each (name, ArmSpec, plant) in turn, counted."""
    import torch.distributed as dist

    from seamkit.seams.arm import run_arm
    torch.set_num_threads(1)
    out = {}
    for name, spec, plant in cases:
        os.environ.pop(PLANT_ENV, None)
        if plant:
            os.environ[PLANT_ENV] = "1"
        out[name] = counted_steps(lambda: run_arm(spec, rank, world, faults=dist.PrefixStore(f"f/{name}", store)))
        os.environ.pop(PLANT_ENV, None)
        dist.barrier()
    return out
