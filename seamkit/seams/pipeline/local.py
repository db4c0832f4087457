"""The local arm on real stages: forward-only messages through a bounded queue, no gradient ever.

A rank holds a contiguous run of the local segments (`plan.local_held`: the config's seams,
grouped by `plan.group_segments`) and each step runs them in order exactly as the one-process
local arm does (`seams.objectives.segment_losses`, `seams.arm.train_step`): forward a segment
from its input detached at the seam, its own loss (the LM loss on the last segment, else its
private module's, as `segment_losses` computes it for the objective: an AuxHead on the K most
frequent tokens, an AuxBlock on them, or a copy of the final norm and LM head on the next
tokens), backward at once; then the per-segment clip over what each segment owns and one
update. Each private module comes from the builder one process uses, with the same seed, so a
rank's module for segment k starts as one process's `heads[k]`. Only the output of the rank's
last segment goes on the wire; a seam inside a rank is a detach and nothing more. A stage keeps
at most `queue` steps of sends in flight (gloo sends complete only once the receiver has taken
them), so it runs at most that many steps ahead of the next one. This trains exactly what the single-process local arm
trains: segment k+1 at step n learns from the h_BTC that segment k computed at step n with its
weights after n updates. torch.distributed.pipelining has no counterpart: its schedules compute
a loss on the last stage only and send gradients back.

Steps and stops. Rank 0 decides each step (GO; STOP when the budget or max_steps is spent;
INTERRUPT on Ctrl-C; FAILED; PAUSE when the study's turn is used up, `seams.turns`) and the
command travels down with the activations, one int64 per crossing per step. PAUSE is no stop:
every rank passes it on, hands the turn on at that step boundary and goes on. A stage whose loss
is non-finite writes "rank:step" to the run's fault store (a
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
import torch.nn as nn

from seamkit.loop import BudgetLoop
from seamkit.model import GPT, autocast, lm_loss
from seamkit.optim import make_optimizer
from seamkit.seams.arm import token_counts
from seamkit.seams.objectives import (
    class_map,
    make_aux_blocks,
    make_aux_heads,
    make_own_heads,
)
from seamkit.seams.pipeline.stage import (
    FAILED,
    GO,
    PAUSE,
    SLOW_S,
    RankRun,
    fault,
    kind,
)


class LocalRun(RankRun):
    arm = "local"

    def __init__(self, cfg, plan, corpus, rank, device, emit, faults):
        S, N = plan.stages, len(plan.segs)
        super().__init__(cfg, plan, corpus, rank, device, emit, plan.segs, plan.local_owner)
        tc, m = cfg.train, cfg.model
        self.first, self.last = rank == 0, rank == S - 1
        for v in self.mine[:-1]:  # a seam inside this rank: a detach, nothing on the wire, no rounding to its dtype
            self.segs[v].wire_dtype = self.dtype
        # one AdamW for this rank's share of the GPT, one for its heads: AdamW (fused) is elementwise, so
        # a share of one process's optimizer updates it exactly as the whole one does
        self.opt = make_optimizer(nn.ModuleList([self.segs[v] for v in self.mine]), tc)
        self.objective = cfg.seams.objective
        if self.mine[0] < N - 1:  # a non-final segment here: private modules as one process makes them (k: segment k)
            heads = self._private_modules(N - 1)
            self.heads = {v: heads[v].to(device=device, dtype=self.dtype) for v in self.mine if v < N - 1}
            self.head_opt = make_optimizer(nn.ModuleList(self.heads.values()), tc)
            if self.objective != "own_head":  # own_head reads the vocabulary itself
                self.classes = class_map(token_counts(corpus, "train", m.vocab), cfg.seams.aux_classes).to(device)
        # what each segment clips together, in one process's order (`seams.arm.build_arm`'s groups)
        self.groups = [list(self.segs[v].parameters()) + (list(self.heads[v].parameters()) if v in self.heads else [])
                       for v in self.mine]
        self.faults = faults  # the run's fault store (see the module docstring)
        # boundaries of the seams into and out of this rank (the wire counts messages by seam)
        self.seam_in, self.seam_out = self.mine[0] - 1, self.mine[-1]

    def _private_modules(self, n: int) -> nn.ModuleList:
        """The n private modules of `seams.arm.build_arm`, from its builders and seeds."""
        tc, m, k = self.cfg.train, self.cfg.model, self.cfg.seams.aux_classes
        if self.objective == "aux_head":
            return make_aux_heads(m, n, k, tc.seed)
        if self.objective == "aux_block":
            return make_aux_blocks(m, n, k, tc.seed)
        # own_head copies the initial final norm and LM head, which only the last rank holds: every
        # rank rebuilds the GPT as RankRun does (same seed, same dtype; the init draws on the CPU
        # whatever the device), leaving the global RNG as it was
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(tc.seed)
            model = GPT(m).to(dtype=self.dtype)
        return make_own_heads(model, n)

    # -- control

    def _control(self, cmd: int | None) -> int:
        """Rank 0 passes its decision; the others receive it."""
        if not self.first:
            buf = self.wire.recv((1,), self.rank - 1, "control", dtype=torch.long, boundary=self.seam_in)
            cmd = int(buf.item())
        return cmd

    def _pass_on(self, cmd: int) -> None:
        """On to the next stage; a stage that stopped takes no more messages."""
        if not self.last and not self.told_stop:
            self.wire.send(torch.tensor([cmd], dtype=torch.long, device=self.device), self.rank + 1, "control",
                           boundary=self.seam_out)
            self.told_stop = kind(cmd) not in (GO, PAUSE)

    # -- the loop

    def loop(self, loop: BudgetLoop) -> None:
        self.told_stop, failed, key = False, False, f"{self.arm}/failed"
        while True:
            cmd = self.word(loop, loop.steps, failed or self.faults.check([key])) if self.first else None
            cmd = self._control(cmd)
            self._pass_on(FAILED if failed and kind(cmd) == GO else cmd)
            if not self.obey(loop, cmd, loop.steps):
                break
            if kind(cmd) == PAUSE:
                continue
            if failed:  # take what upstream still sends, until it stops
                self.wire.recv(self.h_shape, self.rank - 1, "activation", boundary=self.seam_in)
                continue
            step, t0 = self.begin(loop)
            values = self.step(step)
            self.extra["wire_steps"] += 1
            if not all(math.isfinite(v) for v in values):
                loop.fail(step)
                self.extra["failed_here"] = True
                failed = True
                self.faults.set(key, f"{self.rank}:{step}")
                continue
            loop.stepped(step, t0, self.lr, values)  # its after_step keeps this rank's snapshot
        self.wire.commit(0)
        # the budget may end as a stage fails: agree before anyone evaluates (one tiny collective)
        flag = torch.tensor([float(loop.run["status"] == "failed")], device=self.device)
        if self.wire.all_reduce(flag).item() > 0:
            loop.run["status"] = "failed"

    def step(self, step: int) -> list[float]:
        """This rank's segments in order, as `seams.arm.train_step` runs them; the last one's h_BTC
        goes on (at most `queue` steps in flight). Returns each segment's training loss."""
        x_BT, y_BT = self.loader.next()
        how = fault(self.rank, step, self.arm)
        if how == "slow":
            with self.compute:
                time.sleep(SLOW_S)
        inp = x_BT if self.first else self.wire.recv(self.h_shape, self.rank - 1, "activation", boundary=self.seam_in)
        losses = []
        for v in self.mine:
            with self.compute:
                out = self.segs[v](inp)
            if v == self.seam_out and not self.last:
                self.wire.send(out, self.rank + 1, "activation", boundary=v)
                self.wire.commit(self.plan.queue)
            with self.compute:
                with autocast(self.device, self.cfg.train.dtype):
                    loss = self._loss(v, out, y_BT)
                if how == "nan" and v == self.seam_out:
                    loss = loss * float("nan")
                loss.backward()  # now, before the next segment runs: frees this segment's activations
                losses.append(loss.detach())
            inp = out.detach()  # the seam: no gradient reaches the segment before
        with self.compute:
            values = torch.stack(losses).tolist()
            opts = self.opts()
            if all(math.isfinite(v) for v in values):
                if self.cfg.train.grad_clip > 0:
                    for group in self.groups:
                        torch.nn.utils.clip_grad_norm_(group, self.cfg.train.grad_clip)
                self.update(*opts)
            for o in opts:
                o.zero_grad(set_to_none=True)
        return values

    def _loss(self, v: int, out: torch.Tensor, y_BT: torch.Tensor) -> torch.Tensor:
        """Segment v's own loss, as `seams.objectives.segment_losses` computes it."""
        if v == len(self.all_segs) - 1:
            return lm_loss(out, y_BT)  # the logits of the final norm and LM head
        h_BTC = out.to(self.dtype)
        if self.objective == "aux_head":
            return lm_loss(self.heads[v](h_BTC), self.classes[y_BT])
        if self.objective == "aux_block":
            return lm_loss(self.heads[v](h_BTC, self.segs[v].ctx), self.classes[y_BT])
        return lm_loss(self.heads[v](h_BTC), y_BT)  # own_head: the next tokens over the vocabulary

