"""The delayed arm on real stages: activations forward, output-gradients back `seams.delay` steps
late per seam, through bounded queues of sends in flight.

The maths is the one-process arm's (`seams.delayed`, whose docstring defines it), on the local
arm's segments (`plan.segs`, grouped into contiguous runs by `plan.local_held`). At step t each
rank runs its segments' forwards of batch t under their current weights and hands the output of
its last one to the next rank (at most `plan.queue` steps of sends in flight, as local's). A
segment k whose gradient comes later keeps its input, and with `weight_stashing` its forward's
graph over a detached copy of the weights it used (`seams.delayed.kept_forward`); its
output-gradient for batch t comes back at step t + d*(S-1-k) (`delay_of`), where it
backpropagates through the kept graph (without stashing, through its forward re-run under the
current weights, which batch t's forward did not use) and passes its input-gradient on: to the segment
before it on this rank (an inbox, exactly as one process keeps it), or across the seam to the
previous rank, sent at once (`isend`). A seam inside a rank is simulated within the rank.

The gradient queue. A gradient sent across seam k at step t is taken by the previous rank at
step t+d, so a rank keeps at most d steps of gradient sends in flight (its own `Wire`, committed
with keep=d after every step): with d >= 1 every gradient a rank needs was sent a step or more
before, and no rank waits for one in steady state. The d sends still in flight when the arm
ends are taken (and counted as received) before evaluation.

The step's one collective. One global-norm clip over every gradient of the step (the GPT's,
then the aux heads', the one-process order) needs every gradient's norm: after the backwards,
one small all_reduce carries each parameter tensor's gradient norm at its place in that order
and a 1 where it has a gradient (a segment with no gradient yet is left out of the clip, as
`clip_grad_norm_` leaves out a parameter without one), every segment's training loss, and one
non-finite flag per segment. Each slot has one writer and zeros elsewhere, so the sum is exact
and every rank clips by the norm one process computes, sees every loss, and sees a non-finite
loss or output at the same step: the arm fails there on every rank, with no update, and
`failed_here` names the rank of the first segment that went non-finite. It is the only
per-step collective besides what `RankRun` has.

Steps and stops, as local's: rank 0 decides each step (GO, STOP, INTERRUPT, PAUSE) and the
command goes down with the activations; on PAUSE every rank hands the turn on at the same step
boundary (`seams.turns`; a turn runs at least one step).

Traffic (`wire.Tally`): "activation" once per crossing per step; "gradient" once per crossing
per step once the pipeline has filled to the segment after the seam (`expected_traffic`), so in
steady state a step carries crossings x activation bytes, twice. What the arm keeps in flight
(kept inputs, stashed weights, kept graphs, gradients in an inbox or in the send queue) lives in
the rank's process, so its memory measurement holds it; `kept_bytes` counts it (a kept graph as
one process counts it, `seams.delayed.graph_bytes`), `peak_kept_bytes` its peak.
"""

from __future__ import annotations

import math
import time
from collections import deque

import torch
import torch.nn as nn

from seamkit.loop import BudgetLoop
from seamkit.model import autocast, lm_loss
from seamkit.optim import make_optimizer
from seamkit.seams.arm import token_counts
from seamkit.seams.delayed import (
    entry_to,
    entry_to_cpu,
    graph_bytes,
    kept_forward,
    rng_of,
    under_rng,
)
from seamkit.seams.objectives import class_map, make_aux_heads
from seamkit.seams.pipeline.plan import WIRE_DTYPES, Plan
from seamkit.seams.pipeline.stage import (
    PAUSE,
    SLOW_S,
    RankRun,
    fault,
    kind,
)
from seamkit.seams.pipeline.wire import Wire


