"""The e2e arm placed data-parallel: every rank holds the whole GPT, DistributedDataParallel
averages the gradients, the global batch is the one a single process trains on.

Rows. Every rank reads the full global batch (`data.batch` rows) from its own RowLoader with the
run's seed, so all ranks see one stream, and trains on rows [rank*b, (rank+1)*b), b = batch / N.
Each rank's loss is the mean over its b rows; DDP's comm hook divides every gradient bucket by N
and sums it over the ranks, so the update is the gradient of the global mean: the same maths as
one process, summed in another order. With N a power of two the division is exact and the
gradients equal, bit for bit, one process accumulating N micro-batches of b rows (each loss / N).

The step's decision. After backward, one small all_reduce carries each rank's loss (their mean is
the global mean loss, the rows being equal in number), one non-finite flag per rank and rank 0's
flag (INTERRUPT > STOP > PAUSE > GO: Ctrl-C, budget or max_steps spent, the study's turn to hand
on). A non-finite loss on any rank fails the arm on every rank at that step, with no update, and
names the first rank it showed on. The clip is `clip_grad_norm_` on the averaged gradients, the
same on every rank, as one process clips.

Traffic. The comm hook counts what DDP all-reduces (bytes, calls, seconds from issue to
completion) beside the analytic bytes, every parameter's gradient once per step (`result`'s
"allreduce"). Rank 0 alone reports the loss curve and evaluates the held-out set.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from seamkit.config import ConfigError, RunConfig
from seamkit.loop import BudgetLoop, evaluate_model
from seamkit.model import lm_loss
from seamkit.optim import make_optimizer
from seamkit.seams.pipeline.stage import (
    SLOW_S,
    RankRun,
    fault,
)
from seamkit.seams.pipeline.wire import _per_step


def check_batch(cfg: RunConfig, ranks: int) -> int:
    """Rows per rank; a one-line ConfigError when the global batch does not split evenly."""
    B = cfg.data.batch
    if ranks < 1 or B % ranks:
        raise ConfigError(f"data.batch={B} does not split over {ranks} data-parallel ranks: "
                          f"set data.batch to a multiple of {ranks}")
    return B // ranks


class DPRun(RankRun):
    """The e2e arm on one of N data-parallel ranks (N = plan.stages); the whole GPT in one Segment."""

    arm = "e2e"

    def __init__(self, cfg, plan, corpus, rank, device, emit, faults=None):
        self.world = plan.stages
        self.b = check_batch(cfg, self.world)  # before anything is built
        # owner [rank]: this rank holds the one segment of all blocks (RankRun's bookkeeping as is)
        super().__init__(cfg, plan, corpus, rank, device, emit, [list(range(cfg.model.n_blocks))], [rank])
        self.loss_rank = 0  # reports the curve and evaluates; every rank knows the loss after the all_reduce
        if rank != 0:
            self.held_out = [None] * len(self.held_out)  # counted, never evaluated here
        self.seg = self.segs[0]  # virtual stage 0, the only one
        self.ddp = DistributedDataParallel(self.seg, device_ids=[device] if device.type == "cuda" else None)
        self.ddp.register_comm_hook(None, self._allreduce)
        self.opt = make_optimizer(self.seg, cfg.train)
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.seg.parameters() if p.requires_grad)
        self.ar_bytes = self.ar_calls = 0
        self.ar_spans: list = []  # (start, end) marks of every bucket's all-reduce
        self.ar_s0 = 0.0  # all-reduce seconds before a resume

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
            # issue to completion: these seconds overlap the rest of backward's compute, which
            # runs meanwhile, so they are not a share of the step (compute_s holds backward's
            # wait for the last bucket)
            self.ar_spans.append((start, self._mark()))
            return f.value()[0]
        return fut.then(done)

    def _allreduce_seconds(self) -> float:
        """Seconds of all-reduce so far (a resumed rank's from before it stopped included)."""
        if self.device.type != "cuda":
            return self.ar_s0 + sum(end - start for start, end in self.ar_spans)
        torch.cuda.synchronize(self.device)
        return self.ar_s0 + sum(start.elapsed_time(end) for start, end in self.ar_spans) / 1000

    def more_state(self) -> dict:
        return {"allreduce": {"bytes": self.ar_bytes, "calls": self.ar_calls, "seconds": self._allreduce_seconds()}}

    def restore_more(self, state: dict) -> None:
        ar = state["allreduce"]
        self.ar_bytes, self.ar_calls, self.ar_s0 = ar["bytes"], ar["calls"], ar["seconds"]

    # -- the loop

    def loop(self, loop: BudgetLoop) -> None:
        tc, N, b, r = self.cfg.train, self.world, self.b, self.rank
        seg = self.seg
        while True:
            step, t0 = self.begin(loop)
            x_BT, y_BT = self.loader.next()  # the global batch, as one process reads it
            x_bT, y_bT = x_BT[r * b:(r + 1) * b], y_BT[r * b:(r + 1) * b]
            how = fault(r, step, self.arm)
            if how == "slow":
                with self.compute:
                    time.sleep(SLOW_S)
            if how and how.startswith("nan"):
                seg.poison = True
            with self.compute:
                loss = lm_loss(self.ddp(x_bT), y_bT)
                loss.backward()  # the comm hook all-reduces bucket by bucket while backward runs
            self.extra["wire_steps"] += 1
            # this rank's loss | rank 0's flag | non-finite per rank; float64: the ranks' float32
            # losses add exactly
            vec = torch.zeros(2 + N, device=self.device, dtype=torch.float64)
            vec[0] = loss.detach()
            vec[2 + r] = seg.bad + (~torch.isfinite(loss.detach()))
            seg.bad.zero_()
            if r == 0:
                vec[1] = self.word(loop, step + 1)
            self.wire.all_reduce(vec)  # one value and zeros per slot but the loss: exact
            mean = (vec[0] / N).item()
            bad = [k for k in range(N) if vec[2 + k].item() > 0]
            if bad or not math.isfinite(mean):
                loop.fail(step)
                self.extra["failed_here"] = (bad[0] if bad else 0) == r
                self.opt.zero_grad(set_to_none=True)
                return
            with self.compute:
                if tc.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(seg.parameters(), tc.grad_clip)
                self.update(self.opt)
            loop.stepped(step, t0, self.lr, [mean])
            if not self.obey(loop, int(vec[1].item()), step + 1):
                return

    @torch.no_grad()
    def evaluate(self) -> tuple[float | None, float | None]:
        """Rank 0: the whole model's held-out loss, as one process evaluates it; None elsewhere."""
        if self.rank != self.loss_rank:
            return None, None
        value, stderr = evaluate_model(self.seg, self.held_out)  # the Segment autocasts itself
        return (value, stderr) if math.isfinite(value) else (None, None)

    def result(self, run: dict) -> dict:
        steps = run["wire_steps"]  # steps whose gradients went on the wire (a failed one too)
        return super().result(run) | {"placement": "dp", "ranks": self.world, "rows_per_rank": self.b,
                                      "allreduce": {
            "bytes_per_step": _per_step(self.ar_bytes, steps),
            "calls_per_step": _per_step(self.ar_calls, steps),
            "seconds": self._allreduce_seconds(),
            "bytes": self.ar_bytes, "calls": self.ar_calls, "steps": steps,
            "analytic_bytes_per_step": self.param_bytes,
        }}
