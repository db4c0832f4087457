"""The segment chain: one training step for every point of the seam policy (`seams.policy`), in
one process and on every rank of a `stages` placement.

A chain is an arm's segments (`segs`: the blocks of each) and the share of them this process
holds (`mine`: all of them in one process, a contiguous run on a rank). All ranks build the same
GPT from `train.seed`, so the weights are those of one process, and keep only their share.

Step t (`Chain.step`) on batch t:
- forward: each held segment runs from its input detached at the seam (the previous segment's
  output, or the previous rank's, received) and hands its output on (to the next rank, sent, at
  the last held segment). A segment whose gradient comes late keeps its input, and with weight
  stashing its forward's graph over a copy of the weights it used (`inflight`), or over its
  weights predicted ahead to where its gradient will land (`corrections`);
- its loss: the LM loss on the last segment; a non-final one's local objective where the policy
  has one (`objectives.local_loss`);
- what comes back across a seam (the policy): for local, nothing, and each segment
  backpropagates its own loss at once, which frees its activations (local's memory saving; with
  `seams.local_backward=once`, one backward over every segment's loss after all forwards); for
  e2e and delayed the last segment backpropagates the LM loss and each seam passes the
  input-gradient back `delay` steps later (through the segment's inbox in this process, or sent
  to the previous rank, taken there `delay` steps on), each segment backpropagating its local loss
  (times `local_weight`) at once into its own parameters and head;
- update: where a gradient crosses, one global-norm clip over every gradient of the step (one
  process's `clip_grad_norm_` order: the GPT's, then the heads'), computed on ranks from one small
  all_reduce of the per-tensor norms, the losses and non-finite flags (`update.end_of_step`);
  where none crosses, each segment clips what it owns (its blocks and its head). A non-finite
  loss or output makes no update, decided on the device; the step returns its losses and flags
  as a device `readout.Report` and reads nothing back itself.

With delay 0 this is e2e bit for bit; with no seams, local is e2e bit for bit; the stages of a
placement train what one process trains bit for bit (tests/seams/test_chain.py).
"""

from __future__ import annotations

import contextlib
from collections import deque

import torch
import torch.nn as nn
from torch.func import functional_call

from seamkit.accel import compile_model, compiles
from seamkit.config import RunConfig
from seamkit.model import GPT, autocast, param_dtype
from seamkit.optim import make_optimizer
from seamkit.seams import inflight as F
from seamkit.seams import update as U
from seamkit.seams.corrections import Feedback, Prediction
from seamkit.seams.cuts import keep_held, owned_names
from seamkit.readout import Report
from seamkit.seams.objectives import local_loss, private_modules
from seamkit.seams.policy import policy


class Alone:
    """The links of a chain held whole in one process: no neighbours, nothing to sum."""
    first = last = True

    def all_reduce(self, vec: torch.Tensor) -> torch.Tensor:
        return vec

    def inflight(self) -> list:
        return []

    def commit_gradients(self, keep: int) -> None:
        pass


class _Segment(nn.Module):
    """Segment k of `chain` as a module, so `functional_call` can run it under stashed weights."""

    def __init__(self, chain: "Chain", k: int):
        super().__init__()
        self.model, self.chain, self.k = chain.model, [chain], k

    def forward(self, x_BT, h_BTC):
        return self.chain[0].run(self.k, x_BT, h_BTC)