def expected_traffic(plan: Plan, delay: int, steps: int) -> dict[int, dict[str, int]]:
    """Messages each crossing k carries in `steps` steps: an activation every step; a gradient
    every step from the one its sender, segment k+1, first backpropagates (step d*(S-2-k))."""
    N = len(plan.segs)
    return {k: {"activation": steps, "gradient": max(0, steps - delay * (N - 2 - k))} for k in plan.local_crossings()}


class DelayedRun(RankRun):
    arm = "delayed"

    def __init__(self, cfg, plan, corpus, rank, device, emit, faults=None):
        super().__init__(cfg, plan, corpus, rank, device, emit, plan.segs, plan.local_owner)
        tc, m, sc = cfg.train, cfg.model, cfg.seams
        N = self.N = len(plan.segs)
        self.first, self.last = rank == 0, rank == plan.stages - 1
        self.d, self.stashing, self.w = sc.delay, sc.weight_stashing, sc.local_weight
        for v in self.mine[:-1]:  # a seam inside this rank: a detach, no rounding to the wire dtype
            self.segs[v].wire_dtype = self.dtype
        self.opt = make_optimizer(nn.ModuleList([self.segs[v] for v in self.mine]), tc)
        self.classes, self.head_offsets, self.n_head_tensors = None, {}, 0
        if self.w > 0 and N > 1:  # one AuxHead per non-final segment, as one process makes them
            heads = make_aux_heads(m, N - 1, sc.aux_classes, tc.seed)
            at = 0
            for k, h in enumerate(heads):  # where each head's tensors sit after the GPT's (the clip's order)
                self.head_offsets[k] = at
                at += len(list(h.parameters()))
            self.n_head_tensors = at
            self.heads = {v: heads[v].to(device=device, dtype=self.dtype) for v in self.mine if v < N - 1}
            if self.heads:
                self.head_opt = make_optimizer(nn.ModuleList(self.heads.values()), tc)
                self.classes = class_map(token_counts(corpus, "train", m.vocab), sc.aux_classes).to(device)
        self.stash = {v: deque() for v in self.mine}  # {"batch", "input", "weights"[, "out", "graph"]}
        self.inbox = {v: deque() for v in self.mine}  # output-gradients from the next segment on this rank
        # gradients to the previous rank: their own queue, taken d steps after they are sent
        self.gwire = Wire(rank, device, WIRE_DTYPES[plan.wire_dtype], self.dtype, self.tally, self.wait)
        self.seam_in, self.seam_out = self.mine[0] - 1, self.mine[-1]
        self.grads_received = self.grads_drained = self.peak_kept_bytes = 0

    def delay_of(self, k: int) -> int:
        """Steps between segment k's forward of a batch and its backward of it: d*(S-1-k)."""
        return self.d * (self.N - 1 - k)

    def kept_bytes(self) -> int:
        """Kept inputs, stashed weights, output-gradients in an inbox or in the send queue, and
        what the kept graphs hold besides them (`seams.delayed.graph_bytes`)."""
        held = [t for q in self.stash.values() for e in q for t in (e["input"], *(e["weights"] or {}).values())]
        held += [e["grad"] for q in self.inbox.values() for e in q]
        held += [t for group in [*self.gwire.inflight, self.gwire.group] for _, t in group]
        return sum(t.nbytes for t in held) + graph_bytes(self.stash.values(), held)

    def _peak(self) -> None:
        self.peak_kept_bytes = max(self.peak_kept_bytes, self.kept_bytes())

    # -- control, as local's

    def _control(self, cmd: int | None) -> int:
        if not self.first:
            buf = self.wire.recv((1,), self.rank - 1, "control", dtype=torch.long, boundary=self.seam_in)
            cmd = int(buf.item())
        if not self.last:
            self.wire.send(torch.tensor([cmd], dtype=torch.long, device=self.device), self.rank + 1, "control",
                           boundary=self.seam_out)
        return cmd

    # -- the loop

    def loop(self, loop: BudgetLoop) -> None:
        while True:
            cmd = self._control(self.word(loop, loop.steps) if self.first else None)
            if not self.obey(loop, cmd, loop.steps):
                break
            if kind(cmd) == PAUSE:
                continue
            step, t0 = self.begin(loop)
            values = self.step(step)
            self.extra["wire_steps"] += 1
            if values is None:
                loop.fail(step)
                break
            loop.stepped(step, t0, self.lr, values)
        self.final_state = self.resume_state(loop)  # before the drain takes the gradients still due
        self._drain()

    def _drain(self) -> None:
        """Take the gradients still on their way from the next rank (every rank has run the same
        steps), so every send completes; then nothing of this arm is in flight."""
        if not self.last:
            sent = max(0, self.extra["wire_steps"] - self.delay_of(self.seam_out + 1))
            for _ in range(sent - self.grads_received):
                self.gwire.recv(self.h_shape, self.rank + 1, "gradient", boundary=self.seam_out)
                self.grads_drained += 1
        self.gwire.commit(0)

    def _late_backward(self, k: int, entry: dict, g_BTC: torch.Tensor) -> torch.Tensor | None:
        """Segment k's backward of a kept batch (`seams.delayed._late_backward`): through its kept
        graph (stashed weights), or its forward re-run on the kept input under the current
        weights; the weight gradients go into the live parameters. Returns the input-gradient."""
        seg, first = self.segs[k], k == 0
        if entry["weights"] is not None:
            out, inp = entry["out"], entry["input"]
            leaves = [entry["weights"][n] for n, _ in seg.named_parameters()]
        else:
            inp = entry["input"] if first else entry["input"].requires_grad_()
            leaves = list(seg.parameters())
            out = seg(inp)
        grads = torch.autograd.grad(out, leaves + ([] if first else [inp]), g_BTC)
        for p, g in zip(seg.parameters(), grads):
            p.grad = g if p.grad is None else p.grad + g
        return None if first else grads[-1]

    def step(self, t: int) -> list[float] | None:
        """Step t on this rank's segments, as `seams.delayed.delayed_step` runs them; returns the
        step's training losses (every segment's aux loss when local_weight > 0, then the LM
        loss), or None when one of them, or an output, went non-finite on any rank (no update)."""
        x_BT, y_BT = self.loader.next()
        w, last = self.w, self.N - 1
        how = fault(self.rank, t, self.arm)
        if how == "slow":
            with self.compute:
                time.sleep(SLOW_S)
        if how and how.startswith("nan"):  # "nan" or "nan@K": the output of the rank's first or K-th segment
            self.segs[self.mine[int(how.partition("@")[2] or 0)]].poison = True
        inp = x_BT if self.first else self.wire.recv(self.h_shape, self.rank - 1, "activation", boundary=self.seam_in)
        now, losses = {}, {}  # now: delay-0 segments' (input, output, aux loss) to backpropagate this step
        for k in self.mine:
            late = self.delay_of(k) > 0
            kept = late and self.stashing  # the forward's graph waits in the stash for its gradient
            h_in = None if k == 0 else inp.detach()
            if h_in is not None and (kept or not late):
                h_in.requires_grad_()
            with self.compute, torch.set_grad_enabled(not late or w > 0):
                if kept:
                    weights = {n: p.detach().clone().requires_grad_() for n, p in self.segs[k].named_parameters()}
                    rng = rng_of(self.device)
                    out, graph = kept_forward(self.segs[k], weights, (x_BT if k == 0 else h_in,))
                else:
                    out = self.segs[k](x_BT if k == 0 else h_in)
            if k == self.seam_out and not self.last:
                self.wire.send(out, self.rank + 1, "activation", boundary=k)
                self.wire.commit(self.plan.queue)
            with self.compute, torch.set_grad_enabled(not late or w > 0):
                with autocast(self.device, self.cfg.train.dtype):
                    loss = (lm_loss(out, y_BT) if k == last else
                            lm_loss(self.heads[k](out.to(self.dtype)), self.classes[y_BT]) if k in self.heads
                            else None)
                if loss is not None:
                    losses[k] = loss.detach()
                if late:
                    if loss is not None and kept:  # the aux gradient of batch t, now, into the live weights
                        heads = list(self.heads[k].parameters())
                        grads = torch.autograd.grad(w * loss, list(weights.values()) + heads, retain_graph=True)
                        for p, g in zip(list(self.segs[k].parameters()) + heads, grads):
                            p.grad = g if p.grad is None else p.grad + g
                    elif loss is not None:  # the aux gradient of batch t, now; it stays in the segment
                        (w * loss).backward()
                    entry = {"batch": t, "input": x_BT if k == 0 else h_in, "weights": None}
                    self.stash[k].append(entry | ({"weights": weights, "rng": rng, "out": out, "graph": graph}
                                                  if kept else {}))
                else:
                    now[k] = (h_in, out, loss)
            inp = out
        self._peak()

        for k in reversed(self.mine):
            if k == last:
                h_in, _, loss = now[k]
                with self.compute:
                    loss.backward()
                batch, g_in = t, (h_in.grad if h_in is not None else None)
            else:
                if k == self.seam_out:  # from the next rank, sent d steps ago (at once when d = 0)
                    batch = t - self.delay_of(k)
                    if batch < 0:
                        continue  # the pipeline has not filled up to this segment yet
                    g_out = self.gwire.recv(self.h_shape, self.rank + 1, "gradient", boundary=k)
                    self.grads_received += 1
                else:
                    inbox = self.inbox[k]
                    if not inbox or inbox[0]["due"] != t:
                        continue
                    msg = inbox.popleft()
                    batch, g_out = msg["batch"], msg["grad"]
                with self.compute:
                    if k in now:  # delay 0: the graph of this step's forward
                        h_in, out, aux = now[k]
                        if aux is not None:  # into the segment's own parameters and head only
                            own = list(self.segs[k].parameters()) + list(self.heads[k].parameters())
                            torch.autograd.backward(w * aux, retain_graph=True, inputs=own)
                        out.backward(g_out)
                        g_in = h_in.grad if h_in is not None else None
                    else:
                        entry = self.stash[k].popleft()
                        assert entry["batch"] == batch, (k, entry["batch"], batch)  # the arm's own bookkeeping
                        g_in = self._late_backward(k, entry, g_out)
            if k > 0:
                if k == self.mine[0]:
                    self.gwire.send(g_in, self.rank - 1, "gradient", boundary=k - 1)
                else:
                    self.inbox[k - 1].append({"due": t + self.d, "batch": batch, "grad": g_in})
                self._peak()
        return self._finish_step(losses)

    def _finish_step(self, losses: dict) -> list[float] | None:
        """The step's all_reduce (module docstring), then the global clip and one update."""
        N, n, P = self.N, self.n_tensors, self.n_tensors + self.n_head_tensors
        with self.compute:
            # gradient norms | has a gradient | training losses by segment | non-finite output by segment
            vec = torch.zeros(2 * P + 2 * N, device=self.device, dtype=self.dtype)
            groups = [(self.offsets[v], list(s.parameters())) for v, s in self.segs.items()]
            groups += [(n + self.head_offsets[v], list(h.parameters())) for v, h in self.heads.items()]
            for at, params in groups:
                got = [i for i, p in enumerate(params) if p.grad is not None]
                if got:
                    norms = torch._foreach_norm([params[i].grad for i in got], 2.0)
                    for i, g in zip(got, norms):
                        vec[at + i], vec[P + at + i] = g, 1.0
            for k, loss in losses.items():
                vec[2 * P + k] = loss
            for v, s in self.segs.items():
                vec[2 * P + N + v] = s.bad
                s.bad.zero_()
        self.wire.all_reduce(vec)  # one writer per slot, zeros elsewhere: exact
        opts = self.opts()
        slots = vec[2 * P:2 * P + N].tolist()
        values = (slots[:-1] if self.n_head_tensors else []) + slots[-1:]
        bad = [k for k, b in enumerate(vec[2 * P + N:].tolist()) if b > 0]
        if bad or not all(math.isfinite(v) for v in values):
            at = bad[0] if bad else next(k for k, v in enumerate(slots) if not math.isfinite(v))
            self.extra["failed_here"] = self.owner[at] == self.rank
            for o in opts:
                o.zero_grad(set_to_none=True)
            return None
        with self.compute:
            if self.cfg.train.grad_clip > 0:  # clip_grad_norm_'s total over the gradients there are, in order
                total = torch.linalg.vector_norm(vec[:P][vec[P:2 * P] > 0], 2.0)
                params = [p for o in opts for g in o.param_groups for p in g["params"]]
                torch.nn.utils.clip_grads_with_norm_(params, self.cfg.train.grad_clip, total)
            self.update(*opts)
        self.gwire.commit(self.d)  # the sends the previous rank has taken by now
        self._peak()
        return values

    def result(self, run: dict) -> dict:
        return super().result(run) | {"delayed": {
            "delay": self.d, "weight_stashing": self.stashing, "local_weight": self.w,
            "peak_kept_bytes": self.peak_kept_bytes, "gradients_received": self.grads_received,
            "gradients_drained": self.grads_drained}}

    # -- the state in flight, for a checkpoint

    def more_state(self) -> dict:
        """What is in flight at this step boundary: the stash (a kept graph rides as its input,
        weights and RNG state), the inboxes, and the gradients sent to the previous rank that it
        has not taken yet (the last d steps' sends: the previous rank takes each d steps after it
        was sent, so on resume they are sent again)."""
        return {"stash": {v: [entry_to_cpu(e) for e in q] for v, q in self.stash.items()},
                "inbox": {v: [entry_to_cpu(e) for e in q] for v, q in self.inbox.items()},
                "untaken": [t.cpu() for group in [*self.gwire.inflight, self.gwire.group] for _, t in group],
                "counts": {"grads_received": self.grads_received, "grads_drained": self.grads_drained,
                           "peak_kept_bytes": self.peak_kept_bytes}}

    def restore_more(self, state: dict) -> None:
        """`more_state` back: a kept graph is the entry's forward run again over its input and
        stashed weights (bit for bit the one it replaces); its input is the rebuilt output of the
        segment before on this rank where that is kept for the same batch, sharing its bytes as in
        an arm never stopped. The untaken gradients go out again, counted once (when first sent)."""
        dev = self.device
        before = {}
        for v in self.mine:
            q = deque()
            for e in state["stash"][v]:
                e = entry_to(e, dev)
                if e["weights"] is not None:
                    inp = e["input"]
                    if v > 0:
                        prev = before.get(e["batch"])
                        inp = prev.detach() if prev is not None and torch.equal(prev, inp) else inp
                        inp.requires_grad_()
                    weights = {n: t.requires_grad_() for n, t in e["weights"].items()}
                    with under_rng(e["rng"], dev):  # the masks its forward drew (dropout)
                        out, graph = kept_forward(self.segs[v], weights, (inp,))
                    e |= {"input": inp, "weights": weights, "out": out, "graph": graph}
                q.append(e)
            self.stash[v] = q
            before = {e["batch"]: e["out"] for e in q if "out" in e}
            self.inbox[v] = deque(entry_to(e, dev) for e in state["inbox"][v])
        counts = state["counts"]
        self.grads_received, self.grads_drained, self.peak_kept_bytes = (
            counts["grads_received"], counts["grads_drained"], counts["peak_kept_bytes"])
        self.gwire.resend([t.to(dev) for t in state["untaken"]], self.rank - 1, "gradient")
