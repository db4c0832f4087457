"""The `dp` placement: e2e data parallel. Every rank holds the whole GPT, DistributedDataParallel
averages the gradients, the global batch is the one a single process trains on.

Rows. Every rank reads the full global batch (`data.batch` rows) from its own RowLoader with the
run's seed, so all ranks see one stream, and trains on rows [rank*b, (rank+1)*b), b = batch / N.
Each rank's loss is the mean over its b rows; DDP's comm hook divides every gradient bucket by N
and sums it over the ranks, so the update is the gradient of the global mean: the same maths as
one process, summed in another order. With N a power of two the division is exact and the
gradients equal, bit for bit, one process accumulating N micro-batches of b rows (each loss / N).

The step's decision. After backward, one small all_reduce (float64: the ranks' float32 losses add
exactly) carries each rank's loss and one non-finite flag per rank; rank 0's word goes round on
the host beside it (`wire.Wire.agree_word`). A non-finite loss on any rank makes no update on any
rank, decided on the device, and fails the arm on every rank at that step once the host reads it
(`readout`), naming the first rank it showed on. The clip is `clip_grad_norm_` on the averaged gradients, the same on every
rank, as one process clips.

Traffic. The comm hook counts what DDP all-reduces (bytes, calls, seconds from issue to
completion) beside the analytic bytes, every parameter's gradient once per step. Rank 0 alone
reports the loss curve and evaluates the held-out set.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from seamkit.config import RunConfig
from seamkit.model import param_dtype
from seamkit.optim import make_optimizer
from seamkit.readout import Report, found_inf
from seamkit.seams import update as U
from seamkit.seams.placement import Layout
from seamkit.seams.schedules import build_stages
from seamkit.seams.wire import Tally, Timer, Wire, per_step


class DDPStep:
    """The e2e arm's step on one of N data-parallel ranks."""

    word_before = False  # rank 0's word rides in the step's all_reduce

    def __init__(self, cfg: RunConfig, lay: Layout, rank: int, world: int, device: torch.device, corpus,
                 wire_dtype: torch.dtype, faults=None):
        self.cfg, self.lay, self.rank, self.world, self.device = cfg, lay, rank, world, device
        self.tally, self.wait = Tally(), Timer(device)
        self.wire = Wire(rank, device, wire_dtype, param_dtype(cfg.train.dtype), self.tally, self.wait)
        self.seg = build_stages(cfg, lay, rank, device, wire_dtype)[0][0]  # the whole GPT, one stage
        self.ddp = DistributedDataParallel(self.seg, device_ids=[device] if device.type == "cuda" else None)
        self.ddp.register_comm_hook(None, self._allreduce)
        self.opt = make_optimizer(self.seg, cfg.train)
        self.opts = [self.opt]
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.seg.parameters() if p.requires_grad)
        self.ar_bytes = self.ar_calls = self.steps = 0
        self.ar_spans: list = []  # (start, end) marks of every bucket's all-reduce
        self.ar_s0 = 0.0  # all-reduce seconds before a resume
        self.sticky = torch.zeros((), device=device)  # a non-finite step seen, until the host reads it (`readout`)

    # -- the gradient all-reduce, measured

    def _mark(self):
        if self.device.type != "cuda":
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()  # on the current stream: the callback's is the one the all-reduce ran on
        return ev

    def _allreduce(self, state, bucket):
        """DDP's comm hook: the mean over the ranks of one bucket of gradients, counted and timed.
        (No annotations: DDP checks them by value, and this module's are strings.)"""
        t = bucket.buffer()
        self.ar_bytes += t.numel() * t.element_size()
        self.ar_calls += 1
        t.div_(self.world)  # before the sum, as torch's allreduce_hook (exact for a power-of-two N)
        start = self._mark()
        fut = dist.all_reduce(t, async_op=True).get_future()

        def done(f):
            # issue to completion: these seconds overlap the rest of backward's compute
            self.ar_spans.append((start, self._mark()))
            return f.value()[0]
        return fut.then(done)

    def _allreduce_seconds(self) -> float:
        """Seconds of all-reduce so far (a resumed rank's from before it stopped included)."""
        if self.device.type != "cuda":
            return self.ar_s0 + sum(end - start for start, end in self.ar_spans)
        torch.cuda.synchronize(self.device)
        return self.ar_s0 + sum(start.elapsed_time(end) for start, end in self.ar_spans) / 1000

    # -- the step

    def step(self, x_BT, y_BT, lr: float, word=lambda: 0) -> tuple[Report, int]:
        """One step on this rank's rows of the global batch; (its Report: the mean loss and a
        non-finite flag per rank, none read on the host; rank 0's word as every rank received it)."""
        N, r, b = self.world, self.rank, self.lay.rows
        loss = self.seg.loss(self.ddp(x_BT[r * b:(r + 1) * b]), y_BT[r * b:(r + 1) * b])
        loss.backward()  # the comm hook all-reduces bucket by bucket while backward runs
        self.steps += 1
        vec = torch.zeros(1 + N, device=self.device, dtype=torch.float64)  # loss | non-finite per rank
        vec[0] = loss.detach()
        vec[1 + r] = self.seg.bad + (~torch.isfinite(loss.detach()))
        self.seg.bad.zero_()
        word = self.wire.agree_word(word())  # rank 0 decides now, once the step's compute is queued
        self.wire.all_reduce(vec)  # one value and zeros per slot but the loss: exact
        mean = vec[0:1] / N
        bad_mean = torch.cat([(~torch.isfinite(mean)).to(vec.dtype), torch.zeros(N - 1, device=self.device,
                                                                                   dtype=vec.dtype)])
        flags = torch.stack([vec[1:], bad_mean])  # a rank's own flag first, then the mean's
        if self.cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.seg.parameters(), self.cfg.train.grad_clip)
        U.apply(self.opts, lr, found_inf(flags, self.sticky))
        return Report(mean, flags), word

    def plant(self, how: str) -> None:
        self.seg.poison = True

    def weights(self) -> dict:
        return {k: v.detach().cpu().clone() for k, v in self.seg.state_dict().items()}

    def load_weights(self, sd: dict) -> None:
        self.seg.load_state_dict({k: sd[k] for k in self.seg.state_dict()})

    def state(self) -> dict:
        return {"allreduce": {"bytes": self.ar_bytes, "calls": self.ar_calls, "steps": self.steps,
                              "seconds": self._allreduce_seconds()}}

    def restore(self, state: dict) -> None:
        ar = state["allreduce"]
        self.ar_bytes, self.ar_calls, self.steps, self.ar_s0 = ar["bytes"], ar["calls"], ar["steps"], ar["seconds"]

    @torch.no_grad()
    def evaluate(self, batches) -> list:
        """Rank 0: the whole model's held-out losses, as one process evaluates them; [] elsewhere."""
        if self.rank != 0:
            return []
        self.seg.eval()
        try:
            return [self.seg.loss(self.seg(x_BT), y_BT) for x_BT, y_BT in batches]
        finally:
            self.seg.train()

    def extra(self) -> dict:
        return {"allreduce": {"bytes_per_step": per_step(self.ar_bytes, self.steps),
                              "calls_per_step": per_step(self.ar_calls, self.steps),
                              "seconds": self._allreduce_seconds(), "bytes": self.ar_bytes, "calls": self.ar_calls,
                              "steps": self.steps, "analytic_bytes_per_step": self.param_bytes},
                "rows_per_rank": self.lay.rows}