class Chain:
    """One arm's held segments, their private modules and optimizers, and what is in flight."""

    def __init__(self, cfg: RunConfig, arm: str, segs: list[list[int]], mine: list[int], device: torch.device,
                 corpus=None, link=None):
        self.policy, self.segs, self.mine = policy(arm, cfg.seams), segs, list(mine)
        self.device, self.dtype_name, self.clip = device, cfg.train.dtype, cfg.train.grad_clip
        self.dtype = param_dtype(cfg.train.dtype)
        self.link = link or Alone()
        self.S, self.last = len(segs), len(segs) - 1
        torch.manual_seed(cfg.train.seed)  # every arm, every rank: the same GPT
        model = GPT(cfg.model).to(device=device, dtype=self.dtype)
        names = owned_names(model, segs)
        order = [n for n, _ in model.named_parameters()]  # the arm's order: the clip's norm vector
        heads, classes = private_modules(self.policy.objective, cfg, model, corpus, self.S - 1)
        self.classes = classes.to(device) if classes is not None else None
        self.heads = nn.ModuleDict({str(k): h.to(device=device, dtype=self.dtype) for k, h in heads.items()
                                    if k in self.mine})
        head_at, at = {}, len(order)
        for k in sorted(heads):  # the heads' tensors after the GPT's, segment by segment
            head_at[k], at = at, at + len(list(heads[k].parameters()))
        self.n_slots = at
        self.model = keep_held(model, [n for k in self.mine for n in names[k]], [i for k in self.mine for i in segs[k]])
        self.compiled = compiles(cfg.train.compile, device)  # compiled by `accel.warm_up`, before the clock starts
        if self.compiled:
            compile_model(self.model)
        self.shape = (cfg.data.batch, cfg.model.seq, cfg.model.dim)
        params = dict(self.model.named_parameters())
        self.owned = {k: [(n, params[n]) for n in names[k]] for k in self.mine}
        head_slots = {k: list(range(at, at + len(list(heads[k].parameters())))) for k, at in head_at.items()}
        held = [(k, False, order.index(n), p) for k in self.mine for n, p in self.owned[k]] + \
            [(k, True, s, p) for k in self.mine if k in head_at for s, p in zip(head_slots[k], self._head_params(k))]
        self.norm_slots = U.Slots(self.n_slots, {k: [order.index(n) for n in names[k]] for k in range(self.S)}, head_slots,
                                  sorted(held, key=lambda e: e[2]), device)
        # the held segments' delays: what both corrections of the delayed arm scale by (0 for the other arms)
        self.taus = [self.delay_of(k) if self.policy.arm == "delayed" else 0 for k in self.mine]
        # per-tensor updates (AdamW elementwise, Muon a matrix at a time): a share updates as the whole does.
        # PipeMare's rescheduling gives each held segment its own groups, at an LR of its own (`corrections`)
        self.lr_delay_steps = cfg.seams.lr_delay_steps if self.policy.arm == "delayed" and self.policy.delay else 0
        parts = [[p for _, p in self.owned[k]] for k in self.mine] if self.lr_delay_steps else None
        nesterov = cfg.seams.nesterov_momentum if self.policy.arm == "delayed" else 0.0  # NAdamW (`corrections`)
        self.opt = make_optimizer(self.model, cfg.train, parts, nesterov)
        self.head_opt = make_optimizer(self.heads, cfg.train, nesterov=nesterov) if len(self.heads) else None
        self.groups = [[p for _, p in self.owned[k]] + self._head_params(k) for k in self.mine]
        delays = dict(zip(self.mine, self.taus))
        self.predict = Prediction(cfg.seams.weight_prediction, cfg.seams.prediction_decay, self.owned, delays)
        self.feedback = Feedback(cfg.seams.error_feedback, self.owned, delays)
        # after an update: error feedback moves the weights first, so prediction averages the moves made
        self.corrections = [c for c in (self.feedback, self.predict) if c]
        self.ctx = self.model.context(cfg.model.seq, device, self.dtype)  # RoPE tables; rows are plain causal
        self.wrappers = {k: _Segment(self, k) for k in self.mine}
        self.t, self.peak_kept_bytes, self.log = 0, 0, None  # a test sets log = []: every backward taken
        self.stash = {k: deque() for k in self.mine}  # {"batch", "input", "weights"[, "rng", "out", "graph"]}
        self.inbox = {k: deque() for k in self.mine}  # {"due", "batch", "grad"}: output-gradients on their way
        self.bad = torch.zeros(self.S, device=device)  # outputs with a non-finite value, counted without a sync
        self.sticky = torch.zeros((), device=device)  # a non-finite step seen, kept until the host reads it (`readout`)
        # local: one backward over every segment's loss after all forwards (one autocast region,
        # activations held to the end) instead of one per segment as soon as its loss is known
        self.backward_once = not self.policy.crosses and cfg.seams.local_backward == "once"
        self.poison: set[int] = set()  # fault hook: these segments' next output is NaN

    # -- what the chain is

    def _head_params(self, k: int) -> list:
        return list(self.heads[str(k)].parameters()) if str(k) in self.heads else []

    @property
    def opts(self) -> list:
        return [o for o in (self.opt, self.head_opt) if o is not None]

    def autocast(self):
        return autocast(self.device, self.dtype_name)

    def delay_of(self, k: int) -> int:
        """Steps between segment k's forward of a batch and its backward of it: d*(S-1-k)."""
        return self.policy.delay * (self.S - 1 - k)

    def run(self, k: int, x_BT, h_BTC):
        """Segment k's output: its blocks over h_BTC, or over the embedding of x_BT for the first one."""
        if h_BTC is None:
            h_BTC = self.model.embed(x_BT)
        for i in self.segs[k]:
            h_BTC = self.model.blocks[i](h_BTC, self.ctx)
        return h_BTC

    def loss(self, k: int, h_BTC, y_BT, c_BT=None):
        """Segment k's loss: the LM loss on the last one, else its local objective's (or None).
        c_BT: the targets' classes where the objective reads them (`classes_of`), taken once a step."""
        if k == self.last:
            return self.model.loss(h_BTC, y_BT)
        if self.policy.objective is None:
            return None
        if c_BT is None:
            c_BT = self.classes_of(y_BT)
        return local_loss(self.policy.objective, h_BTC, y_BT, c_BT, self.heads[str(k)] if str(k) in self.heads else None,
                          self.ctx, self.model)

    def classes_of(self, y_BT):
        """The aux objectives' class of every target (None where the objective reads no classes)."""
        return None if self.classes is None else self.classes[y_BT]

    # -- one step

    def step(self, x_BT: torch.Tensor | None, y_BT: torch.Tensor, lr: float) -> Report:
        """Step `self.t` on batch (x_BT, y_BT) (x_BT: None off the first rank, whose input is
        received). Returns its `Report`, on the device: the training losses of the segments that
        have one (last the LM loss) and a non-finite flag per segment; where a flag is up the step
        made no update. Nothing here reads a device value on the host."""
        t, pol = self.t, self.policy
        now, losses = {}, {}  # now: segments whose gradient comes this step: (input, output, local loss)
        c_BT = self.classes_of(y_BT)  # once a step, for every segment's objective
        inp = x_BT if self.link.first else self.link.recv_activation()
        with self.autocast() if self.backward_once else contextlib.nullcontext():
            for k in self.mine:
                inp = self._segment(k, t, x_BT, inp, y_BT, c_BT, now, losses)
        if self.backward_once:
            torch.autograd.backward([self.policy.local_weight * losses[k] for k in self.mine])
        self.note_peak()
        if pol.crosses:
            self._backward(now, t)
        self.t += 1
        return U.end_of_step(self, {k: v.detach() for k, v in losses.items()}, lr)

    def _segment(self, k: int, t: int, x_BT, inp, y_BT, c_BT, now: dict, losses: dict):
        """Segment k's forward of step t and its loss; a local segment's backward at once (unless
        the chain takes one backward), a late one's local loss and stash entry. Returns its output."""
        pol = self.policy
        late = pol.crosses and self.delay_of(k) > 0
        kept = late and pol.stashing
        h_in = None if k == 0 else inp.detach()
        if h_in is not None and (kept or (pol.crosses and not late)):
            h_in.requires_grad_()
        region = contextlib.nullcontext() if self.backward_once else self.autocast()
        with torch.set_grad_enabled(not late or pol.objective is not None), region:
            entry = None
            if kept:
                weights = self.predict.weights(k, ahead=True) or {
                    n: p.detach().clone().requires_grad_() for n, p in self.owned[k]}
                entry, out = self._stash_entry(k, t, x_BT if k == 0 else h_in, weights)
            else:
                out = self.run(k, x_BT if k == 0 else None, h_in)
            if k in self.poison:
                self.poison.discard(k)
                out = out * float("nan")
            self.bad[k] += (~torch.isfinite(out.detach())).any()
            if k == self.mine[-1] and k != self.last:
                self.link.send_activation(out)
            loss = self.loss(k, out, y_BT, c_BT)
        if loss is not None:
            losses[k] = loss
        if not pol.crosses and not self.backward_once:  # local: before the next segment runs, which frees its activations
            (pol.local_weight * loss).backward()  # weight 1: exact, and the loss stays a module's output, not the root
        elif late:
            if loss is not None:
                self._local_now(k, loss, entry)
            self.stash[k].append(entry or {"batch": t, "input": x_BT if k == 0 else h_in, "weights": None})
        elif pol.crosses:
            now[k] = (h_in, out, loss)
        return out

    def _local_now(self, k: int, loss, entry: dict | None) -> None:
        """A late segment's local loss of this batch, backpropagated now into its live weights and head."""
        w, heads = self.policy.local_weight, self._head_params(k)
        if entry is None:
            (w * loss).backward()
            return
        grads = torch.autograd.grad(w * loss, list(entry["weights"].values()) + heads, retain_graph=True)
        for p, g in zip([p for _, p in self.owned[k]] + heads, grads):
            _accumulate(p, g)

    def _backward(self, now: dict, t: int) -> None:
        """The gradients of this step, last held segment first: the LM loss's, then each output-gradient due now."""
        w = self.policy.local_weight
        for k in reversed(self.mine):
            if k == self.last:
                h_in, _, loss = now[k]
                loss.backward()
                batch, g_in = t, (h_in.grad if h_in is not None else None)
                self._record(k, batch)
            else:
                if k == self.mine[-1]:  # from the next rank, sent delay steps ago (at once when delay is 0)
                    batch = t - self.delay_of(k)
                    if batch < 0:
                        continue  # the pipeline has not filled up to this segment yet
                    g_out = self.link.recv_gradient()
                else:
                    box = self.inbox[k]
                    if not box or box[0]["due"] != t:
                        continue
                    msg = box.popleft()
                    batch, g_out = msg["batch"], msg["grad"]
                if k in now:  # delay 0: the graph of this step's forward
                    h_in, out, aux = now[k]
                    if aux is not None:  # into the segment's own parameters and head only
                        own = [p for _, p in self.owned[k]] + self._head_params(k)
                        torch.autograd.backward(w * aux, retain_graph=True, inputs=own)
                    out.backward(g_out)
                    g_in = h_in.grad if h_in is not None else None
                    self._record(k, batch)
                else:
                    entry = self.stash[k].popleft()
                    assert entry["batch"] == batch, (k, entry["batch"], batch)  # the chain's own bookkeeping
                    g_in = self._late_backward(k, entry, g_out)
            if k > 0:
                if k == self.mine[0]:
                    self.link.send_gradient(g_in)
                else:
                    self.inbox[k - 1].append({"due": t + self.policy.delay, "batch": batch, "grad": g_in})
                self.note_peak()

    def _late_backward(self, k: int, entry: dict, g_BTC: torch.Tensor) -> torch.Tensor | None:
        """Segment k's backward of a kept batch: through its kept graph (stashed weights), or through
        its forward run again on the kept input under the current weights (which batch t's forward
        did not use) or under those predicted back to it (`corrections`); the weight gradients go into
        the live parameters. Returns the input-gradient."""
        first, names = k == 0, [n for n, _ in self.owned[k]]
        if entry["weights"] is not None:
            out, h_BTC = entry["out"], entry["input"]
            leaves = [entry["weights"][n] for n in names]
        else:
            x_BT, h_BTC = (entry["input"], None) if first else (None, entry["input"].requires_grad_())
            back = self.predict.weights(k, ahead=False)
            with self.autocast():
                if back is None:
                    leaves, out = [p for _, p in self.owned[k]], self.run(k, x_BT, h_BTC)
                else:
                    leaves = list(back.values())
                    out = functional_call(self.wrappers[k], {f"model.{n}": w for n, w in back.items()},
                                          (x_BT, h_BTC))
        grads = torch.autograd.grad(out, leaves + ([] if first else [h_BTC]), g_BTC)
        for (_, p), g in zip(self.owned[k], grads):
            _accumulate(p, g)
        self._record(k, entry["batch"], grads=dict(zip(names, grads)), input=entry["input"].detach(),
                     output_grad=g_BTC)
        return None if first else grads[-1]

    def has_grad(self, t: int):
        """Whether segment k's tensors (its GPT tensors, or its private module's) have a gradient at
        step t, from the policy alone (`update.Slots`): the last segment and every segment with a
        local loss always; a segment whose gradient comes late once its first one has arrived."""
        objective = self.policy.objective is not None
        return lambda k, head: objective if head else k == self.last or objective or t >= self.delay_of(k)

    # -- what is in flight

    def _stash_entry(self, k: int, batch: int, inp: torch.Tensor, weights: dict,
                     rng: dict | None = None) -> tuple[dict, torch.Tensor]:
        """Segment k's forward of `batch` over `weights` (leaves requiring grad), its graph kept: the
        stash entry and its output. `rng`: rebuild it under the RNG state its forward first ran with."""
        drawn = F.rng_of(self.device) if rng is None else rng
        with self.autocast(), (F.under_rng(rng, self.device) if rng is not None else contextlib.nullcontext()):
            out, graph = F.kept_forward(self.wrappers[k], {f"model.{n}": t for n, t in weights.items()},
                                        (inp, None) if k == 0 else (None, inp))
        return {"batch": batch, "input": inp, "weights": weights, "rng": drawn, "out": out, "graph": graph}, out

    def note_peak(self) -> None:
        if self.policy.crosses and self.policy.delay > 0:
            self.peak_kept_bytes = max(self.peak_kept_bytes, sum(c.nbytes() for c in self.corrections) + F.kept_bytes(
                self.stash.values(), self.inbox.values(), self.link.inflight()))

    def _record(self, k: int, batch: int, **kw) -> None:
        """One backward of segment k at step t for `batch`; a late backward's gradients, input and
        output-gradient too, copied (the clip scales the gradients in place)."""
        if self.log is not None:
            copy = {n: ({m: g.clone() for m, g in v.items()} if isinstance(v, dict) else v.clone()) for n, v in kw.items()}
            self.log.append({"segment": k, "step": self.t, "batch": batch, **copy})

    def inflight_state(self) -> dict:
        """What is in flight at this step boundary, as plain data for a checkpoint (a kept graph
        rides as its input, stashed weights and RNG state)."""
        return {"t": self.t, "peak_kept_bytes": self.peak_kept_bytes, "prediction": self.predict.state(),
                "feedback": self.feedback.state(),
                "stash": {k: [F.entry_to_cpu(e) for e in q] for k, q in self.stash.items()},
                "inbox": {k: [F.entry_to_cpu(e) for e in q] for k, q in self.inbox.items()}}

    def load_inflight(self, state: dict) -> None:
        """`inflight_state` back: a kept graph is its forward run again over its input and stashed
        weights, bit for bit the one it replaces; its input is the rebuilt output of the segment
        before where that is kept for the same batch, sharing its bytes as in a chain never stopped."""
        self.t, self.peak_kept_bytes = state["t"], state["peak_kept_bytes"]
        self.predict.load(state.get("prediction"))
        self.feedback.load(state.get("feedback"))
        before = {}
        for k in self.mine:
            q = deque()
            for e in state["stash"][k]:
                e = F.entry_to(e, self.device)
                if e["weights"] is not None:
                    inp = e["input"]
                    if k > 0:
                        prev = before.get(e["batch"])
                        inp = prev.detach() if prev is not None and torch.equal(prev, inp) else inp
                        inp.requires_grad_()
                    e = self._stash_entry(k, e["batch"], inp, {n: t.requires_grad_() for n, t in e["weights"].items()},
                                          e["rng"])[0]
                q.append(e)
            self.stash[k] = q
            before = {e["batch"]: e["out"] for e in q if "out" in e}
            self.inbox[k] = deque(F.entry_to(e, self.device) for e in state["inbox"][k])

    # -- held-out loss

    @torch.no_grad()
    def evaluate(self, batches) -> list[torch.Tensor]:
        """The whole chain's LM loss on each held-out batch, on the rank holding the last segment
        ([] elsewhere): every rank runs its segments in order, so the data flows one way only."""
        self.model.eval()
        losses = []
        try:
            for batch in batches:
                h = None if self.link.first else self.link.recv_eval()
                with self.autocast():
                    for k in self.mine:
                        h = self.run(k, batch[0] if k == 0 else None, h)
                    if self.last in self.mine:
                        losses.append(self.model.loss(h, batch[1]))
                if self.last not in self.mine:
                    self.link.send_eval(h)
        finally:
            self.model.train()
        return losses


def _accumulate(p: nn.Parameter, g: torch.Tensor) -> None:
    p.grad = g if p.grad is None else p.grad + g
