"""The e2e arm on real stages: a torch.distributed.pipelining schedule, one global-norm clip.

Each rank wraps its segments (`plan.owner`: one, or two for the multi-stage schedules) in
`CountedStage`, a PipelineStage that counts every P2P op it hands to the schedule and times its
own forward and backward chunks. Shapes are given up front (static mode: no metadata messages
at step time). The loss is `lm_loss(logits_b, y_b) / M` per micro-batch with `scale_grads=False`,
so each micro-batch backpropagates exactly what one process doing the same micro-batched step
backpropagates, and the gradients accumulate over micro-batches in the same order.

After the schedule's step, one small all_reduce carries every parameter tensor's gradient norm
at its place in the GPT's order, the summed loss, one non-finite flag per segment and rank 0's
flag (budget spent, max_steps, Ctrl-C, or the study's turn to hand on). Every rank then clips by the global norm exactly
as `clip_grad_norm_` does in one process, and every rank sees a non-finite loss, and the first
segment that produced a non-finite output, at the same step: the run stops there on all ranks
with `failed`, naming the rank and step.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn as nn
from torch.distributed import pipelining

from seamkit.loop import BudgetLoop
from seamkit.model import lm_loss
from seamkit.optim import make_optimizer
from seamkit.seams.pipeline.plan import SCHEDULE_CLASSES, WIRE_DTYPES
from seamkit.seams.pipeline.stage import (
    SLOW_S,
    RankRun,
    fault,
)
from seamkit.seams.pipeline.wire import Tally, Timer, timed_pipeline_waits


class CountedStage(pipelining.PipelineStage):
    """A PipelineStage that counts the tensors of every P2P op it issues and times its compute.

    Boundary v lies between virtual stages v and v+1: forward sends of stage v and gradient
    receives of stage v cross boundary v; forward receives and gradient sends, boundary v-1.
    """

    def __init__(self, *args, tally: Tally, compute: Timer, **kw):
        super().__init__(*args, **kw)
        self.tally, self.compute = tally, compute

    def _count(self, ops, direction: str, kind: str, boundary: int):
        for op in ops:
            self.tally.add(direction, kind, boundary, op.tensor)
        return ops

    def get_fwd_send_ops(self, i):
        return self._count(super().get_fwd_send_ops(i), "sent", "activation", self.stage_index)

    def get_fwd_recv_ops(self, i):
        return self._count(super().get_fwd_recv_ops(i), "received", "activation", self.stage_index - 1)

    def get_bwd_send_ops(self, i):
        return self._count(super().get_bwd_send_ops(i), "sent", "gradient", self.stage_index - 1)

    def get_bwd_recv_ops(self, i):
        return self._count(super().get_bwd_recv_ops(i), "received", "gradient", self.stage_index)

    def forward_one_chunk(self, *args, **kw):
        with self.compute:
            return super().forward_one_chunk(*args, **kw)

    def backward_one_chunk(self, *args, **kw):
        with self.compute:
            return super().backward_one_chunk(*args, **kw)

    def backward_weight_one_chunk(self, *args, **kw):
        with self.compute:
            return super().backward_weight_one_chunk(*args, **kw)


class E2ERun(RankRun):
    arm = "e2e"

    def __init__(self, cfg, plan, corpus, rank, device, emit, faults=None):
        super().__init__(cfg, plan, corpus, rank, device, emit, plan.e2e_segs, plan.owner)
        M, V, m = plan.micro_batches, len(plan.owner), cfg.model
        b = cfg.data.batch // M
        wire = WIRE_DTYPES[plan.wire_dtype]
        on_gpu_bf16 = device.type == "cuda" and cfg.train.dtype in ("float32", "bfloat16")  # model.autocast's rule
        logits = torch.bfloat16 if on_gpu_bf16 else self.dtype
        stages = []
        for v in self.mine:
            # static shapes; requires_grad marks what has a gradient to send back
            inp = torch.empty(b, m.seq, dtype=torch.long, device=device) if v == 0 else \
                torch.empty(b, m.seq, m.dim, dtype=wire, device=device, requires_grad=True)
            out = torch.empty(b, m.seq, m.vocab, dtype=logits, device=device, requires_grad=True) if v == V - 1 \
                else torch.empty(b, m.seq, m.dim, dtype=wire, device=device, requires_grad=True)
            stages.append(CountedStage(self.segs[v], v, V, device, input_args=inp, output_args=out,
                                       tally=self.tally, compute=self.compute))
        cls = getattr(pipelining.schedules, SCHEDULE_CLASSES[plan.schedule][0])
        one = SCHEDULE_CLASSES[plan.schedule][1] == "single"
        self.sched = cls(stages[0] if one else stages, n_microbatches=M, loss_fn=self._loss, scale_grads=False)
        self.module = nn.ModuleList(self.segs[v] for v in self.mine)
        self.opt = make_optimizer(self.module, cfg.train)
        self.V = V

    def _loss(self, logits_bTV, y_bT):
        with self.compute:
            return lm_loss(logits_bTV, y_bT) / self.plan.micro_batches

    def loop(self, loop: BudgetLoop) -> None:
        tc, n, V = self.cfg.train, self.n_tensors, self.V
        while True:
            step, t0 = self.begin(loop)
            x_BT, y_BT = self.loader.next()
            how = fault(self.rank, step, self.arm)
            if how == "slow":
                with self.compute:
                    time.sleep(SLOW_S)
            if how and how.startswith("nan"):  # "nan" or "nan@K": the rank's first or K-th segment
                self.segs[self.mine[int(how.partition("@")[2] or 0)]].poison = True
            losses: list = []
            with timed_pipeline_waits(self.wait):
                self.sched.step(*((x_BT,) if 0 in self.mine else ()),
                                target=y_BT if self.rank == self.loss_rank else None,
                                losses=losses, return_outputs=False)
            self.extra["wire_steps"] += 1
            # gradient norms at their places in the GPT's order | loss | non-finite per segment | stop
            with self.compute:
                vec = torch.zeros(n + 1 + V + 1, device=self.device, dtype=self.dtype)
                for v, seg in self.segs.items():
                    grads = [p.grad for p in seg.parameters()]
                    vec[self.offsets[v]:self.offsets[v] + len(grads)] = torch.stack(torch._foreach_norm(grads, 2.0))
                    vec[n + 1 + v] = seg.bad
                    seg.bad.zero_()
                if self.rank == self.loss_rank:
                    total = torch.zeros((), device=self.device, dtype=self.dtype)
                    for loss in losses:  # micro-batch order, as one process adds them
                        total += loss.detach()
                    vec[n] = total
            if self.rank == 0:
                vec[-1] = self.word(loop, step + 1)
            self.wire.all_reduce(vec)  # sums of one value and zeros: exact
            loss = vec[n].item()
            bad = [v for v in range(V) if vec[n + 1 + v].item() > 0]
            if bad or not math.isfinite(loss):
                at = bad[0] if bad else V - 1  # the first segment whose output went non-finite
                loop.fail(step)
                self.extra["failed_here"] = self.owner[at] == self.rank
                self.opt.zero_grad(set_to_none=True)
                return
            with self.compute:
                if tc.grad_clip > 0:  # clip_grad_norm_'s total: the norm of the stacked norms
                    total_norm = torch.linalg.vector_norm(vec[:n], 2.0)
                    torch.nn.utils.clip_grads_with_norm_(self.module.parameters(), tc.grad_clip, total_norm)
                self.update(self.opt)
            loop.stepped(step, t0, self.lr, [loss])
            if not self.obey(loop, int(vec[-1].item()), step + 1):
                return
