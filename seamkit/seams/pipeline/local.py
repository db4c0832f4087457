"""The local arm on real stages: forward-only messages through a bounded queue, no gradient ever.

Every stage trains its own objective on what it received (`seams.AuxHead` on the K most
frequent tokens; the last stage the LM loss). A stage keeps at most `queue` steps of sends in
flight (gloo sends complete only once the receiver has taken them), so it runs at most that
many steps ahead of the next one. This trains exactly what the single-process local arm trains:
stage k+1 at step n learns from the h_BTC that stage k computed at step n with its weights after
n updates, as `seams.segment_losses` does. torch.distributed.pipelining has no counterpart: its
schedules compute a loss on the last stage only and send gradients back.

Steps and stops. Rank 0 decides each step (GO, STOP when the budget or max_steps is spent,
INTERRUPT on Ctrl-C, FAILED) and the command travels down with the activations, one int64 per
seam per step. A stage whose loss is non-finite writes "rank:step" to the run's fault store (a
key-value store beside the process group, not a message on the wire, so no pending receive can
hold up the communicators); rank 0 looks at the store before every step and sends FAILED down.
Until then the failed stage takes what upstream still sends, so no rank blocks, and the whole
pipeline stops within a few steps. One all_reduce after the loop makes every rank agree on
whether the arm failed before anyone evaluates.
"""

from __future__ import annotations

import math
import time

import torch

from seamkit.loop import BudgetLoop
from seamkit.model import autocast, lm_loss
from seamkit.optim import make_optimizer
from seamkit.seams.arm import token_counts
from seamkit.seams.objectives import class_map, make_aux_heads
from seamkit.seams.pipeline.stage import SLOW_S, RankRun, fault, stop_requested

GO, STOP, INTERRUPT, FAILED = 1, 0, 2, 3  # control values


class LocalRun(RankRun):
    arm = "local"

    def __init__(self, cfg, plan, corpus, rank, device, emit, faults):
        S = plan.stages
        super().__init__(cfg, plan, corpus, rank, device, emit, plan.segs, list(range(S)))
        tc, m = cfg.train, cfg.model
        self.first, self.last = rank == 0, rank == S - 1
        self.seg = self.segs[rank]
        self.opt = make_optimizer(self.seg, tc)
        self.head = self.head_opt = self.classes = None
        if not self.last:
            heads = make_aux_heads(m, S - 1, cfg.seams.aux_classes, tc.seed)  # the same init as one process
            self.head = heads[rank].to(device=device, dtype=self.dtype)
            self.head_opt = make_optimizer(self.head, tc)
            self.classes = class_map(token_counts(corpus, "train", m.vocab), cfg.seams.aux_classes).to(device)
        self.faults = faults  # the run's fault store (see the module docstring)

    # -- control

    def _control(self, cmd: int | None) -> int:
        """Rank 0 passes its decision; the others receive it."""
        if not self.first:
            buf = self.wire.recv((1,), self.rank - 1, "control", dtype=torch.long)
            cmd = int(buf.item())
        return cmd

    def _pass_on(self, cmd: int) -> None:
        """On to the next stage; a stage that stopped takes no more messages."""
        if not self.last and not self.told_stop:
            self.wire.send(torch.tensor([cmd], dtype=torch.long, device=self.device), self.rank + 1, "control")
            self.told_stop = cmd != GO

    # -- the loop

    def loop(self, loop: BudgetLoop) -> None:
        self.told_stop, failed, key = False, False, f"{self.arm}/failed"
        while True:
            cmd = None
            if self.first:
                cmd = (INTERRUPT if stop_requested() else FAILED if failed or self.faults.check([key])
                       else STOP if loop.spent() else GO)
            cmd = self._control(cmd)
            self._pass_on(FAILED if failed and cmd == GO else cmd)
            if cmd != GO:
                if cmd == INTERRUPT:
                    loop.interrupt()
                elif cmd == FAILED:
                    loop.run["status"] = "failed"
                break
            if failed:  # take what upstream still sends, until it stops
                self.wire.recv(self.h_shape, self.rank - 1, "activation")
                continue
            step, t0 = self.begin(loop)
            value = self.step(step)
            self.extra["wire_steps"] += 1
            if not math.isfinite(value):
                loop.fail(step)
                self.extra["failed_here"] = True
                failed = True
                self.faults.set(key, f"{self.rank}:{step}")
                continue
            loop.stepped(step, t0, self.lr, [value])
        self.wire.commit(0)
        # the budget may end as a stage fails: agree before anyone evaluates (one tiny collective)
        flag = torch.tensor([float(loop.run["status"] == "failed")], device=self.device)
        if self.wire.all_reduce(flag).item() > 0:
            loop.run["status"] = "failed"

    def step(self, step: int) -> float:
        """Forward, send h_BTC on (at most `queue` steps in flight), then learn from the local loss."""
        x_BT, y_BT = self.loader.next()
        how = fault(self.rank, step, self.arm)
        if how == "slow":
            with self.compute:
                time.sleep(SLOW_S)
        inp = x_BT if self.first else self.wire.recv(self.h_shape, self.rank - 1, "activation")
        with self.compute:
            out = self.seg(inp)
        if not self.last:
            self.wire.send(out, self.rank + 1, "activation")
        self.wire.commit(self.plan.queue)
        with self.compute:
            with autocast(self.device, self.cfg.train.dtype):
                loss = lm_loss(out, y_BT) if self.last else lm_loss(self.head(out.to(self.dtype)), self.classes[y_BT])
            if how == "nan":
                loss = loss * float("nan")
            loss.backward()
            value = loss.item()
            opts = [o for o in (self.opt, self.head_opt) if o is not None]
            if math.isfinite(value):
                if self.cfg.train.grad_clip > 0:
                    params = list(self.seg.parameters()) + (list(self.head.parameters()) if self.head else [])
                    torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
                self.update(*opts)
            for o in opts:
                o.zero_grad(set_to_none=True)
        return value

    def state(self) -> dict:
        return super().state() | {"head": None if self.head is None else
                                  {k: v.detach().cpu() for k, v in self.head.state_dict().items()}}
